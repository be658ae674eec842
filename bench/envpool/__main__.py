"""``python -m bench.envpool``: runs ``bench/envpool/benchmark.py``, its evidence kept where ``--save DIR`` says."""

import sys

from bench.common.evidence import saving
from bench.envpool.benchmark import main

with saving(sys.argv[1:], "bench.envpool"):
    sys.exit(main())
