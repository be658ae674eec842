"""The versioned weight store: round trips, newer_than, torn reads, bad input, a writer
SIGKILLed mid-publish, close, and no segment left behind."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import pickle
import random
import signal
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmpad.errors import Closed, SegmentError, Timeout
from shmpad.shm.segment import Segment
from shmpad.weights import seqlock
from shmpad.weights.store import WeightStore, WeightStoreStatistics

try:
    import torch
except ImportError:  # the core's tests run without torch (pytest --core); the tests that use it are marked rl
    torch = None

FORK = mp.get_context("fork")
JOIN_TIMEOUT = 60.0

# Each array of a version is filled with the version number, so a torn read shows up as
# two different values. About 4 MB, so one copy takes long enough to be interrupted.
BIG = {
    "conv.weight": ((512, 1024), np.float32),  # 2 MB
    "fc.weight": ((256, 1024), np.float16),  # 0.5 MB
    "counts": ((160, 1024), np.int64),  # 1.25 MB
    "fc.bias": ((1024,), np.float64),
    "step": ((), np.int32),
}


def _big(value: int = 0) -> dict[str, np.ndarray]:
    return {k: np.full(shape, value, dtype) for k, (shape, dtype) in BIG.items()}


def _big_strided(value: int = 0) -> dict[str, np.ndarray]:
    """Like ``_big`` but every array with a last axis is a strided view: copies into it are
    several times slower, so its reader falls more than one publish behind the writer."""
    out = {}
    for k, (shape, dtype) in BIG.items():
        if shape:
            out[k] = np.full((*shape[:-1], 4 * shape[-1]), value, dtype)[..., ::4]
        else:
            out[k] = np.full(shape, value, dtype)
    return out


def _uniform_version(arrays: dict[str, np.ndarray]) -> set[int]:
    """The distinct values across all arrays (one value = one whole version)."""
    seen: set[int] = set()
    for a in arrays.values():
        seen.update({int(a.min()), int(a.max())})
    return seen


def _my_segments() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if f.startswith(f"shmpad.{os.getpid()}.")}


@pytest.fixture(autouse=True)
def no_segment_left():
    before = _my_segments()
    yield
    assert _my_segments() - before == set()


@pytest.fixture
def procs():
    """Processes a test starts; whatever is still alive at the end is killed and reaped."""
    started: list[mp.process.BaseProcess] = []
    yield started
    for p in started:
        if p.is_alive():
            p.kill()
        p.join(JOIN_TIMEOUT)


def _start(procs, target, *args) -> mp.process.BaseProcess:
    p = FORK.Process(target=target, args=args, daemon=True)
    p.start()
    procs.append(p)
    return p


# --- round trips -------------------------------------------------------------------------


@pytest.mark.rl
def test_round_trip_of_dtypes_and_shapes():
    rng = np.random.default_rng(0)
    values = {
        "f32": rng.standard_normal((4, 7)).astype(np.float32),
        "f16": rng.standard_normal(9).astype(np.float16),
        "i64": rng.integers(-(2**62), 2**62, (2, 3, 4)),
        "scalar": np.array(3.25),
        "flag": np.array([True, False, True]),
        "empty": np.zeros((0, 5), np.float32),
        "t": torch.randn(6, 2),
    }
    template = {k: np.zeros_like(v) if isinstance(v, np.ndarray) else torch.zeros_like(v) for k, v in values.items()}
    with WeightStore.create(template) as store:
        assert store.names == tuple(values)
        assert store.spec["scalar"] == (np.dtype(np.float64), ())
        assert store.publish(values) == 1

        into_numpy = {k: np.zeros(shape, dtype) for k, (dtype, shape) in store.spec.items()}
        assert store.pull(into_numpy) == 1
        into_torch = {k: torch.from_numpy(np.zeros(shape, dtype)) for k, (dtype, shape) in store.spec.items()}
        assert store.pull(into_torch) == 1
        version, fresh = store.pull_arrays()
        assert version == 1
        for k, v in values.items():
            expected = v.numpy() if isinstance(v, torch.Tensor) else v
            np.testing.assert_array_equal(into_numpy[k], expected)
            np.testing.assert_array_equal(into_torch[k].numpy(), expected)
            np.testing.assert_array_equal(fresh[k], expected)
        fresh["f32"][...] = 0  # fresh copies are the caller's, not views of the store
        np.testing.assert_array_equal(store.pull_arrays()[1]["f32"], values["f32"])


@pytest.mark.rl
def test_round_trip_of_a_module():
    torch.manual_seed(0)
    learner = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.BatchNorm1d(3))
    learner(torch.randn(4, 5))  # moves the BatchNorm running statistics off their defaults
    actor = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.BatchNorm1d(3))
    with WeightStore.create(learner) as store:
        assert store.pull(actor) == 0  # nothing published yet: nothing copied
        assert store.publish(learner) == 1
        assert store.pull(actor) == 1
        for (k, a), b in zip(actor.state_dict().items(), learner.state_dict().values()):
            assert torch.equal(a, b), k
        assert actor[0].weight.requires_grad  # copied in place, still the module's parameter


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([np.float32, np.float16, np.float64, np.int8, np.int64, np.uint16, np.bool_, np.complex64]),
            st.lists(st.integers(0, 5), max_size=3),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_round_trip_property(specs):
    rng = np.random.default_rng(len(specs))
    values = {f"t{i}": (rng.standard_normal(shape) * 100).astype(dtype) for i, (dtype, shape) in enumerate(specs)}
    with WeightStore.create(values) as store:
        store.publish(values)
        store.publish({k: v[...] for k, v in values.items()})  # the second buffer too
        version, got = store.pull_arrays()
        assert version == 2
        for k, v in values.items():
            np.testing.assert_array_equal(got[k], v)


def test_newer_than_returns_the_version_without_copying():
    with WeightStore.create({"w": np.zeros(4, np.float32)}) as store:
        dst = {"w": np.full(4, -1, np.float32)}
        assert store.pull(dst) == 0
        np.testing.assert_array_equal(dst["w"], -1)  # version 0: nothing copied

        store.publish({"w": np.full(4, 1, np.float32)})
        assert store.pull(dst, newer_than=0) == 1
        np.testing.assert_array_equal(dst["w"], 1)

        dst["w"][...] = -1
        assert store.pull(dst, newer_than=1) == 1
        assert store.pull(dst, newer_than=5) == 1
        np.testing.assert_array_equal(dst["w"], -1)
        assert store.pull_arrays(newer_than=1) == (1, None)

        store.publish({"w": np.full(4, 2, np.float32)})
        assert store.pull(dst, newer_than=1) == 2
        np.testing.assert_array_equal(dst["w"], 2)
        assert store.version == 2
        stats = store.statistics()
        assert stats == WeightStoreStatistics(
            publishes=2, pulls=2, retries=0, pinned_pulls=0, publish_waits=0, pins_broken=0
        )
        with pytest.raises(dataclasses.FrozenInstanceError):
            stats.pulls = 0


def test_pickle_attaches_by_name():
    with WeightStore.create({"w": np.zeros(3)}) as store:
        store.publish({"w": np.arange(3.0)})
        other = pickle.loads(pickle.dumps(store))
        assert other.name == store.name
        version, got = other.pull_arrays()
        assert version == 1
        np.testing.assert_array_equal(got["w"], [0, 1, 2])
        other.close()  # not the creator: closes only this handle
        with pytest.raises(Closed):
            other.pull_arrays()
        assert store.pull_arrays()[0] == 1


# --- concurrency ---------------------------------------------------------------------------


def _publish_versions(store: WeightStore, n: int, barrier) -> None:
    arrays = _big()
    barrier.wait(JOIN_TIMEOUT)
    for v in range(1, n + 1):
        for a in arrays.values():
            a.fill(v)
        if store.publish(arrays) != v:
            os._exit(3)


def _pull_until(store: WeightStore, n: int, barrier, results, strided: bool) -> None:
    dst = _big_strided(-1) if strided else _big(-1)
    barrier.wait(JOIN_TIMEOUT)
    last = pulls = 0
    problems = []
    while last < n:
        v = store.pull(dst)  # always copies: the hardest case for the seqlock
        if v == 0:
            continue  # nothing published yet, nothing copied
        pulls += 1
        seen = _uniform_version(dst)
        if v < last or seen != {v}:
            problems.append(f"pull returned {v} after {last} and saw values {sorted(seen)[:5]}")
        last = v
    results.put((pulls, store.statistics().retries, problems))


@pytest.mark.timeout(60)
def test_readers_never_see_a_torn_version_and_never_block_the_writer(procs):
    n = 400
    with WeightStore.create(_big()) as store:
        store.pull(_big())  # compile the kernels once, before forking
        barrier = FORK.Barrier(3)
        results = FORK.Queue()
        readers = [_start(procs, _pull_until, store, n, barrier, results, strided) for strided in (False, True)]
        writer = _start(procs, _publish_versions, store, n, barrier)
        writer.join(JOIN_TIMEOUT)
        assert writer.exitcode == 0  # all n publishes done while both readers hammered
        reports = [results.get(timeout=JOIN_TIMEOUT) for _ in readers]
        for r in readers:
            r.join(JOIN_TIMEOUT)
            assert r.exitcode == 0
        assert store.version == n
        for pulls, _, problems in reports:
            assert problems == []
            assert pulls >= 1


def _publish_forever(store: WeightStore) -> None:
    arrays = _big()
    v = store.version
    while True:
        v += 1
        for a in arrays.values():
            a.fill(v)
        store.publish(arrays)


def _pull_until_stopped(store: WeightStore, stop, results) -> None:
    dst = _big(-1)
    problems = []
    while not stop.is_set():
        v = store.pull(dst)
        if v > 0 and _uniform_version(dst) != {v}:
            problems.append(f"pull returned {v} and saw values {sorted(_uniform_version(dst))[:5]}")
    v = store.pull(dst)  # after the kill: must not hang, must be whole
    if _uniform_version(dst) != {v}:
        problems.append(f"final pull returned {v} and saw values {sorted(_uniform_version(dst))[:5]}")
    results.put((v, problems))


def _copy_under_way(store: WeightStore) -> bool:
    """True while some buffer's SEQ is odd: a publish is copying (or died copying)."""
    states = (int(store._words[seqlock._line(store._ctl, b)]) for b in range(seqlock.BUFFERS))
    return any((state >> seqlock._PIN_BITS) & 1 for state in states)


