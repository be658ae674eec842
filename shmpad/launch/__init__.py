"""Launching a program and living in one: the launcher, the supervisor of its nodes,
the one fork helper every process start goes through, and stopping.

The public names are exported by ``shmpad`` itself (``import shmpad as lp``).
"""
