"""The call surface both transports share: which methods a server exposes
(``public_methods``), how a client spells a call (``client.m(...)``, ``client.futures.m(...)``),
the deadline check and its error, and settling a future that may have been cancelled.
"""

from __future__ import annotations

import datetime
from concurrent.futures import Future, InvalidStateError
from typing import Any, Callable

from shmpad.errors import Timeout

__all__ = [
    "MethodCalls",
    "FutureMethods",
    "public_methods",
    "check_call_timeout",
    "timeout_error",
    "settle",
    "POLL_S",
    "CONNECT_TIMEOUT_S",
]

# How often a blocked wait looks up from its ring: to notice stop, a closed
# server, or a deadline.
POLL_S = 0.1
# How long a client without call_timeout waits for a server's request ring to exist.
CONNECT_TIMEOUT_S = 60.0


def public_methods(obj: Any) -> Callable[[str], Callable]:
    """A lookup from method name to bound method that admits only public names
    and ``__call__``; other names raise ``AttributeError``."""
    cache: dict[str, Callable] = {}
    cls = type(obj).__name__

    def lookup(name: str) -> Callable:
        fn = cache.get(name)
        if fn is not None:
            return fn
        if not isinstance(name, str) or (name.startswith("_") and name != "__call__"):
            raise AttributeError(
                f"{cls!r} object has no public method {name!r}: only names not starting with '_' and __call__ can be called"
            )
        fn = getattr(obj, name, None)
        if fn is None or not callable(fn):
            raise AttributeError(f"{cls!r} object has no public method {name!r}")
        cache[name] = fn
        return fn

    return lookup


class FutureMethods:
    """``client.futures``: attribute access gives a function returning a Future."""

    def __init__(self, client: Any):
        self._client = client

    def __getattr__(self, method: str) -> Callable[..., Future]:
        if method.startswith("_") and method != "__call__":
            raise AttributeError(method)
        client = self._client

        def call(*args, **kwargs) -> Future:
            return client.call_future(method, args, kwargs)

        call.__name__ = method
        self.__dict__[method] = call
        return call

    def __call__(self, *args, **kwargs) -> Future:
        return self._client.call_future("__call__", args, kwargs)


class MethodCalls:
    """``client.m(...)`` for any public name ``m``, and ``client(...)``: each is
    ``self.call(name, args, kwargs)``. The surface the RPC clients share."""

    def __getattr__(self, method: str) -> Callable:
        if method.startswith("_") and method != "__call__":
            raise AttributeError(method)

        def call(*args, **kwargs):
            return self.call(method, args, kwargs)

        call.__name__ = method
        self.__dict__[method] = call  # later lookups skip __getattr__
        return call

    def __call__(self, *args, **kwargs):
        return self.call("__call__", args, kwargs)


def check_call_timeout(call_timeout: Any) -> float | None:
    """``call_timeout`` in seconds: None, a number > 0 or a ``datetime.timedelta`` > 0
    (what Launchpad's courier takes); ``TypeError``/``ValueError`` otherwise."""
    if call_timeout is None:
        return None
    if isinstance(call_timeout, datetime.timedelta):
        seconds = call_timeout.total_seconds()
    elif isinstance(call_timeout, bool) or not isinstance(call_timeout, (int, float)):
        raise TypeError(
            f"call_timeout must be a number of seconds, a timedelta or None, got {type(call_timeout).__name__}"
        )
    else:
        seconds = float(call_timeout)
    if not seconds > 0:
        raise ValueError(f"call_timeout must be > 0 or None, got {call_timeout!r}")
    return seconds


def timeout_error(method: str, server: str, call_timeout: float | None) -> Timeout:
    # "Deadline Exceeded" is the text Launchpad's courier puts in this error, and users match on it
    return Timeout(
        f"Deadline Exceeded: call to {method!r} on {server!r} did not complete within call_timeout={call_timeout} s"
    )


def settle(fut: Future, how: Callable[[Future, Any], None], value: Any) -> None:
    try:
        how(fut, value)
    except InvalidStateError:
        pass  # the caller cancelled it: the reply has nobody to go to
