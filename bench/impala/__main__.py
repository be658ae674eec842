"""``python -m bench.impala``: runs ``bench/impala/train.py``."""

import sys

from bench.impala.train import main

sys.exit(main())