@pytest.mark.timeout(60)
def test_writer_killed_mid_publish_leaves_the_last_complete_version(procs):
    rng = random.Random(os.getpid())
    killed_mid_copy = 0
    with WeightStore.create(_big()) as store:
        store.pull(_big())  # compile the kernels once, before forking
        for _ in range(5):
            stop = FORK.Event()
            results = FORK.Queue()
            readers = [_start(procs, _pull_until_stopped, store, stop, results) for _ in range(2)]
            writer = _start(procs, _publish_forever, store)
            # A random moment: some publishes in, then the next time a copy is under way.
            store.wait_for_version(store.version + rng.randint(1, 20), timeout=JOIN_TIMEOUT)
            deadline = time.monotonic() + JOIN_TIMEOUT
            while not _copy_under_way(store):
                assert time.monotonic() < deadline, "the writer never started a copy"
            os.kill(writer.pid, signal.SIGKILL)
            writer.join(JOIN_TIMEOUT)
            assert writer.exitcode == -signal.SIGKILL
            killed_mid_copy += _copy_under_way(store)
            last = store.version

            stop.set()
            for v, problems in (results.get(timeout=JOIN_TIMEOUT) for _ in readers):
                assert problems == []
                assert v == last
            for r in readers:
                r.join(JOIN_TIMEOUT)
                assert r.exitcode == 0
            version, got = store.pull_arrays()
            assert version == last
            assert _uniform_version(got) == {last}
            if killed_mid_copy:
                break
        assert killed_mid_copy, "no kill landed inside a copy in 5 tries"

        # A new writer takes over past the odd SEQ the dead one left.
        assert store.publish(_big(last + 1)) == last + 1
        version, got = store.pull_arrays()
        assert version == last + 1
        assert _uniform_version(got) == {last + 1}


