"""Every way a node can learn that the program stops, and a node that stops it."""

import threading

from absl import app

import shmpad as lp


def poll_for_stop() -> None:
    while not lp.wait_for_stop(0.05):
        pass
    print("clean end: poll_for_stop", flush=True)


def block_for_stop() -> None:
    lp.wait_for_stop()
    print("clean end: block_for_stop", flush=True)


def stop_event() -> None:
    lp.stop_event().wait()
    print("clean end: stop_event", flush=True)


def stop_handler() -> None:
    stopping = threading.Event()
    lp.register_stop_handler(stopping.set)
    stopping.wait()
    print("clean end: stop_handler", flush=True)


def stopper() -> None:
    lp.stop()


def make_program() -> lp.Program:
    program = lp.Program("program_wait")
    for fn in (poll_for_stop, block_for_stop, stop_event, stop_handler, stopper):
        program.add_node(lp.CourierNode(fn), label=fn.__name__)
    return program


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError("Too many command-line arguments.")
    controller = lp.launch(make_program())
    controller.wait()
    print("program finished", flush=True)


if __name__ == "__main__":
    app.run(main)
