"""Launching a program: the launcher and its live terminal mode, the supervisor of its
nodes, and the one fork helper every process start goes through. What a node sees of
the program it runs in (its context, stopping) is ``shmpad.context``, below this.

The public names are exported by ``shmpad`` itself (``import shmpad as lp``).
"""
