"""The values portal's calls carry, and ``pack``/``unpack`` of them.

A value is a tree: dicts, lists and tuples of leaves, where a leaf is ``None``, a
``str``, ``bytes`` (``bytearray``, a C-contiguous ``memoryview``), a number or a numpy
array (a number travels as a 0-d array, as portal sends it), or a ``SharedArray``
(which travels by name). Anything else is refused with portal's ``TypeError``/
``NotImplementedError``, so a program that runs here runs on portal too.

``pack`` gives the buffers of one message, without copying array data::

    u64 n | n x u64 sizes | header (JSON: the tree's shape and each leaf's kind) | leaf 0 | ... | leaf n-3

``unpack`` takes the buffers joined (any bytes-like object) and gives the tree back,
its arrays viewing the message (read-only when the message is). Tuples come back as
lists, as on portal, whose header format has no tuple.

The calls themselves travel through shmpad's RPC codec (pickle protocol 5, arrays out of
band), after ``normalize`` gave the tree exactly the types ``unpack(pack(tree))`` would:
the server sees what a portal server sees, at the cost of one walk over the tree.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any, Callable

import numpy as np

from shmpad.portal.sharray import SharedArray

__all__ = ["pack", "unpack", "check", "normalize", "tree_equals", "tree_map", "tree_flatten", "tree_unflatten"]

_SIZE = struct.Struct("<Q")


def tree_map(fn: Callable, *trees: Any, isleaf: Callable[[Any], bool] | None = None) -> Any:
    """``fn`` applied to the leaves of ``trees`` (all of one shape), in a tree of that shape."""
    first = trees[0]
    if isleaf is not None and isleaf(first):
        return fn(*trees)
    if isinstance(first, (list, tuple, dict)):
        for t in trees[1:]:
            if type(t) is not type(first) or len(t) != len(first):
                raise TypeError(f"tree structure differs between arguments: {_kind(first)} vs {_kind(t)}")
        if isinstance(first, dict):
            for t in trees[1:]:
                if t.keys() != first.keys():
                    raise TypeError(f"tree structure differs between arguments: keys {list(first)} vs {list(t)}")
            return {k: tree_map(fn, *[t[k] for t in trees], isleaf=isleaf) for k in first}
        items = [tree_map(fn, *[t[i] for t in trees], isleaf=isleaf) for i in range(len(first))]
        return items if isinstance(first, list) else tuple(items)
    return fn(*trees)


def _kind(x: Any) -> str:
    return f"{type(x).__name__} of {len(x)}" if isinstance(x, (list, tuple, dict)) else type(x).__name__


def tree_flatten(tree: Any) -> tuple[tuple, Any]:
    """The leaves of ``tree`` in order, and its shape (the tree with every leaf None)."""
    leaves: list = []
    shape = tree_map(lambda x: leaves.append(x), tree)
    return tuple(leaves), shape


def tree_unflatten(leaves: Any, shape: Any) -> Any:
    it = iter(tuple(leaves))
    return tree_map(lambda _: next(it), shape)


def _leaf(value: Any) -> Any:
    """``value`` as the type it arrives as on portal's other side."""
    if value is None or type(value) is str or type(value) is bytes:
        return value
    if isinstance(value, (str, bytes)):  # np.str_, np.bytes_ (a row of a batched string array): as portal packs them
        return str(value) if isinstance(value, str) else bytes(value)
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise TypeError(f"an array of dtype object cannot be sent, got shape {value.shape}")
        return value
    if isinstance(value, (bool, int, float, np.generic)):
        arr = np.asarray(value)
        if arr.dtype == object:
            raise TypeError(f"the number {value!r} does not fit a numpy dtype")
        return arr
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, SharedArray):
        return value
    raise NotImplementedError(
        f"cannot send a {type(value).__name__}: values are dicts, lists and tuples of None, str, bytes, "
        "numbers, numpy arrays and SharedArrays"
    )


