"""The nodes of a program: what runs (Python functions and objects), what serves calls
(courier), and what carries bulk data in shared memory (rings, the weight store).

The public names are exported by ``shmpad`` itself (``import shmpad as lp``).
"""
