"""The ground floor every shared-memory structure of shmpad stands on.

``segment``   a named POSIX segment with a checked header, kind and metadata (+ ``round_up``)
``janitor``   the process that unlinks a program's segments after every process has exited
``atomics``   acquire/release loads, stores and read-modify-writes on shared words (numba)
``wait``      futex events: sleep until a word changes, without losing a wake-up
``memcopy``   memcpy between byte buffers inside numba code
``pids``      this process's pid across fork, whether a claimant's pid is alive, /proc/<pid>/stat
``arrays``    a spec of named arrays, placed at cache-line offsets, mapped with one bounds check
``compiled``  numba entry points called without per-call type dispatch

A structure built on it (the rings, the weight store, replay tables, the env pool...) is
a segment kind, its named arrays placed by ``arrays``, a layout table in its module's
docstring, atomics and futex waits on its control words, the claimant's pid in every
claim, and the janitor for cleanup (``docs/architecture.md`` gives the recipe).
"""
