"""What a first user meets: a launch raises no DeprecationWarning on Python 3.12+ (whose
``os.fork`` warns in a multi-threaded process), and does not depend on multiprocessing's
default start method (forkserver from Python 3.14): shmpad forks, always."""

from __future__ import annotations

import os
import sys

from helpers import run_command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PROGRAM = """
import multiprocessing, threading
import numpy as np
import shmpad as lp

multiprocessing.set_start_method({method!r}, force=True)  # what Python 3.14 makes the default
busy = threading.Event()
threading.Thread(target=busy.wait, daemon=True).start()  # the launcher is multi-threaded anyway
program = lp.Program("first-contact")
ring = program.add_node(lp.RingNode(4, spec={{"x": (np.int64, ())}}), "ring")
produce = lambda r: [r.put({{"x": i}}, timeout=30) for i in range(3)]  # a lambda: spawn could not pickle it


def consume(r):
    total = 0
    for _ in range(3):
        total += int(r.get(timeout=30)["x"])
        r.release()
    print("sum", total)


program.add_node(lp.PyNode(produce, ring), "producer")
program.add_node(lp.PyNode(consume, ring), "consumer")
lp.launch(program).wait()
busy.set()
print("done")
"""


def test_a_launch_raises_no_deprecation_warning_whatever_the_start_method():
    # "always", not "error": os.fork clears the warning it raised when a filter turns it
    # into an error (Python 3.12.1), so only a printed warning shows that it was raised
    for method in ("forkserver", "spawn"):
        code = _PROGRAM.format(method=method)
        status, out, _ = run_command(
            [sys.executable, "-W", "always::DeprecationWarning", "-c", code], 120, "a launch", ROOT
        )
        assert status == 0, out
        assert "DeprecationWarning" not in out, out
        assert "[consumer/0] sum 3" in out and out.rstrip().endswith("done"), out
