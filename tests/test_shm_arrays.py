"""shmpad.shm.arrays: named arrays placed on cache lines of their own, and the one bounds
check that maps them back (rings, replay tables, the env pool and the weight store use it)."""

from __future__ import annotations

import numpy as np
import pytest

from shmpad.errors import SegmentError
from shmpad.shm import arrays
from shmpad.shm.segment import CACHE_LINE


def _slow_place(sizes: list[int], start: int) -> list[int]:
    """The placement rule written out: each block at the first cache line at or after the end of the one before."""
    out, at = [], start
    for n in sizes:
        out.append(at)
        at = at + n
        while at % CACHE_LINE:
            at += 1
    return out + [at]


@pytest.mark.parametrize("sizes", [[1], [0, 0], [64, 1, 63, 65], [8 * 40, 4096, 3, 128]])
@pytest.mark.parametrize("start", [0, 64, 3 * 64])
def test_place_puts_each_block_on_lines_of_its_own(sizes, start):
    offsets, end = arrays.place([(f"b{i}", n) for i, n in enumerate(sizes)], start)
    assert [offsets[f"b{i}"] for i in range(len(sizes))] + [end] == _slow_place(sizes, start)


def test_field_entries_record_what_map_fields_maps_back():
    fields = arrays.fields_of({"obs": (np.uint8, (4, 5)), "reward": (np.float32, ()), "done": ("u1", 1)})
    entries, end = arrays.field_entries(fields, 3, start=CACHE_LINE)
    assert entries == [
        ["obs", "|u1", [4, 5], 64],
        ["reward", "<f4", [], 128],
        ["done", "|u1", [1], 192],
    ]
    assert end == 256
    data = np.zeros(end, np.uint8)
    mapped = arrays.map_fields(data, entries, 3, "test segment")
    assert {f: (a.shape, a.dtype) for f, a in mapped.items()} == {
        "obs": ((3, 4, 5), np.dtype(np.uint8)),
        "reward": ((3,), np.dtype(np.float32)),
        "done": ((3, 1), np.dtype(np.uint8)),
    }
    mapped["reward"][2] = 1.5  # a view of the data area, not a copy
    assert data[128 + 8 : 128 + 12].view(np.float32)[0] == 1.5


def test_a_field_past_the_data_area_is_a_segment_error_naming_it():
    entries, end = arrays.field_entries(arrays.fields_of({"a": (np.int64, (2,)), "b": (np.int64, (2,))}), 4)
    with pytest.raises(
        SegmentError, match=r"test segment: field 'b' is damaged: it ends at byte 128, the data area has 127 bytes"
    ):
        arrays.map_fields(np.zeros(end - 1, np.uint8), entries, 4, "test segment")


def test_array_at_refuses_a_negative_offset():
    with pytest.raises(SegmentError, match="is damaged"):
        arrays.array_at(np.zeros(64, np.uint8), -8, np.int64, (1,), "x")


@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        ([("a", (np.uint8, ()))], TypeError, "spec must be a dict"),
        ({}, ValueError, "at least one field"),
        ({"": (np.uint8, ())}, TypeError, "non-empty str"),
        ({"a": np.uint8}, TypeError, r"must be \(dtype, shape\)"),
        ({"a": (object, ())}, TypeError, "fixed-size numeric"),
        ({"a": (np.uint8, (-1,))}, ValueError, "non-negative ints"),
    ],
)
def test_fields_of_names_what_is_wrong_with_a_spec(spec, error, match):
    with pytest.raises(error, match=match):
        arrays.fields_of(spec)
