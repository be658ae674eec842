"""The area-resize kernel against a slow reference written from the definition.

The reference integrates the piecewise-constant input image over each output
pixel's footprint with exact rationals and rounds half to even, which is what
OpenCV's INTER_AREA computes when it shrinks (in float32 there, exact here).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.envs.resize import AreaResize, axis_weights


def reference_area_resize(src: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """Mean of ``src`` over each output pixel's footprint, rounded half to even."""
    h, w = src.shape
    sy, sx = Fraction(h, out_h), Fraction(w, out_w)
    out = np.empty((out_h, out_w), np.uint8)
    for y in range(out_h):
        y0, y1 = y * sy, (y + 1) * sy
        rows = [(i, min(y1, i + 1) - max(y0, i)) for i in range(int(y0), min(h, int(np.ceil(y1))))]
        for x in range(out_w):
            x0, x1 = x * sx, (x + 1) * sx
            cols = [(j, min(x1, j + 1) - max(x0, j)) for j in range(int(x0), min(w, int(np.ceil(x1))))]
            total = sum(wy * wx * int(src[i, j]) for i, wy in rows for j, wx in cols)
            out[y, x] = round(total / (sy * sx))  # Fraction.__round__ rounds half to even
    return out


def dense_area_resize(src: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """The same definition as dense integer matrices (fast enough to use per frame):
    ``m[k, j]`` is the overlap of output pixel k with input pixel j in units of 1/out."""

    def overlaps(n_in: int, n_out: int) -> np.ndarray:
        k = np.arange(n_out)[:, None]
        j = np.arange(n_in)[None, :]
        return np.clip(np.minimum((k + 1) * n_in, (j + 1) * n_out) - np.maximum(k * n_in, j * n_out), 0, None)

    h, w = src.shape
    num = overlaps(h, out_h) @ src.astype(np.int64) @ overlaps(w, out_w).T
    den = h * w
    q, r = np.divmod(num, den)
    return (q + ((2 * r > den) | ((2 * r == den) & (q % 2 == 1)))).astype(np.uint8)


def test_dense_reference_agrees_with_the_exact_one():
    rng = np.random.default_rng(11)
    for shape, out in [((210, 160), (84, 84)), ((7, 5), (3, 2)), ((9, 9), (2, 4))]:
        src = rng.choice(np.array([0, 1, 2, 255], np.uint8), size=shape)
        assert np.array_equal(dense_area_resize(src, *out), reference_area_resize(src, *out))


def test_atari_frame_matches_reference():
    src = np.random.default_rng(7).integers(0, 256, (210, 160), dtype=np.uint8)
    assert np.array_equal(AreaResize((210, 160), (84, 84))(src), reference_area_resize(src, 84, 84))


@settings(max_examples=60, deadline=None)
@given(
    h=st.integers(1, 23),
    w=st.integers(1, 23),
    data=st.data(),
)
def test_any_shrink_matches_reference(h, w, data):
    out_h = data.draw(st.integers(1, h))
    out_w = data.draw(st.integers(1, w))
    seed = data.draw(st.integers(0, 2**32 - 1))
    # Few grey levels make exact ties (x.5 means) common, so the rounding is exercised.
    src = np.random.default_rng(seed).choice(np.array([0, 1, 2, 3, 254, 255], np.uint8), size=(h, w))
    assert np.array_equal(AreaResize((h, w), (out_h, out_w))(src), reference_area_resize(src, out_h, out_w))


def test_ties_round_half_to_even():
    # 2x1 -> 1x1: the mean of 1 and 2 is 1.5 -> 2, of 2 and 3 is 2.5 -> 2.
    r = AreaResize((2, 1), (1, 1))
    assert r(np.array([[1], [2]], np.uint8))[0, 0] == 2
    assert r(np.array([[2], [3]], np.uint8))[0, 0] == 2
    assert r(np.array([[255], [254]], np.uint8))[0, 0] == 254


def test_integer_factor_is_a_block_mean():
    src = np.random.default_rng(1).integers(0, 256, (8, 12), dtype=np.uint8)
    blocks = src.reshape(4, 2, 4, 3).astype(np.float64).mean(axis=(1, 3))
    assert np.array_equal(AreaResize((8, 12), (4, 4))(src), np.round(blocks).astype(np.uint8))  # np.round: half to even


def test_axis_weights_cover_the_input_once():
    first, weights = axis_weights(210, 84)
    assert (weights.sum(axis=1) == 210).all()
    cover = np.zeros(210, np.int64)
    for k in range(84):
        for t, wt in enumerate(weights[k]):
            if wt:
                cover[first[k] + t] += wt
    assert (cover == 84).all()  # every input pixel is spread over exactly one pixel's worth of outputs


def test_push_max_and_fill():
    rng = np.random.default_rng(3)
    r = AreaResize((210, 160), (84, 84))
    a, b, c = (rng.integers(0, 256, (210, 160), dtype=np.uint8) for _ in range(3))
    stack = np.zeros((4, 84, 84), np.uint8)
    r.fill(stack, a)
    assert all(np.array_equal(stack[k], reference_area_resize(a, 84, 84)) for k in range(4))
    before = stack.copy()
    r.push_max(stack, b, c)
    assert np.array_equal(stack[:3], before[1:])
    assert np.array_equal(stack[3], reference_area_resize(np.maximum(b, c), 84, 84))


def test_bad_arguments():
    with pytest.raises(
        ValueError, match=r"area resize only shrinks: output size must be between 1 and the input size 10, got 11"
    ):
        AreaResize((10, 10), (11, 5))
    r = AreaResize((10, 10), (5, 5))
    with pytest.raises(ValueError, match=r"src must be a uint8 array of shape \(10, 10\), got float32 \(10, 10\)"):
        r(np.zeros((10, 10), np.float32))
    with pytest.raises(TypeError, match="src must be a numpy array, got list"):
        r([[0] * 10] * 10)
