"""``python -m bench.allreduce``: runs ``bench/allreduce/benchmark.py``."""

from bench.allreduce.benchmark import main
from bench.common.harness import run_main

run_main(main, "bench.allreduce")