def normalize(tree: Any) -> Any:
    """``tree`` with the types ``unpack(pack(tree))`` gives (tuples as lists, numbers as
    0-d arrays); ``TypeError``/``NotImplementedError`` for a value that cannot be sent."""
    if isinstance(tree, dict):
        return {k: normalize(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [normalize(v) for v in tree]
    return _leaf(tree)


_SENDABLE = (str, bytes, bool, int, float, np.generic, bytearray, memoryview, SharedArray)


def check(tree: Any) -> Any:
    """``tree`` unchanged if it can be sent (the sender's half of ``normalize``, which the
    receiver applies: converting numbers to arrays before pickling would only cost time)."""
    if isinstance(tree, dict):
        for v in tree.values():
            check(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            check(v)
    elif tree is not None and not isinstance(tree, _SENDABLE):
        if not isinstance(tree, np.ndarray):
            _leaf(tree)  # raises with the wording of normalize
        elif tree.dtype == object:
            _leaf(tree)
    return tree


def _shape(tree: Any) -> Any:
    """The JSON of a tree's shape: a dict as ``{"d": [[key, shape], ...]}`` (keys keep
    their type and order), a list as ``[shapes]``, a leaf as 0."""
    if isinstance(tree, dict):
        return {"d": [[k, _shape(v)] for k, v in tree.items()]}
    if isinstance(tree, (list, tuple)):
        return [_shape(v) for v in tree]
    return 0


def _unshape(shape: Any, leaves: Any) -> Any:
    if isinstance(shape, dict):
        return {k: _unshape(v, leaves) for k, v in shape["d"]}
    if isinstance(shape, list):
        return [_unshape(v, leaves) for v in shape]
    return next(leaves)


def pack(data: Any) -> list:
    """The buffers of a message carrying ``data`` (see the module docstring)."""
    data = normalize(data)
    leaves, _ = tree_flatten(data)
    specs, buffers = [], []
    for value in leaves:
        if value is None:
            specs.append(["none"])
            buffers.append(b"")
        elif isinstance(value, str):
            specs.append(["utf8"])
            buffers.append(value.encode("utf-8"))
        elif isinstance(value, bytes):
            specs.append(["bytes"])
            buffers.append(value)
        elif isinstance(value, np.ndarray):
            if not value.flags.c_contiguous:
                raise ValueError(
                    f"an array of shape {value.shape} is not C-contiguous: pass np.ascontiguousarray(x) to pack()"
                )
            specs.append(["array", list(value.shape), value.dtype.str])
            buffers.append(value.data.cast("B") if value.size else b"")
        else:  # a SharedArray: by name
            specs.append(["sharray", *value.__getstate__()])
            buffers.append(b"")
    header = json.dumps({"tree": _shape(data), "specs": specs}).encode("utf-8")
    parts = [header, *buffers]
    sizes = struct.pack(f"<{len(parts)}Q", *(memoryview(p).nbytes for p in parts))
    return [_SIZE.pack(len(parts)), sizes, *parts]


def unpack(buffer: Any) -> Any:
    """The tree of a packed message (its buffers joined); ``ValueError`` if it does not add up."""
    view = memoryview(buffer).cast("B")
    if len(view) < 8:
        raise ValueError(f"a packed message has an 8-byte header, got {len(view)} bytes")
    (n,) = _SIZE.unpack_from(view)
    if n < 1 or 8 + 8 * n > len(view):
        raise ValueError(f"a packed message of {len(view)} bytes cannot hold {n} parts")
    sizes = struct.unpack_from(f"<{n}Q", view, 8)
    at = 8 + 8 * n
    if at + sum(sizes) != len(view):
        raise ValueError(f"a packed message of {len(view)} bytes does not hold the {sum(sizes)} its header claims")
    parts = []
    for size in sizes:
        parts.append(view[at : at + size])
        at += size
    header = json.loads(bytes(parts[0]).decode("utf-8"))
    specs = header["specs"]
    if len(specs) != n - 1:
        raise ValueError(f"a packed message names {len(specs)} leaves but carries {n - 1}")
    leaves = []
    for spec, part in zip(specs, parts[1:]):
        kind = spec[0]
        if kind == "none":
            leaves.append(None)
        elif kind == "utf8":
            leaves.append(bytes(part).decode("utf-8"))
        elif kind == "bytes":
            leaves.append(bytes(part))
        elif kind == "array":
            shape, dtype = spec[1], np.dtype(spec[2])
            if math.prod(shape) * dtype.itemsize != len(part):
                raise ValueError(f"an array of shape {shape} and dtype {dtype} cannot hold {len(part)} bytes")
            leaves.append(np.frombuffer(part, dtype).reshape(shape))
        elif kind == "sharray":
            leaves.append(SharedArray(*spec[1:]))
        else:
            raise ValueError(f"a packed message has a leaf of unknown kind {kind!r}")
    return _unshape(header["tree"], iter(leaves))


def tree_equals(xs: Any, ys: Any) -> bool:
    """Whether two trees hold equal values (arrays: same shape, dtype and elements)."""
    if type(xs) is not type(ys):
        return False
    if isinstance(xs, (list, tuple)):
        return len(xs) == len(ys) and all(tree_equals(x, y) for x, y in zip(xs, ys))
    if isinstance(xs, dict):
        return xs.keys() == ys.keys() and all(tree_equals(xs[k], ys[k]) for k in xs)
    if isinstance(xs, np.ndarray):
        return xs.shape == ys.shape and xs.dtype == ys.dtype and bool((xs == ys).all())
    if isinstance(xs, SharedArray):
        return xs.name == ys.name and tree_equals(xs.array, ys.array)
    return bool(xs == ys)