def _publish_one(store: WeightStore) -> None:
    store.publish({"w": np.ones(2)})


def test_wait_for_version_wakes_on_publish_and_times_out(procs):
    with WeightStore.create({"w": np.zeros(2)}) as store:
        store.version  # compile the kernels once, before forking
        with pytest.raises(Timeout, match=r"^no version newer than 0 was published within 0\.05 s$"):
            store.wait_for_version(0, timeout=0.05)
        writer = _start(procs, _publish_one, store)
        assert store.wait_for_version(0, timeout=JOIN_TIMEOUT) == 1
        writer.join(JOIN_TIMEOUT)
        assert writer.exitcode == 0
        assert store.wait_for_version(-7, timeout=0) == 1


def _wait_expecting_closed(store: WeightStore, waiting) -> None:
    waiting.set()
    try:
        store.wait_for_version(0, timeout=JOIN_TIMEOUT)
    except Closed:
        os._exit(0)
    os._exit(1)


def test_close_wakes_waiters_and_unlinks(procs):
    store = WeightStore.create({"w": np.zeros(2)})
    store.version  # compile the kernels once, before forking
    waiting = FORK.Event()
    waiter = _start(procs, _wait_expecting_closed, store, waiting)
    assert waiting.wait(JOIN_TIMEOUT)
    name = store.name
    store.close()
    store.close()  # idempotent
    waiter.join(JOIN_TIMEOUT)
    assert waiter.exitcode == 0
    for use in (
        lambda: store.publish({"w": np.zeros(2)}),
        lambda: store.pull({"w": np.zeros(2)}),
        lambda: store.pull_arrays(),
        lambda: store.wait_for_version(0, timeout=1),
        lambda: store.version,
        lambda: pickle.dumps(store),
    ):
        with pytest.raises(Closed, match=r"^the weight store was closed$"):
            use()
    with pytest.raises(SegmentError, match="no shared-memory segment named"):
        WeightStore.attach(name)


