"""``batched_handler``: many callers' calls of one method made as one call with stacked arguments.

Launchpad's semantics (its courier ``BuildBatchedHandlerWrapper``): up to ``batch_size``
calls are grouped; the method is called once with each argument batched across the
calls; its result is cut back into one row per caller. A batch runs when it is full,
or ``timeout`` after its first call arrived (then with fewer rows, or padded to
``batch_size`` with copies of its first call when ``pad_batch``; the padding's rows are
dropped). At most ``max_parallelism`` batches run at once; a batch that is due while
that many run waits, and keeps taking calls until it runs. An exception raised by the
method, or by batching or unbatching, reaches every caller of that batch.

How values are batched (each positional argument and each keyword on its own; every
call must pass the same number of arguments and the same keywords)::

    numpy arrays, torch tensors     stacked on a new leading axis: [B, ...]
    bool, int, float (and numpy's)  a 1-D numpy array of B (bool, int64, float64)
    tuple, namedtuple, dict         the same container of batched members
    anything else (list, str, ...)  a list of the B values

and how the result is cut: an array or tensor by its leading axis (it must have B
rows), a list by position (B items), a tuple or dict member-wise; a bare scalar
cannot be cut and fails every caller.

Unlike Launchpad's, a batched method does not hold one of the server's threads per
waiting call: the servers (``shm_server``, ``tcp_server``) hand the call to
``submit`` and answer it from the future's callback, so ``thread_pool_size`` need not
exceed ``batch_size``. A batch runs on the thread that filled it, or, when its
timeout fires, on a thread started for it.
"""

from __future__ import annotations

import collections
import datetime
import inspect
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable

import numpy as np

from shmpad._checks import check_int, type_name

__all__ = ["BatchedHandler", "batched_handler", "stack", "unstack"]

# A timer thread with no batch to watch for this long ends; the next call starts another.
_TIMER_IDLE_S = 1.0


def batched_handler(
    batch_size: int,
    max_parallelism: int = 1,
    timeout: datetime.timedelta | float = datetime.timedelta(milliseconds=200),
    pad_batch: bool = False,
) -> Callable[[Callable], BatchedHandler]:
    """A decorator that batches the calls of a (bound) courier method; see the module
    docstring. Wrap methods in the constructor, as in Launchpad::

        self.compute = lp.batched_handler(batch_size=8)(self.compute)

    ``timeout`` is a ``timedelta`` or seconds."""
    batch_size = check_int("batch_size", batch_size, minimum=1)
    max_parallelism = check_int("max_parallelism", max_parallelism, minimum=1)
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a timedelta or a number of seconds, got {type_name(timeout)}")
    else:
        seconds = float(timeout)
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"timeout must be a finite duration >= 0, got {timeout!r}")
    if not isinstance(pad_batch, bool):
        raise TypeError(f"pad_batch must be a bool, got {type_name(pad_batch)}")

    def decorate(fn: Callable) -> BatchedHandler:
        return BatchedHandler(fn, batch_size, max_parallelism, seconds, pad_batch)

    return decorate


