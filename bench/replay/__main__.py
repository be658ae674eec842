"""``python -m bench.replay``: runs ``bench/replay/benchmark.py``."""

import sys

from bench.common.harness import run_main
from bench.replay.benchmark import main

run_main(lambda: main(sys.argv[1:]), "bench.replay")
