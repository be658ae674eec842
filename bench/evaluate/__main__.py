"""``python -m bench.evaluate``: runs ``bench/evaluate/play.py``."""

import sys

from bench.evaluate.play import main

sys.exit(main())
