"""Hours of the default job with its process tree sampled: ``python -m bench.soak`` (see ``__main__``)."""
