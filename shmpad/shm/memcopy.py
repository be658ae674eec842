"""``copy_bytes``: memcpy between byte buffers inside numba code.

numba cannot slice-assign from a ``bytes`` object and an element loop does not
always become a ``memcpy``; this intrinsic emits ``llvm.memcpy`` directly. Sources
and destinations are 1-D buffers of single bytes: uint8 arrays, ``bytes``,
``bytearray``, read-only or writable. Bounds are the caller's job.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["copy_bytes"]

_I8P = ir.IntType(8).as_pointer()


def _byte_buffer(ty) -> bool:
    return isinstance(ty, types.Buffer) and ty.ndim == 1 and ty.dtype in (types.uint8, types.int8, types.byte)


@intrinsic
def copy_bytes(typingctx, dst, dst_off, src, src_off, n):
    """Copy ``n`` bytes from ``src[src_off:]`` to ``dst[dst_off:]`` (no bounds check)."""
    if not _byte_buffer(dst) or not _byte_buffer(src):
        raise TypeError(f"copy_bytes takes 1-D byte buffers, got {dst} and {src}")

    def codegen(context, builder, sig, args):
        d = context.make_array(sig.args[0])(context, builder, args[0])
        s = context.make_array(sig.args[2])(context, builder, args[2])
        doff = context.cast(builder, args[1], sig.args[1], types.intp)
        soff = context.cast(builder, args[3], sig.args[3], types.intp)
        count = context.cast(builder, args[4], sig.args[4], types.intp)
        dptr = builder.gep(builder.bitcast(d.data, _I8P), [doff])
        sptr = builder.gep(builder.bitcast(s.data, _I8P), [soff])
        cgutils.raw_memcpy(builder, dptr, sptr, count, 1)
        return context.get_dummy_value()

    return types.void(dst, dst_off, src, src_off, n), codegen
