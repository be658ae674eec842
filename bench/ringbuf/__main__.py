"""``python -m bench.ringbuf``: runs ``bench/ringbuf/benchmark.py``."""

from bench.common.harness import run_main
from bench.ringbuf.benchmark import main

run_main(main, "bench.ringbuf")
