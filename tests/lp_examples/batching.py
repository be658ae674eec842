"""Launchpad's batching example: clients call a server method that ``lp.batched_handler``
batches, as a centralised inference server would be.

The server keeps a running sum of every value it was sent and answers each caller with it;
the client that finishes last stops the program (instead of sleeping and hoping the
others are done)."""

import threading

import numpy as np
from absl import app, flags

import shmpad as lp

_NUM_CLIENTS = flags.DEFINE_integer("num_clients", 2, "The number of clients.")
_CALLS = flags.DEFINE_integer("calls", 10, "How many calls each client makes.")


class Client:
    def __init__(self, client_id: int, server, calls: int) -> None:
        self._client_id = client_id
        self._server = server
        self._calls = calls

    def run(self) -> None:
        for x in range(self._client_id, self._client_id + self._calls):
            result = self._server.compute([x, x + 1])
        # one write with its newline: clients on threads of one process would otherwise interleave lines
        print(f"client {self._client_id} last result {result.tolist()}\n", end="", flush=True)
        if self._server.done():
            lp.stop()


class Server:
    def __init__(self, batch_size: int, clients: int) -> None:
        self._sum = None
        self._clients = clients
        self._done = 0
        self._done_lock = threading.Lock()  # calls of done() may run on several server threads
        self.compute = lp.batched_handler(batch_size=batch_size)(self.compute)

    def compute(self, values):
        # values: the B callers' [x, x + 1] lists, as a list of B lists
        result = np.sum(values, axis=0)
        self._sum = result if self._sum is None else self._sum + result
        return np.tile(self._sum, (len(values), 1))

    def done(self) -> bool:
        """Count a client as done; True for the last one."""
        with self._done_lock:
            self._done += 1
            return self._done == self._clients


def make_program(num_clients: int, calls: int) -> lp.Program:
    program = lp.Program("batching")
    server = program.add_node(
        lp.CourierNode(Server, num_clients, num_clients, courier_kwargs={"thread_pool_size": num_clients}),
        label="server",
    )
    with program.group("clients"):
        for client_id in range(num_clients):
            program.add_node(lp.CourierNode(Client, client_id, server, calls))
    return program


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError("Too many command-line arguments.")
    controller = lp.launch(make_program(_NUM_CLIENTS.value, _CALLS.value))
    controller.wait()
    print("program finished", flush=True)


if __name__ == "__main__":
    app.run(main)
