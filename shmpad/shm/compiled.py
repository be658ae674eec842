"""Compiled entry points: a numba function called without numba's per-call type dispatch."""

from __future__ import annotations

from numba import typeof

__all__ = ["fast_entry"]


def fast_entry(dispatcher, *example_args):
    """The compiled entry point of ``dispatcher`` for arguments typed like ``example_args``.

    Calling the entry point skips numba's per-call type dispatch, a large share of what a
    small call costs (timing a loop of small calls through the dispatcher and through the
    entry point measures it; no kept figure, see docs/benchmarks.md). Callers must pass
    exactly those types."""
    sig = tuple(typeof(a) for a in example_args)
    dispatcher.compile(sig)
    cres = dispatcher.overloads.get(sig)
    return getattr(cres, "entry_point", None) or dispatcher
