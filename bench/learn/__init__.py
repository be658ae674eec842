"""``python -m bench.learn``: frames and wall-clock to a target score over several seeds (see ``__main__``)."""