class BatchedHandler:
    """A method whose calls are batched. Calling it blocks until its batch has run and
    returns the caller's row; ``submit`` returns a ``Future`` of it instead (what the
    servers use)."""

    def __init__(self, fn: Callable, batch_size: int, max_parallelism: int, timeout: float, pad_batch: bool):
        if not callable(fn):
            raise TypeError(f"batched_handler wraps a callable, got {type_name(fn)}")
        if _is_unbound_method(fn):
            raise TypeError(
                f"batched_handler got {getattr(fn, '__qualname__', fn)!r}, which takes 'self' but is not bound: "
                "do not decorate methods in the class body; wrap the bound method in the constructor "
                "(self.m = lp.batched_handler(batch_size=...)(self.m))"
            )
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", "batched_handler")
        self.__doc__ = getattr(fn, "__doc__", None)
        self.batch_size = batch_size
        self.max_parallelism = max_parallelism
        self.timeout = timeout
        self.pad_batch = pad_batch
        self._lock = threading.Lock()
        self._pending: list[tuple[tuple, dict, Future]] = []  # the batch being filled
        self._deadline = 0.0  # when the pending batch is due (its first call + timeout)
        self._due = False  # the pending batch timed out and runs as soon as it may
        self._full: collections.deque[list] = collections.deque()  # full batches waiting to run
        self._running = 0
        self._timer: threading.Thread | None = None
        self._timer_wake = threading.Condition(self._lock)

    def __repr__(self) -> str:
        return f"batched_handler(batch_size={self.batch_size})({self.__wrapped__!r})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.submit(args, kwargs).result()

    def submit(self, args: tuple, kwargs: dict) -> Future:
        """Add one call to the batch being filled; its future settles when the batch has run."""
        fut: Future = Future()
        with self._lock:
            self._pending.append((args, kwargs, fut))
            if len(self._pending) == 1 and self.batch_size > 1:
                self._deadline = time.monotonic() + self.timeout
                self._wake_timer()
            if len(self._pending) >= self.batch_size:
                self._full.append(self._pending)
                self._pending = []
                self._due = False
            batch = self._next_batch()
        if batch is not None:
            self._run(batch)
        return fut

    # -- scheduling (under self._lock) ----------------------------------------------------

    def _next_batch(self) -> list | None:
        """A batch to run now, counted as running, if one may run."""
        if self._running >= self.max_parallelism:
            return None
        if self._full:
            batch = self._full.popleft()
        elif self._due and self._pending:
            batch, self._pending, self._due = self._pending, [], False
        else:
            return None
        self._running += 1
        return batch

    def _wake_timer(self) -> None:
        if self._timer is None:
            self._timer = threading.Thread(target=self._watch, name=f"shmpad-batch-timer-{self.__name__}", daemon=True)
            self._timer.start()
        else:
            self._timer_wake.notify()

    def _watch(self) -> None:
        """Marks the pending batch due at its deadline and starts it if it may run."""
        idle_since = time.monotonic()
        with self._lock:
            while True:
                now = time.monotonic()
                if not self._pending or self._due:
                    if now - idle_since >= _TIMER_IDLE_S:
                        self._timer = None
                        return
                    self._timer_wake.wait(_TIMER_IDLE_S)
                    continue
                idle_since = now
                if now < self._deadline:
                    self._timer_wake.wait(self._deadline - now)
                    continue
                self._due = True
                batch = self._next_batch()
                if batch is not None:
                    threading.Thread(target=self._run, args=(batch,), name="shmpad-batch", daemon=True).start()

    # -- running -------------------------------------------------------------------------

    def _run(self, batch: list) -> None:
        """Run ``batch``, then whatever became runnable while it ran, on this thread."""
        while batch is not None:
            self._execute(batch)
            with self._lock:
                self._running -= 1
                batch = self._next_batch()

    def _execute(self, batch: list) -> None:
        calls = [(args, kwargs) for args, kwargs, _ in batch]
        if self.pad_batch:
            calls += [calls[0]] * (self.batch_size - len(calls))
        try:
            args, kwargs = _batch_calls(calls)
            rows = unstack(self.__wrapped__(*args, **kwargs), len(calls))
        except BaseException as e:
            for _, _, fut in batch:
                if fut.set_running_or_notify_cancel():
                    fut.set_exception(e)
            return
        for (_, _, fut), row in zip(batch, rows):
            if fut.set_running_or_notify_cancel():
                fut.set_result(row)


def _is_unbound_method(fn: Callable) -> bool:
    if hasattr(fn, "__self__") or not inspect.isfunction(fn):
        return False
    params = list(inspect.signature(fn).parameters)
    return bool(params) and params[0] == "self"


