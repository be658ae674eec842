"""Which helpers of a node outlive a SIGKILLed launcher, one kind of helper at a time.

Run from the root of the checkout to measure (the launchers, ``python -c``, import shmpad
from the working directory), with this file's checkout providing the tests:
    cd CHECKOUT && PYTHONPATH=$PWD python /path/to/docs/results/process-tree/measure.py [TRIALS]
Each trial launches a program whose node starts one helper of the kind (see
tests/test_launch_orphans.py: all ignore SIGTERM but the polite one), SIGKILLs the launcher and
counts the helpers still running 15 s later (the test's deadline).
"""

import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests"))

from test_launch_orphans import HELPER_KINDS, helpers_survive_a_killed_launcher  # noqa: E402

import shmpad  # noqa: E402

trials = int(sys.argv[1]) if len(sys.argv) > 1 else 3
print(f"shmpad from {os.path.dirname(shmpad.__file__)}; {trials} trials per kind")
for kind in HELPER_KINDS:
    survived = 0
    for _ in range(trials):
        with tempfile.TemporaryDirectory() as directory:
            survived += len(helpers_survive_a_killed_launcher(directory, (kind,)))
    print(f"{kind:8s} survived {survived} of {trials}", flush=True)
