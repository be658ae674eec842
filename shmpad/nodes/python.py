"""``PyNode`` runs a function; ``PyClassNode`` builds an object and runs its ``run()``."""

from __future__ import annotations

import logging
from typing import Any, Callable

from shmpad.nodes.base import Dereferenced, Handle, Node, collect_handles

__all__ = ["PyNode", "PyClassNode"]

log = logging.getLogger("shmpad")


class _PyNodeHandle(Handle):
    def dereference(self) -> Any:
        raise NotImplementedError(
            "a PyNode's handle cannot be dereferenced: use a CourierNode to call a node, or a ring node to send it data"
        )


class PyNode(Node):
    """Runs ``function(*args, **kwargs)`` in its own process (or thread), with every
    handle inside ``args``/``kwargs`` dereferenced there first. The node ends when the
    function returns; its return value is ignored."""

    def __init__(self, function: Callable[..., Any], *args: Any, **kwargs: Any):
        super().__init__()
        if not callable(function):
            raise TypeError(f"PyNode needs a callable, got {type(function).__name__}")
        self._function = function
        self._args = args
        self._kwargs = kwargs
        self._input_handles = collect_handles((args, kwargs))

    def create_handle(self) -> Handle:
        return self._track_handle(_PyNodeHandle())

    @property
    def function(self) -> Callable[[], Any]:
        return self.run

    def run(self) -> Any:
        with Dereferenced((self._args, self._kwargs)) as (args, kwargs):
            return self._function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({getattr(self._function, '__qualname__', self._function)!r})"


class PyClassNode(PyNode):
    """Builds ``constructor(*args, **kwargs)`` in the node's process and calls the
    object's ``run()`` if it has one and ``disable_run()`` was not called."""

    def __init__(self, constructor: Callable[..., Any], *args: Any, **kwargs: Any):
        super().__init__(self._run_instance)
        if not callable(constructor):
            raise TypeError(f"{type(self).__name__} needs a class or callable, got {type(constructor).__name__}")
        self._constructor = constructor
        self._set_constructor_args(args, kwargs)
        self._should_run = True

    def _set_constructor_args(self, args: tuple, kwargs: dict[str, Any]) -> None:
        self._ctor_args = args
        self._ctor_kwargs = kwargs
        self._input_handles = collect_handles((args, kwargs))

    def disable_run(self) -> None:
        """Build the object but do not call its ``run()``."""
        self._should_run = False

    def enable_run(self) -> None:
        self._should_run = True

    def _construct(self) -> tuple[Any, Dereferenced]:
        """The instance, and what its handles made (to close when the node ends)."""
        made = Dereferenced((self._ctor_args, self._ctor_kwargs))
        args, kwargs = made.value
        try:
            return self._constructor(*args, **kwargs), made
        except BaseException:
            made.close()
            raise

    def _run_instance(self) -> None:
        instance, made = self._construct()
        with made:
            if self._should_run and hasattr(instance, "run"):
                instance.run()
            else:
                log.info("%s: run() not defined on the instance (or disable_run() was called); the node ends", self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({getattr(self._constructor, '__qualname__', self._constructor)!r})"
