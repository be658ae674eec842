"""The public surface of each package, pinned: the names ``__all__`` exports and the
signatures of those functions and of those classes' public methods. A rename, a removed
name or a changed signature fails here, so it is a deliberate act: change the table in
the same commit and say why.

The table is ``public_api.json`` beside this file. To rebuild it after a deliberate
change: ``json.dump({p: _surface(p) for p in PINNED}, f, indent=1, sort_keys=True)``.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import pathlib
from typing import Any

import pytest


def _signature(obj: Any) -> str | None:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return None


def _describe(obj: Any) -> Any:
    if inspect.isclass(obj) and issubclass(obj, enum.Enum):
        return {"members": {m.name: m.value for m in obj}}  # (an Enum's __init__ is Python's, and varies with it)
    if inspect.isclass(obj):
        out = {"__init__": _signature(obj)}
        if issubclass(obj, BaseException):
            return out
        for name, member in sorted(vars(obj).items()):
            if name.startswith("_"):
                continue
            if isinstance(member, (staticmethod, classmethod)):
                out[name] = _signature(member.__func__)
            elif isinstance(member, property):
                out[name] = "property"
            elif inspect.isfunction(member):
                out[name] = _signature(member)
        return out
    if callable(obj):
        return _signature(obj)
    return type(obj).__name__


def _surface(package: str) -> dict[str, Any]:
    module = importlib.import_module(package)
    return {name: _describe(getattr(module, name)) for name in sorted(module.__all__)}


PINNED: dict[str, dict[str, Any]] = json.loads((pathlib.Path(__file__).parent / "public_api.json").read_text())


# what needs torch to import (pytest --core leaves it out)
_RL_PACKAGES = {"actors", "learners"}
_RL_NAMES = {("shmpad.net", "Accumulator")}


def _param(*values: str) -> Any:
    rl = values[0] in _RL_PACKAGES or values in _RL_NAMES
    return pytest.param(*values, marks=pytest.mark.rl) if rl else values if len(values) > 1 else values[0]


@pytest.mark.parametrize("package", [_param(p) for p in sorted(PINNED)])
def test_the_exported_names_are_the_pinned_ones(package):
    assert sorted(importlib.import_module(package).__all__) == sorted(PINNED[package])


@pytest.mark.parametrize(("package", "name"), [_param(p, n) for p in sorted(PINNED) for n in sorted(PINNED[p])])
def test_a_public_name_keeps_its_signatures(package, name):
    assert _describe(getattr(importlib.import_module(package), name)) == PINNED[package][name]
