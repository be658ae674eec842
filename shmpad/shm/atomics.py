"""Atomic operations on 8-byte words in shared memory, for numba-compiled code.

numba has no atomics and no volatile loads: a plain load of a shared word inside a
compiled loop may be hoisted out of the loop and the loop then spins forever. Every
shared control word in shmpad is therefore read and written only through the
intrinsics below, which emit LLVM atomic instructions directly.

All operations take a 1-D ``int64`` array (usually the whole segment viewed as
words) and an element index. The word must be 8-byte aligned, which holds for any
element of an int64 array over an mmap.

Only callable from ``@njit`` code; calling them from the interpreter raises
``NotImplementedError``.
"""

from __future__ import annotations

import platform

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = [
    "load_acquire",
    "load_relaxed",
    "store_release",
    "store_relaxed",
    "cas",
    "fetch_add",
    "fence_seq_cst",
    "fence_acquire",
    "fence_release",
    "cpu_pause",
    "word_address",
]

_I64 = ir.IntType(64)
_IS_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


def _check(arr, idx) -> None:
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64 and arr.ndim == 1):
        raise TypeError(f"atomic word array must be a 1-D int64 array, got {arr}")
    if not isinstance(idx, types.Integer):
        raise TypeError(f"atomic word index must be an integer, got {idx}")


def _check_value(val) -> None:
    if not isinstance(val, (types.Integer, types.Boolean)):
        raise TypeError(f"atomic word value must be an integer, got {val}")


def _pointer(context, builder, sig, args):
    arrty = sig.args[0]
    ary = context.make_array(arrty)(context, builder, args[0])
    idx = context.cast(builder, args[1], sig.args[1], types.intp)
    return cgutils.get_item_pointer(context, builder, arrty, ary, [idx], wraparound=False)


def _value(context, builder, sig, args, pos):
    return context.cast(builder, args[pos], sig.args[pos], types.int64)


def _load(ordering: str, doc: str):
    @intrinsic
    def load(typingctx, arr, idx):
        _check(arr, idx)

        def codegen(context, builder, sig, args):
            return builder.load_atomic(_pointer(context, builder, sig, args), ordering, 8)

        return types.int64(arr, idx), codegen

    load.__doc__ = doc
    return load


def _store(ordering: str, doc: str):
    @intrinsic
    def store(typingctx, arr, idx, val):
        _check(arr, idx)
        _check_value(val)

        def codegen(context, builder, sig, args):
            ptr = _pointer(context, builder, sig, args)
            builder.store_atomic(_value(context, builder, sig, args, 2), ptr, ordering, 8)
            return context.get_dummy_value()

        return types.void(arr, idx, val), codegen

    store.__doc__ = doc
    return store


load_acquire = _load("acquire", "``arr[idx]`` with acquire ordering: later loads and stores stay after it.")
load_relaxed = _load("monotonic", "``arr[idx]`` as one untorn atomic load with no ordering (never hoisted).")
store_release = _store("release", "``arr[idx] = val`` with release ordering: earlier loads and stores stay before it.")
store_relaxed = _store("monotonic", "``arr[idx] = val`` as one untorn atomic store with no ordering.")


@intrinsic
def cas(typingctx, arr, idx, expected, new):
    """Compare-and-swap ``arr[idx]`` from ``expected`` to ``new`` (acq_rel on success,
    acquire on failure). Returns the old value; the swap happened iff it equals ``expected``."""
    _check(arr, idx)
    _check_value(expected)
    _check_value(new)

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig, args)
        exp = _value(context, builder, sig, args, 2)
        new_ = _value(context, builder, sig, args, 3)
        res = builder.cmpxchg(ptr, exp, new_, "acq_rel", "acquire")
        return builder.extract_value(res, 0)

    return types.int64(arr, idx, expected, new), codegen


@intrinsic
def fetch_add(typingctx, arr, idx, val):
    """Atomically add ``val`` to ``arr[idx]`` (sequentially consistent); returns the old value."""
    _check(arr, idx)
    _check_value(val)

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig, args)
        return builder.atomic_rmw("add", ptr, _value(context, builder, sig, args, 2), "seq_cst")

    return types.int64(arr, idx, val), codegen


def _fence(ordering: str):
    @intrinsic
    def fence(typingctx):
        def codegen(context, builder, sig, args):
            builder.fence(ordering)
            return context.get_dummy_value()

        return types.void(), codegen

    return fence


fence_seq_cst = _fence("seq_cst")
fence_seq_cst.__doc__ = "Full barrier: orders earlier stores before later loads (Dekker handshakes)."
fence_acquire = _fence("acquire")
fence_acquire.__doc__ = "Earlier loads complete before any later load or store."
fence_release = _fence("release")
fence_release.__doc__ = "Earlier loads and stores complete before any later store."


@intrinsic
def cpu_pause(typingctx):
    """A spin-wait hint to the CPU (``pause`` on x86; nothing elsewhere)."""

    def codegen(context, builder, sig, args):
        if _IS_X86:
            fnty = ir.FunctionType(ir.VoidType(), [])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def word_address(typingctx, arr, idx):
    """The address of ``arr[idx]`` as an integer (for futex system calls)."""
    _check(arr, idx)

    def codegen(context, builder, sig, args):
        return builder.ptrtoint(_pointer(context, builder, sig, args), _I64)

    return types.int64(arr, idx), codegen
