"""Area-averaging downscale of grayscale frames (OpenCV's ``INTER_AREA``), in numba.

Each output pixel is the mean of the input image over the output pixel's footprint,
input pixels counted by how much of them the footprint covers; this is what
``cv2.resize(..., interpolation=cv2.INTER_AREA)`` computes when it shrinks an image,
and what gymnasium's ``AtariPreprocessing`` uses. shmpad computes it exactly, in
integers, so the result does not depend on summation order:

along an axis of ``n_in`` input and ``n_out`` output pixels, measure positions in
units of ``1 / n_out`` input pixels; output pixel ``k`` covers ``[k * n_in, (k + 1) * n_in)``
and input pixel ``j`` covers ``[j * n_out, (j + 1) * n_out)``. Their overlap is an
integer weight, the weights of one output pixel sum to ``n_in``, and

    out[y, x] = round(sum_i sum_j wy[y, i] * wx[x, j] * src[i, j] / (h_in * w_in))

rounded half to even (as ``cvRound`` does). OpenCV evaluates the same sum in
float32, so it can differ from this by one grey level where the exact value is a tie.
Only shrinking is supported (OpenCV's ``INTER_AREA`` switches to bilinear to enlarge).

``AreaResize(in_shape, out_shape)`` holds the weight tables; its kernels write into
an output the caller owns, typically a frame plane in a shared-memory slot.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["AreaResize", "axis_weights"]


def axis_weights(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Integer area weights of one axis: ``(first, weights)`` where output pixel ``k``
    takes input pixels ``first[k] + t`` with weight ``weights[k, t]`` (units of ``1 / n_out``
    input pixels; each row sums to ``n_in``)."""
    if not 1 <= n_out <= n_in:
        raise ValueError(
            f"area resize only shrinks: output size must be between 1 and the input size {n_in}, got {n_out}"
        )
    taps = -(-n_in // n_out) + 1
    first = np.empty(n_out, np.int64)
    weights = np.zeros((n_out, taps), np.int32)
    for k in range(n_out):
        lo, hi = k * n_in, (k + 1) * n_in
        j0 = lo // n_out
        first[k] = j0
        for t in range(taps):
            j = j0 + t
            overlap = min(hi, (j + 1) * n_out) - max(lo, j * n_out)
            if overlap > 0 and j < n_in:
                weights[k, t] = overlap
    return first, weights


@njit(nogil=True, cache=True)
def _resize_rows(a, b, use_b, out, y_first, y_w, x_first, x_wt, col, acc):
    """``out = area_resize(max(a, b) if use_b else a)``.

    ``x_wt`` holds the horizontal weights transposed ([taps, w_out]) so that the
    horizontal pass runs along x; ``col`` (int32, the input width plus the taps, its
    padding kept 0) and ``acc`` (int32, the output width) are scratch. Every sum is
    below 255 * h_in * w_in, which ``AreaResize`` checks fits in int32."""
    h_out, w_out = out.shape
    h_in, w_in = a.shape
    den = h_in * w_in
    inv_den = 1.0 / den
    for y in range(h_out):
        col[:] = 0
        for t in range(y_w.shape[1]):
            wy = y_w[y, t]
            i = y_first[y] + t
            if use_b:
                for j in range(w_in):
                    col[j] += wy * np.int32(max(a[i, j], b[i, j]))
            else:
                for j in range(w_in):
                    col[j] += wy * np.int32(a[i, j])
        acc[:] = 0
        for t in range(x_wt.shape[0]):
            for x in range(w_out):
                acc[x] += x_wt[t, x] * col[x_first[x] + t]
        for x in range(w_out):
            # Round acc / den half to even: a float estimate, made exact by the remainder.
            v = acc[x]
            q = np.int32(v * inv_den + 0.5)
            r2 = 2 * v - (2 * q - 1) * den  # 2 * (v - (q - 0.5) * den); in [0, 2 * den) when q is right
            q += (r2 >= 2 * den) - (r2 < 0)
            r2 = 2 * v - (2 * q - 1) * den
            q -= (r2 == 0) & (q & 1)  # an exact tie at q - 0.5 goes to the even neighbour
            out[y, x] = q


@njit(nogil=True, cache=True)
def _push_frame(stack, a, b, use_b, y_first, y_w, x_first, x_wt, col, acc):
    """Shift the frame stack ``[K, H, W]`` one frame older and resize into its last plane."""
    k = stack.shape[0]
    for f in range(k - 1):
        stack[f, :, :] = stack[f + 1, :, :]
    _resize_rows(a, b, use_b, stack[k - 1], y_first, y_w, x_first, x_wt, col, acc)


@njit(nogil=True, cache=True)
def _fill_frame(stack, a, y_first, y_w, x_first, x_wt, col, acc):
    """Resize ``a`` into every plane of the frame stack (the first frame of an episode)."""
    _resize_rows(a, a, False, stack[0], y_first, y_w, x_first, x_wt, col, acc)
    for f in range(1, stack.shape[0]):
        stack[f, :, :] = stack[0, :, :]


class AreaResize:
    """Exact area-averaging resize from ``in_shape`` (H, W) to ``out_shape`` (H, W), uint8."""

    def __init__(self, in_shape: tuple[int, int], out_shape: tuple[int, int]):
        (h_in, w_in), (h_out, w_out) = in_shape, out_shape
        if 255 * h_in * w_in >= 2**31:
            raise ValueError(f"area resize takes images of at most {(2**31 - 1) // 255} pixels, got {h_in}x{w_in}")
        self.in_shape = (int(h_in), int(w_in))
        self.out_shape = (int(h_out), int(w_out))
        self._y = axis_weights(h_in, h_out)
        x_first, x_w = axis_weights(w_in, w_out)
        self._x = (x_first, np.ascontiguousarray(x_w.T))
        # Padded: the last taps of a row may point past its end, with weight 0.
        self._scratch = (np.zeros(w_in + x_w.shape[1], np.int32), np.zeros(w_out, np.int32))

    def __call__(self, src: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The resized ``src``, written into ``out`` when given."""
        self._check(src, "src")
        if out is None:
            out = np.empty(self.out_shape, np.uint8)
        elif out.shape != self.out_shape or out.dtype != np.uint8:
            raise ValueError(f"out must be a uint8 array of shape {self.out_shape}, got {out.dtype} {out.shape}")
        _resize_rows(src, src, False, out, *self._y, *self._x, *self._scratch)
        return out

    def push_max(self, stack: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        """Shift ``stack`` ([K, H_out, W_out]) one frame older and write
        ``resize(max(a, b))`` as its newest frame (frame-skip max pooling)."""
        _push_frame(stack, a, b, True, *self._y, *self._x, *self._scratch)

    def fill(self, stack: np.ndarray, a: np.ndarray) -> None:
        """Write ``resize(a)`` into every frame of ``stack`` (an episode's first observation)."""
        _fill_frame(stack, a, *self._y, *self._x, *self._scratch)

    def _check(self, src: np.ndarray, what: str) -> None:
        if not isinstance(src, np.ndarray):
            raise TypeError(f"{what} must be a numpy array, got {type(src).__name__}")
        if src.shape != self.in_shape or src.dtype != np.uint8:
            raise ValueError(f"{what} must be a uint8 array of shape {self.in_shape}, got {src.dtype} {src.shape}")
