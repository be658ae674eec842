"""``python -m bench.dqn``: runs ``bench/dqn/train.py``."""

import sys

from bench.dqn.train import main

sys.exit(main())