def test_closed_by_the_creator_is_closed_for_attached_handles():
    store = WeightStore.create({"w": np.zeros(2)})
    other = WeightStore.attach(store.name)
    store.close()
    with pytest.raises(Closed):
        other.pull_arrays()
    with pytest.raises(Closed):
        other.publish({"w": np.zeros(2)})


# --- bad input -----------------------------------------------------------------------------


@pytest.fixture
def small():
    with WeightStore.create({"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}) as store:
        yield store


def test_publish_rejects_an_unknown_tensor(small):
    with pytest.raises(ValueError, match=r"^unknown tensor 'nope': this weight store holds 'w', 'b'$"):
        small.publish({"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32), "nope": np.zeros(1)})


def test_publish_rejects_a_missing_tensor(small):
    with pytest.raises(ValueError, match=r"^missing tensor 'b': every tensor of the store is needed \(1 missing\)$"):
        small.publish({"w": np.zeros((2, 3), np.float32)})


def test_publish_rejects_a_wrong_shape(small):
    with pytest.raises(ValueError, match=r"^tensor 'w' has shape \(3, 2\), expected \(2, 3\)$"):
        small.publish({"w": np.zeros((3, 2), np.float32), "b": np.zeros(3, np.float32)})


def test_publish_rejects_a_wrong_dtype(small):
    with pytest.raises(TypeError, match=r"^tensor 'b' has dtype float64, expected float32$"):
        small.publish({"w": np.zeros((2, 3), np.float32), "b": np.zeros(3)})
    with pytest.raises(TypeError, match=r"^tensor 'w' must be a numpy array or a torch tensor, got list$"):
        small.publish({"w": [[0.0] * 3] * 2, "b": np.zeros(3, np.float32)})
    message = r"^publish takes a dict of numpy arrays or torch tensors, or a torch nn\.Module, got list$"
    with pytest.raises(TypeError, match=message):
        small.publish([np.zeros((2, 3), np.float32)])
    assert small.version == 0  # nothing half-published


@pytest.mark.rl
def test_pull_rejects_wrong_destinations(small):
    small.publish({"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match=r"^tensor 'w' has shape \(6,\), expected \(2, 3\)$"):
        small.pull({"w": torch.zeros(6), "b": torch.zeros(3)})
    with pytest.raises(TypeError, match=r"^tensor 'w' has dtype torch\.float64, expected torch\.float32$"):
        small.pull({"w": torch.zeros(2, 3, dtype=torch.float64), "b": torch.zeros(3)})
    readonly = np.zeros(3, np.float32)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match=r"^tensor 'b' of the pull destination is read-only$"):
        small.pull({"w": np.zeros((2, 3), np.float32), "b": readonly})


@pytest.mark.rl
def test_create_rejects_bad_templates():
    with pytest.raises(ValueError, match=r"^a weight store needs at least one tensor, got an empty template$"):
        WeightStore.create({})
    with pytest.raises(TypeError, match=r"^tensor 'w' has dtype torch\.bfloat16, which numpy cannot hold; cast it"):
        WeightStore.create({"w": torch.zeros(2, dtype=torch.bfloat16)})
    message = r"^tensor 's' has dtype <U3; allowed: bool, integer, float and complex dtypes$"
    with pytest.raises(TypeError, match=message):
        WeightStore.create({"s": np.array(["abc"])})
    with pytest.raises(TypeError, match=r"^tensor names must be str, got 0 \(int\)$"):
        WeightStore.create({0: np.zeros(1)})


def test_attach_to_a_missing_name():
    with pytest.raises(SegmentError, match=r"^no shared-memory segment named '/shmpad\.missing'$"):
        WeightStore.attach("shmpad.missing")


def test_attach_to_another_kind():
    seg = Segment.create("spsc", {"capacity": 4}, 64)
    try:
        with pytest.raises(SegmentError, match=r"holds a 'spsc', not a 'weights'$"):
            WeightStore.attach(seg.name)
    finally:
        seg.unlink()


def test_attach_checks_the_layout():
    tensor = {"name": "w", "dtype": "<f4", "shape": [4096], "offset": 0, "nbytes": 16384}
    shifted = {"buffer_bytes": 16384, "tensors": [{**tensor, "offset": 64}]}
    cases = [
        (shifted, 448 + 3 * 16384, "its metadata offsets do not match its tensors"),
        (
            {"buffer_bytes": 16384, "tensors": [tensor]},
            4096,
            r"its metadata needs 49600 data bytes, the segment has 4096",
        ),
        ({"tensors": [tensor]}, 4096, r"has unreadable metadata: KeyError\('buffer_bytes'\)"),
    ]
    for meta, data_bytes, message in cases:
        seg = Segment.create("weights", meta, data_bytes)
        try:
            with pytest.raises(SegmentError, match=message):
                WeightStore.attach(seg.name)
        finally:
            seg.unlink()


def test_pulls_by_all_counts_the_copies_of_every_handle():
    store = WeightStore.create({"w": np.zeros(3, np.float32)})
    other = WeightStore.attach(store.name)
    try:
        out = {"w": np.zeros(3, np.float32)}
        assert store.pulls_by_all == 0
        assert store.publish({"w": np.ones(3, np.float32)}) == 1
        assert other.pull(out) == 1 and store.pull(out) == 1
        assert other.pull(out, newer_than=1) == 1  # nothing newer: nothing copied, not counted
        assert store.pulls_by_all == other.pulls_by_all == 2
        assert (store.statistics().pulls, other.statistics().pulls) == (1, 1)  # a handle counts its own
    finally:
        other.close()
        store.close()
