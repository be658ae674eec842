"""Training under repeated faults: ``python -m bench.elastic`` (see ``__main__``)."""
