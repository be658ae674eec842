"""portal's ``Future`` and ``futures.wait``.

A future's error is raised once: the first ``result()`` raises it, later ones return
None (portal's rule, so an error is reported once however many places look). An error
nobody raised before the future was collected is raised by its client's next call
(``Client``). While a caller waits in ``result()``, it reads the replies of its
transport itself (``pump``), so an answer reaches it without a hand-off between threads.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

__all__ = ["Future", "wait"]

_SLICE_S = 0.1
"""how long a wait reads replies before it looks again whether its call moved to a new link"""


class Future:
    def __init__(self):
        self.rai = [False]  # whether its error was raised (a list: the client's finalizer shares it)
        self.fns: list[Callable] = []
        self.con = threading.Condition()
        self.don = False
        self.res: Any = None
        self.err: BaseException | None = None
        self.inner: Any = None  # the transport's future of the call in flight, whose result() reads replies

    def __repr__(self) -> str:
        if not self.don:
            info = "done=False"
        elif self.err is not None:
            info = f"done=True, error='{self.err}' raised={self.rai[0]}"
        else:
            info = "done=True"
        return f"Future({info})"

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until it is done; False if ``timeout`` s passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.don:
            left = _SLICE_S if deadline is None else min(_SLICE_S, deadline - time.monotonic())
            if left <= 0:
                return False
            inner = self.inner
            if inner is not None and not inner.done():
                try:
                    inner.exception(left)  # reads replies, settling this future through its callback
                except Exception:
                    pass  # not yet (a timeout), or cancelled: the client settles this future or moves the call
                continue
            with self.con:
                if not self.don:
                    self.con.wait(left)
        return True

    def done(self) -> bool:
        return self.don

    def error(self) -> BaseException | None:
        return self.err

    def result(self, timeout: float | None = None) -> Any:
        if not self.wait(timeout):
            raise TimeoutError(f"the call did not complete within {timeout} s")
        if self.err is None:
            return self.res
        if not self.rai[0]:
            self.rai[0] = True
            raise self.err
        return None

    def set_result(self, result: Any) -> None:
        self._settle(result, None)

    def set_error(self, e: BaseException) -> None:
        self._settle(None, e)

    def _settle(self, result: Any, error: BaseException | None) -> None:
        with self.con:
            if self.don:
                raise RuntimeError(f"{self!r} is settled already")
            self.res, self.err = result, error
            self.don = True
            fns = list(self.fns)
            self.con.notify_all()
        for fn in fns:
            fn(self)

    def add_callback(self, fn: Callable[[Future], Any]) -> None:
        """Call ``fn(future)`` once it is done (now, if it is)."""
        with self.con:
            self.fns.append(fn)
            done = self.don
        if done:
            fn(self)

    def remove_callback(self, fn: Callable) -> None:
        with self.con:
            self.fns.remove(fn)


def wait(futures: list[Future], timeout: float | None = None, amount: int | None = None) -> tuple | bool:
    """Wait until ``amount`` (default all) of ``futures`` are done: those done, in the
    order they finished, or False if ``timeout`` s passed first."""
    futures = list(futures)
    amount = len(futures) if amount is None else amount
    done: list[Future] = []
    event = threading.Event()
    lock = threading.Lock()

    def count(fut: Future) -> None:
        with lock:
            done.append(fut)
            if len(done) >= amount:
                event.set()

    if amount <= 0:
        event.set()
    for fut in futures:
        fut.add_callback(count)
    try:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not event.is_set():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            # read replies while waiting, through a future still open
            pending = next((f for f in futures if not f.don), None)
            if pending is None:
                event.wait(left)
            else:
                pending.wait(_SLICE_S if left is None else min(_SLICE_S, left))
        with lock:
            return tuple(done)
    finally:
        for fut in futures:
            fut.remove_callback(count)
