"""``python -m bench.learn``: frames and wall-clock to a target score over several seeds (see ``__main__``);
``python -m bench.learn.games``: that for several games, in one table (``table``) beside published
references (``targets``); ``overlay`` and ``reference``: runs' and published curves against frames."""
