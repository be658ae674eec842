"""``python -m bench.rpc``: runs ``bench/rpc/benchmark.py``."""

from bench.common.harness import run_main
from bench.rpc.benchmark import main

run_main(main, "bench.rpc")
