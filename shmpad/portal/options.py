"""The options of portal's sockets, which its clients and servers take too, checked.

portal's ``ClientSocket`` and ``ServerSocket`` (and so ``Client``, ``Server``,
``BatchServer``) take keyword options, from ``setup(clientkw=..., serverkw=...)`` and
from the call, the call's winning. An option portal does not know is a ``TypeError``
naming it and the options there are, as on portal; a value of the wrong type or range
is a ``TypeError``/``ValueError`` naming the value.

What each option does here (docs/portal.md has the table):

- ``ClientSocket``/``ServerSocket``: every option is honoured.
- ``Client``/``Server``: ``ipv6``, ``host``, ``autoconn``, ``connect_wait``,
  ``logging``, ``logging_color`` and ``handshake`` are honoured; ``max_msg_size``
  bounds a call's frames over TCP (a call over shared memory is not framed).
  ``max_send_queue`` and ``max_recv_queue`` bound portal's socket queues, which the
  calls do not go through here (a client holds at most ``maxinflight`` calls, a server
  at most its places): accepted, never reached. ``keepalive_*`` set the probes of a
  ``ClientSocket``'s connection; a ``Client`` learns that a server on this host died at
  once (its doorbell closes) and over TCP uses shmpad's keepalive (``shmpad.rpc``), so
  it takes only portal's defaults and refuses other values (``refuse_keepalive``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from shmpad._checks import type_name
from shmpad.portal import runtime

__all__ = ["ClientOptions", "ServerOptions", "client_options", "server_options"]


@dataclasses.dataclass
class ClientOptions:
    ipv6: bool = False
    autoconn: bool = True
    max_msg_size: int = 4 * 1024**3
    max_recv_queue: int = 128
    max_send_queue: int = 128
    keepalive_after: float = 10
    keepalive_every: float = 10
    keepalive_fails: int = 10
    logging: bool = True
    logging_color: str = "yellow"
    connect_wait: float = 0.1
    handshake: str = "portal_handshake"


@dataclasses.dataclass
class ServerOptions:
    ipv6: bool = False
    host: str = ""
    max_msg_size: int = 4 * 1024**3
    max_recv_queue: int = 4096
    max_send_queue: int = 4096
    logging: bool = True
    logging_color: str = "blue"
    handshake: str = "portal_handshake"


_KINDS = {
    "ipv6": bool,
    "autoconn": bool,
    "logging": bool,
    "host": str,
    "logging_color": str,
    "handshake": str,
    "max_msg_size": int,
    "max_recv_queue": int,
    "max_send_queue": int,
    "keepalive_fails": int,
    "keepalive_after": float,
    "keepalive_every": float,
    "connect_wait": float,
}


def _make(cls: type, what: str, kwargs: dict) -> Any:
    known = [f.name for f in dataclasses.fields(cls)]
    for key, value in kwargs.items():
        if key not in known:
            raise TypeError(f"{what} got an unknown option {key!r}; its options are {', '.join(known)}")
        kind = _KINDS[key]
        if kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, kind)
        if not ok:
            raise TypeError(f"{what} option {key} must be {kind.__name__}, got {type_name(value)}")
        if kind in (int, float) and value < 0:
            raise ValueError(f"{what} option {key} must be >= 0, got {value}")
    options = cls(**kwargs)
    if options.max_msg_size < 1:
        raise ValueError(f"{what} option max_msg_size must be >= 1, got {options.max_msg_size}")
    if not options.handshake:
        raise ValueError(f"{what} option handshake must be a non-empty str")
    return options


def refuse_keepalive(options: ClientOptions) -> None:
    """A ``Client`` cannot honour keepalive values other than portal's defaults."""
    default = ClientOptions()
    for key in ("keepalive_after", "keepalive_every", "keepalive_fails"):
        value = getattr(options, key)
        if value != getattr(default, key):
            raise ValueError(
                f"Client cannot honour {key}={value!r}: a server on this host is seen gone at once, and calls "
                "over TCP use shmpad's keepalive (10 s idle, 3 probes 5 s apart, 30 s user timeout); only "
                f"portal's default ({getattr(default, key)!r}) is taken (a ClientSocket honours any value)"
            )


def client_options(kwargs: dict, what: str = "ClientSocket") -> ClientOptions:
    """The client options of ``setup(clientkw=...)`` updated by ``kwargs``, checked."""
    return _make(ClientOptions, what, {**runtime.current().clientkw, **kwargs})


def server_options(kwargs: dict, what: str = "ServerSocket") -> ServerOptions:
    """The server options of ``setup(serverkw=...)`` updated by ``kwargs``, checked."""
    return _make(ServerOptions, what, {**runtime.current().serverkw, **kwargs})
