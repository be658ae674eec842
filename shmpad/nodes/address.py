"""``Address``: a network address a node listens on, picked when the program launches.

Launchpad's placeholder for nodes that run their own server: ``address.assign(node)``
(or ``node.allocate_address(address)``) before launch, ``address.resolve()`` inside the
nodes at run time. The launcher binds every address still unbound to a
``SimpleLocalAddressBuilder`` (``localhost:PORT``, a port free when it was picked).
"""

from __future__ import annotations

import abc
import os
import re
import socket
from typing import Any

__all__ = ["AbstractAddressBuilder", "Address", "SimpleLocalAddressBuilder", "bind_addresses", "get_port_from_address"]

_NAME = re.compile("[a-z][a-z0-9]*")


class AbstractAddressBuilder(metaclass=abc.ABCMeta):
    """Makes an address's string at run time."""

    @abc.abstractmethod
    def build(self) -> str:
        """The address, ``HOST:PORT``."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SimpleLocalAddressBuilder(AbstractAddressBuilder):
    """``localhost:PORT`` with a port that was free when the builder was made."""

    def __init__(self) -> None:
        self._address = f"localhost:{_free_port()}"

    def build(self) -> str:
        return self._address


class Address:
    """A network address owned by one node, resolved at run time."""

    def __init__(self, name: str | None = None):
        if name is not None and not isinstance(name, str):
            raise TypeError(f"address name must be a str or None, got {type(name).__name__}")
        if name is not None and not _NAME.fullmatch(name):
            raise ValueError(f"Wrong address name: {name!r} does not match {_NAME.pattern}.")
        self.name = name
        self._builder: AbstractAddressBuilder | None = None
        self._owner: Any = None

    def bind(self, builder: AbstractAddressBuilder) -> None:
        """Set what makes the address (the launcher does, for every node's addresses)."""
        if not isinstance(builder, AbstractAddressBuilder):
            raise TypeError(f"bind() takes an AbstractAddressBuilder, got {type(builder).__name__}")
        self._builder = builder

    @property
    def bound(self) -> bool:
        return self._builder is not None

    def resolve(self) -> str:
        """The address as ``HOST:PORT``."""
        if self._builder is None:
            if self._owner is None:
                raise RuntimeError(
                    "this Address is not assigned to any node, so it cannot be resolved: "
                    "call address.assign(node) before launching the program"
                )
            raise RuntimeError(
                f"the Address of node {self._owner!r} is not bound yet: it is bound when the program is launched"
            )
        return self._builder.build()

    def assign(self, node: Any) -> None:
        """Make ``node`` the owner of this address (once; again with the same node is a no-op)."""
        if self._owner is node:
            return
        if self._owner is not None:
            raise ValueError(f"this Address is already assigned to node {self._owner!r}; cannot assign it to {node!r}")
        self._owner = node
        node.addresses.append(self)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        if not isinstance(self._owner, str):  # the node stays behind: a description goes along
            state["_owner"] = f"restored from a pickle of an Address of node {self._owner!r}"
        return state


def bind_addresses(nodes: list[Any]) -> None:
    """Bind each still unbound address of ``nodes`` to a ``SimpleLocalAddressBuilder``."""
    for node in nodes:
        for address in getattr(node, "addresses", ()):
            if isinstance(address, Address) and not address.bound:
                address.bind(SimpleLocalAddressBuilder())


def get_port_from_address(address: str) -> int:
    """The port of ``HOST:PORT``; a named port ``HOST:name`` is read from ``$LP_PORT_name``
    (Launchpad's convention)."""
    if not isinstance(address, str):
        raise TypeError(f"address must be a str like 'localhost:8000', got {type(address).__name__}")
    port = address.rsplit(":", 1)[-1]
    if port.isdigit():
        return int(port)
    env = f"LP_PORT_{port}"
    if env not in os.environ:
        raise ValueError(f"address {address!r} names port {port!r}, but ${env} is not set")
    return int(os.environ[env])
