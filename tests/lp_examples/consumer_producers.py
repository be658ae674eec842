"""Producers serve work over courier; a consumer calls them all at once, a few rounds,
then stops the program."""

from absl import app, flags

import shmpad as lp

_PRODUCERS = flags.DEFINE_integer("producers", 3, "How many producer nodes.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "How many rounds the consumer runs.")


class Producer:
    def square(self, x: int) -> int:
        return x * x


class Consumer:
    def __init__(self, producers: list, rounds: int) -> None:
        self._producers = producers
        self._rounds = rounds

    def step(self, round_: int) -> list[int]:
        futures = [p.futures.square(round_ + i) for i, p in enumerate(self._producers)]
        return [f.result() for f in futures]

    def run(self) -> None:
        total = sum(sum(self.step(r)) for r in range(self._rounds))
        print(f"consumer total {total}", flush=True)
        lp.stop()


def make_program(producers: int, rounds: int) -> lp.Program:
    program = lp.Program("consumer_producers")
    with program.group("producer"):
        handles = [program.add_node(lp.CourierNode(Producer)) for _ in range(producers)]
    program.add_node(lp.CourierNode(Consumer, producers=handles, rounds=rounds), label="consumer")
    return program


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError("Too many command-line arguments.")
    controller = lp.launch(make_program(_PRODUCERS.value, _ROUNDS.value))
    controller.wait()
    print("program finished", flush=True)


if __name__ == "__main__":
    app.run(main)
