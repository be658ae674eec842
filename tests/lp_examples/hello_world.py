"""The smallest program, as a Launchpad user writes it: one node that greets and ends."""

from absl import app

import shmpad as lp


class Greeter:
    def run(self) -> None:
        print("Hello from a node", flush=True)


def make_program() -> lp.Program:
    program = lp.Program("hello_world")
    program.add_node(lp.PyClassNode(Greeter), label="greeter")
    return program


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError("Too many command-line arguments.")
    lp.launch(make_program())


if __name__ == "__main__":
    app.run(main)
