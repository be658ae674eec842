"""The Future that ``client.futures.m(...)`` returns on shared memory: its waiter
reads the client's replies itself, and it makes its lock only when someone needs it.

``concurrent.futures.Future`` makes a ``threading.Condition`` (an RLock, a deque, five
bound methods) when it is made, and takes it to settle and to read the result: a
sizeable share of a call's cost on the client (``python -m bench.rpc --subjects shmpad``
measures calls/s; no kept figure yet, see docs/benchmarks.md), and the garbage that
runs the cycle collector every few dozen calls. Most futures are made, settled by the
thread that reads replies and read by the thread that made them, and never need it.
So the condition is made on first use, by whichever ``Future`` method takes it
(``wait``, ``as_completed``, ``add_done_callback``, ``cancel``, ``done``, ``running``, repr);
until then the future is settled and read without it:

    settle (reply reader)                    any Future method (any thread)
    with _LAZY:                              self._condition -> with _LAZY: made once
        if no condition yet:                 with self._condition:
            state PENDING? set result,           read/modify state, waiters, callbacks
            then state = FINISHED; done
    otherwise: Future's own locked settle

Making the condition and the fast settle exclude each other through ``_LAZY``, so
either the settle happens wholly before the condition exists (and every method that
takes it then sees FINISHED: no waiter or callback can have been added, since adding
one makes the condition), or it finds the condition and takes Future's locked path,
which notifies the waiters and runs the callbacks. A cancel that made the condition
first leaves CANCELLED, which Future's settle refuses (``InvalidStateError``) as it
always does. FINISHED is final, so ``result()`` reads a finished future without a
lock (the result is stored before the state, and both under a lock).

This leans on ``Future``'s private attributes and, for that unlocked read, on the GIL;
where the attributes are not the ones known here (another Python) or the GIL is off
(a free-threaded build), ``LAZY`` is False and the future is a plain Future.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING
from typing import Any

__all__ = ["PumpedFuture", "LAZY"]

_FIELDS = {"_condition", "_state", "_result", "_exception", "_waiters", "_done_callbacks"}
LAZY = set(vars(Future())) == _FIELDS and getattr(sys, "_is_gil_enabled", lambda: True)()
"""whether futures make their condition lazily here: Future has the attributes replaced, and the GIL is on"""
_LAZY = threading.Lock()


def _new_lock_in_child() -> None:
    # another thread may have held the lock at the fork: it would stay held in the child
    global _LAZY
    _LAZY = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_in_child)
_DONE_STATES = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)


class _LazyCondition:
    """The class attribute behind ``_condition`` until an instance has its own (a
    non-data descriptor: the instance's attribute, once set, is found first)."""

    def __get__(self, fut: Any, owner: type | None = None) -> Any:
        if fut is None:
            return self
        d = fut.__dict__
        with _LAZY:  # pairs with the check in PumpedFuture._settle
            cond = d.get("_condition")
            if cond is None:
                cond = d["_condition"] = threading.Condition()
        return cond


class PumpedFuture(Future):
    """A Future whose ``result()``/``exception()`` read the client's replies
    themselves while they wait. It stays PENDING until answered, so ``cancel()``
    works until then (the call still runs; its reply is dropped)."""

    if LAZY:
        _condition = _LazyCondition()

        def __init__(self, client: Any):
            # Future.__init__ less the condition (see the module docstring)
            self._state = PENDING
            self._result = None
            self._exception = None
            self._waiters: list = []
            self._done_callbacks: list = []
            self._client = client

        def set_result(self, result: Any) -> None:
            if not self._settle(result, None):
                super().set_result(result)

        def set_exception(self, exception: BaseException | None) -> None:
            if not self._settle(None, exception):
                super().set_exception(exception)

        def _settle(self, result: Any, exception: BaseException | None) -> bool:
            """Settle without the condition if nobody made it; False if somebody did."""
            with _LAZY:  # pairs with _LazyCondition.__get__
                if "_condition" in self.__dict__:
                    return False
                state = self._state
                if state not in _DONE_STATES:
                    self._result = result
                    self._exception = exception
                    self._state = FINISHED  # last: result() reads the result once it sees this
                    return True
            # outside the lock: repr() takes the condition, which takes the lock
            raise InvalidStateError(f"{state}: {self!r}")

    else:

        def __init__(self, client: Any):
            super().__init__()
            self._client = client

    def _finished(self) -> bool:
        # a read of one attribute, without the condition's lock: a hint the callers
        # re-check through the Future API
        return self._state in _DONE_STATES

    def result(self, timeout: float | None = None) -> Any:
        if self._state is not FINISHED:
            self._client._pump(self, timeout)
        if LAZY and self._state is FINISHED:
            # FINISHED is final and was stored last, under a lock: read without one
            exc = self._exception
            if exc is None:
                return self._result
            try:
                raise exc
            finally:
                del exc, self  # as Future does: no cycle through the traceback
        return super().result(timeout=0)  # cancelled, TimeoutError, or without the GIL

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._finished():
            self._client._pump(self, timeout)
        return super().exception(timeout=0)