def _batch_calls(calls: list[tuple[tuple, dict]]) -> tuple[tuple, dict]:
    n_args = {len(args) for args, _ in calls}
    if len(n_args) > 1:
        raise ValueError(f"the calls of one batch must pass the same number of arguments, got {sorted(n_args)}")
    keys = {tuple(sorted(kwargs)) for _, kwargs in calls}
    if len(keys) > 1:
        raise ValueError(f"the calls of one batch must pass the same keywords, got {sorted(keys)}")
    args = tuple(stack([c[0][i] for c in calls], f"argument {i}") for i in range(n_args.pop()))
    kwargs = {k: stack([c[1][k] for c in calls], f"keyword {k!r}") for k in calls[0][1]}
    return args, kwargs


def _torch_tensor_type() -> type | None:
    torch = sys.modules.get("torch")  # a tensor exists only if its caller imported torch
    return None if torch is None else torch.Tensor


def stack(values: list, where: str = "value") -> Any:
    """The B callers' ``values`` batched as the module docstring says."""
    first = values[0]
    tensor = _torch_tensor_type()
    if isinstance(first, np.ndarray) or (tensor is not None and isinstance(first, tensor)):
        kinds = {(tuple(v.shape), str(v.dtype)) if hasattr(v, "shape") else (type_name(v), "") for v in values}
        if len(kinds) > 1 or not all(type(v) is type(first) for v in values):
            raise ValueError(f"{where}: the calls of one batch must pass arrays of one shape and dtype, got {kinds}")
        return np.stack(values) if isinstance(first, np.ndarray) else sys.modules["torch"].stack(values)
    if isinstance(first, (bool, np.bool_)):
        if all(isinstance(v, (bool, np.bool_)) for v in values):
            return np.array(values, dtype=np.bool_)
    elif isinstance(first, (int, np.integer)):
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
            return np.array(values, dtype=np.int64)
    elif isinstance(first, (float, np.floating)):
        if all(isinstance(v, (float, np.floating)) for v in values):
            return np.array(values, dtype=np.float64)
    elif isinstance(first, tuple):
        if any(type(v) is not type(first) or len(v) != len(first) for v in values):
            raise ValueError(f"{where}: the calls of one batch must pass tuples of one type and length")
        members = [stack([v[i] for v in values], f"{where}[{i}]") for i in range(len(first))]
        return type(first)(*members) if hasattr(first, "_fields") else tuple(members)
    elif isinstance(first, dict):
        if any(not isinstance(v, dict) or v.keys() != first.keys() for v in values):
            raise ValueError(f"{where}: the calls of one batch must pass dicts with the same keys")
        return {k: stack([v[k] for v in values], f"{where}[{k!r}]") for k in first}
    else:
        return list(values)
    raise ValueError(
        f"{where}: the calls of one batch must pass numbers of one kind, got {sorted({type_name(v) for v in values})}"
    )


def unstack(result: Any, n: int) -> list:
    """``result`` of a batched call cut into its ``n`` rows."""
    tensor = _torch_tensor_type()
    if isinstance(result, np.ndarray) or (tensor is not None and isinstance(result, tensor)):
        if result.ndim == 0 or result.shape[0] != n:
            raise ValueError(
                f"a batched handler returns one row per call: a batch of {n} calls got an array of shape "
                f"{tuple(result.shape)}"
            )
        return [result[i] for i in range(n)]
    if isinstance(result, tuple):
        columns = [unstack(member, n) for member in result]
        if hasattr(result, "_fields"):
            return [type(result)(*row) for row in zip(*columns)] if columns else [result] * n
        return [tuple(row) for row in zip(*columns)] if columns else [()] * n
    if isinstance(result, dict):
        columns = {k: unstack(v, n) for k, v in result.items()}
        return [{k: col[i] for k, col in columns.items()} for i in range(n)]
    if isinstance(result, list):
        if len(result) != n:
            raise ValueError(
                f"a batched handler returns one row per call: a batch of {n} calls got a list of {len(result)}"
            )
        return list(result)
    raise TypeError(
        f"a batched handler returns one row per call (an array, tensor or list of {n}, or a tuple or dict of "
        f"them), got {type_name(result)}"
    )
