"""``python -m bench.envpool``: runs ``bench/envpool/benchmark.py``."""

import sys

from bench.envpool.benchmark import main

sys.exit(main())
