"""The learner's speed paths on the CPU: the double-buffered stager (run with plain
buffers on the CPU, pinned on a GPU) gives the same update as the slots' own time-major
views and frees the slots before the update; weights are published every
``publish_every`` updates; bf16 autocast gives gradients close to fp32's; a compiled
loss gives the same loss as eager; the plan fills the cores it is given."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest
import torch

from bench.impala.plan import make_plan
from learners import make_model
from learners.learner import Learner, LearnerConfig
from learners.staging import HISTORY, BatchStager, WeightPublisher
from shmpad import WouldBlock
from shmpad.ringbuf import TypedRing
from shmpad.weights import WeightStore
from tests.test_learners_learner import OBS, A, B, T, _fill, _spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def ring(shm_leak_check):
    r = TypedRing.create(_spec(), capacity=4 * B)
    yield r
    r.close()


def _learner(ring, weights=None, model="mlp", obs=OBS, **kw) -> Learner:
    torch.manual_seed(0)
    return Learner(make_model(model, obs, A), ring, LearnerConfig(batch_size=B, **kw), weights)


def test_staged_update_equals_the_in_place_update(ring):
    plain, staged = _learner(ring), _learner(ring)
    for seed in range(3):  # both buffers, then the first again
        _fill(ring, B, seed)
        views = ring.get_batch(B, timeout=5, torch=True)  # [B, T+1, ...]
        try:
            a = plain.update({k: v.transpose(0, 1) for k, v in views.items()})  # the slots in place
        finally:
            ring.release()
        _fill(ring, B, seed)
        b = staged.step(timeout=5)
        assert torch.equal(a.total, b.total)
    for p, q in zip(plain.model.parameters(), staged.model.parameters()):
        assert torch.equal(p, q)
    assert staged.stager.batches == 3
    assert (staged.statistics().episodes, staged.statistics().frames) == (3 * B, 3 * B * T)


def test_the_slots_go_back_to_the_ring_before_the_update(ring):
    learner = _learner(ring)
    update, free = learner._update, []

    def update_counting_free_slots(batch):
        n = 0
        with pytest.raises(WouldBlock):
            while n <= 4 * B:  # every slot, the batch's too, can be written while the update runs
                ring.reserve_nowait()
                ring.commit()
                n += 1
        free.append(n)
        return update(batch)

    learner._update = update_counting_free_slots
    _fill(ring, B, 0)
    learner.step(timeout=5)
    assert free == [4 * B] and learner.statistics().steps == 1
    ring.get_batch(4 * B, timeout=5)
    ring.release()


def test_the_stager_copies_so_the_slots_can_be_reused_at_once(ring):
    stager = BatchStager("cpu")
    _fill(ring, B, 0)
    batch = ring.get_batch(B, timeout=5, torch=True)
    i = stager.stage(batch)
    expected = {k: v.clone() for k, v in batch.items()}
    ring.release()
    _fill(ring, B, 1)  # overwrites the slots the batch came from
    got = stager.to_device(i)
    for k in expected:
        assert got[k].is_contiguous(), k
        assert torch.equal(got[k], expected[k].transpose(0, 1)), k  # time-major
    ring.get_batch(B, timeout=5)
    ring.release()


@pytest.mark.parametrize("every", [1, 3])
def test_weights_are_published_every_n_updates(ring, every):
    store = WeightStore.create(make_model("mlp", OBS, A))
    try:
        learner = _learner(ring, store, publish_every=every)
        assert store.version == 1
        for step in range(1, 7):
            _fill(ring, B, step)
            learner.step(timeout=5)
            assert store.version == 1 + step // every
        pulled = make_model("mlp", OBS, A)
        store.pull(pulled)
        for a, b in zip(pulled.parameters(), learner.model.parameters()):
            assert torch.equal(a, b)  # 6 is a multiple of both: the store holds the latest
    finally:
        store.close()


def test_publish_every_is_checked(ring):
    with pytest.raises(ValueError, match="publish_every must be an int >= 1, got 0"):
        LearnerConfig(publish_every=0).check()
    with pytest.raises(ValueError, match=r"publish_every must be an int >= 1 \(updates between publishes\), got 2.5"):
        WeightPublisher(make_model("mlp", OBS, A), None, 2.5)


def _pixel_batch(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randint(0, 255, (T + 1, B, 4, 84, 84), generator=g, dtype=torch.uint8),
        "action": torch.randint(0, A, (T + 1, B), generator=g),
        "reward": torch.randn(T + 1, B, generator=g),
        "done": torch.zeros(T + 1, B, dtype=torch.uint8),
        "logits": torch.randn(T + 1, B, A, generator=g),
        "episode_return": torch.zeros(T + 1, B),
        "episode_end": torch.zeros(T + 1, B, dtype=torch.uint8),
    }


def _grads(learner: Learner, batch) -> torch.Tensor:
    learner.compute_loss(batch)
    return torch.cat([p.grad.flatten() for p in learner.model.parameters()])


def test_bf16_gradients_match_fp32(ring):
    """bf16 keeps 8 bits of mantissa: the gradient of the Nature CNN's loss stays within
    5% (relative L2) of fp32's, and points the same way (cosine > 0.99)."""
    batch = _pixel_batch(0)
    fp32 = _grads(_learner(ring, model="shallow", obs=(4, 84, 84)), batch)
    bf16 = _grads(_learner(ring, model="shallow", obs=(4, 84, 84), bf16=True), batch)
    assert bf16.dtype == torch.float32  # the parameters and their gradients stay fp32
    rel = float((bf16 - fp32).norm() / fp32.norm())
    cos = float(torch.nn.functional.cosine_similarity(bf16, fp32, dim=0))
    assert rel < 0.05 and cos > 0.99, (rel, cos)
    assert not torch.equal(bf16, fp32)  # autocast did run in bf16


@pytest.mark.slow
def test_compiled_loss_matches_eager(ring):
    batch = _pixel_batch(1)
    eager = _learner(ring, model="shallow", obs=(4, 84, 84))
    compiled = _learner(ring, model="shallow", obs=(4, 84, 84), compile=True)
    a, b = eager.compute_loss(batch), compiled.compute_loss(batch)
    assert compiled.compiled, "torch.compile fell back to eager"
    torch.testing.assert_close(b.total, a.total, rtol=1e-4, atol=1e-5)
    ga = torch.cat([p.grad.flatten() for p in eager.model.parameters()])
    gb = torch.cat([p.grad.flatten() for p in compiled.model.parameters()])
    torch.testing.assert_close(gb, ga, rtol=1e-3, atol=1e-5)


def test_a_failing_compile_falls_back_to_eager_once(ring, capsys, monkeypatch):
    learner = _learner(ring)

    def broken(batch):
        raise RuntimeError("no compiler here")

    learner._loss_fn = broken
    _fill(ring, B, 0)
    learner.step(timeout=5)
    assert not learner.compiled and learner._loss_fn == learner._loss
    assert "torch.compile failed (RuntimeError: no compiler here); running eager" in capsys.readouterr().out


def _args(**kw):
    base = dict(
        device="cpu",
        model="shallow",
        use_lstm=False,
        last_action_reward=False,
        num_actors=0,
        num_workers=0,
        envs_per_worker=0,
        learner_threads=0,
        compile="auto",
        bf16="auto",
    )
    return types.SimpleNamespace(**{**base, **kw})


def _job(**kw):
    """What ``train.actor_bf16`` and ``train.actor_policy`` read of a ``train.Job``, with the plan of ``_args(**kw)``."""
    args = _args(**kw)
    plan = make_plan(args, cores=2, cpu_bf16=False)
    model = types.SimpleNamespace(use_lstm=args.use_lstm, last_action_reward=args.last_action_reward)
    return types.SimpleNamespace(plan=plan, device=args.device, model=model)


@pytest.mark.parametrize(
    "kw, cores, expected",
    [
        (dict(), 2, (1, 2, 16, 1, True, False)),  # this machine: one learner thread beside the actors
        (dict(model="mlp"), 2, (2, 2, 32, 1, False, False)),  # the actors' loops bound an MLP's job: one per core
        (dict(model="mlp"), 16, (2, 2, 32, 1, False, False)),  # 2 actors already keep its learner busy
        (dict(model="mlp"), 1, (1, 2, 32, 1, False, False)),
        (dict(model="mlp", device="cuda"), 16, (2, 6, 16, 1, False, False)),
        (dict(), 16, (2, 4, 16, 8, True, False)),
        (dict(device="cuda"), 16, (2, 6, 16, 1, False, True)),
        (dict(device="cuda", num_actors=4, compile="on", bf16="off"), 16, (4, 6, 16, 1, True, False)),
        (dict(num_workers=3, envs_per_worker=8, learner_threads=1), 2, (1, 3, 8, 1, True, False)),
    ],
)
def test_the_plan_fills_the_cores_and_keeps_what_was_given(kw, cores, expected):
    p = make_plan(_args(**kw), cores=cores, cpu_bf16=False)
    assert (p.num_actors, p.num_workers, p.envs_per_worker, p.learner_threads, p.compile, p.bf16) == expected


def test_appo_on_a_cpu_gives_its_learner_every_core_unpinned_and_keeps_what_was_given():
    from bench.impala.plan import PIN_BY_DEFAULT

    appo = make_plan(_args(algo="appo", batch_size=64, pin="auto"), cores=2, cpu_bf16=True)
    assert (appo.learner_threads, appo.pin) == (2, False)  # its actors sleep most of each update
    assert make_plan(_args(algo="appo", batch_size=64), cores=16, cpu_bf16=True).learner_threads == 16
    assert make_plan(_args(algo="appo", batch_size=64), cores=1, cpu_bf16=True).learner_threads == 1
    given = make_plan(_args(algo="appo", batch_size=64, learner_threads=1, pin="on"), cores=2, cpu_bf16=True)
    assert (given.learner_threads, given.pin) == (1, True)
    pinned = make_plan(_args(algo="appo", batch_size=64, pin="on"), cores=2, cpu_bf16=True)
    assert (pinned.learner_threads, pinned.pin) == (1, True)  # pinned_cpus leaves the actors a core
    assert make_plan(_args(algo="appo", batch_size=64, pin="on"), cores=16, cpu_bf16=True).learner_threads == 15
    impala = make_plan(_args(algo="impala", pin="auto"), cores=2, cpu_bf16=True)
    assert (impala.learner_threads, impala.pin) == (1, PIN_BY_DEFAULT)  # IMPALA's actors are busy
    assert (
        make_plan(_args(algo="appo", batch_size=64, model="mlp"), cores=2).learner_threads == 1
    )  # an MLP's actors bound it
    assert make_plan(_args(algo="appo", batch_size=64, device="cuda"), cores=16).learner_threads == 1


def test_the_plan_runs_a_conv_learner_in_bf16_on_a_cpu_that_computes_it():
    from bench.impala.plan import cpu_has_bf16

    assert make_plan(_args(), cores=2, cpu_bf16=True).bf16
    assert not make_plan(_args(), cores=2, cpu_bf16=False).bf16  # emulated bf16 is slower than fp32
    assert not make_plan(_args(model="mlp"), cores=2, cpu_bf16=True).bf16
    assert not make_plan(_args(bf16="off"), cores=2, cpu_bf16=True).bf16
    zen4 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
    sapphire = "flags\t: fpu avx512f amx_bf16 amx_tile\n"
    old = "flags\t: fpu sse2 avx2 fma\nbugs\t: avx512_bf16_is_not_a_flag_here\n"
    assert cpu_has_bf16(zen4) and cpu_has_bf16(sapphire) and not cpu_has_bf16(old) and not cpu_has_bf16("")


def test_actors_infer_in_bf16_where_the_plan_runs_the_learner_in_bf16_on_a_cpu():
    from bench.impala import train

    assert train.actor_bf16(_job(bf16="on")) and not train.actor_bf16(_job(bf16="off"))
    assert not train.actor_bf16(_job(bf16="on", device="cuda"))  # not measured there
    assert train.actor_policy(_job(use_lstm=False, last_action_reward=False)) is train.act
    assert train.actor_policy(_job(use_lstm=True, last_action_reward=False)) is None  # stepped with its core state
    assert train.actor_policy(_job(use_lstm=False, last_action_reward=True)) is None  # stepped with its inputs
    model = make_model("shallow", (4, 84, 84), A).eval()
    obs = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    with torch.inference_mode():
        fp32 = train.act(model, obs)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # as BatchedInference(bf16=True) runs it
            bf16 = train.act(model, obs)
    assert bf16.dtype == torch.float32 and bf16.shape == (5, A)
    torch.testing.assert_close(bf16, fp32, rtol=0, atol=0.05)  # bf16 features, fp32 heads
    assert not torch.equal(bf16, fp32)


def test_the_plan_refuses_a_bad_switch():
    with pytest.raises(ValueError, match="--compile must be auto, on or off, got 'yes'"):
        make_plan(_args(compile="yes"), cores=2)


def test_the_plan_pins_the_learner_apart_from_the_actors_on_a_cpu():
    from bench.impala.plan import PIN_BY_DEFAULT, pinned_cpus

    assert make_plan(_args(pin="auto"), cores=2).pin == PIN_BY_DEFAULT
    assert not make_plan(_args(pin="auto"), cores=1).pin
    assert not make_plan(_args(pin="auto", model="mlp"), cores=2).pin  # its learner idles: the actors get both cores
    assert make_plan(_args(pin="on", model="mlp"), cores=2).pin
    assert not make_plan(_args(pin="auto", device="cuda"), cores=16).pin
    assert not make_plan(_args(pin="off"), cores=2).pin and make_plan(_args(pin="on", device="cuda"), cores=16).pin
    cpus = sorted(os.sched_getaffinity(0))
    assert pinned_cpus(make_plan(_args(pin="off", learner_threads=1), cores=2)) is None
    if len(cpus) < 2:
        assert pinned_cpus(make_plan(_args(pin="on", learner_threads=1), cores=2)) is None  # nothing to split
    else:
        assert pinned_cpus(make_plan(_args(pin="on", learner_threads=1), cores=2)) == (cpus[:1], cpus[1:])
        # the actors keep one
        assert pinned_cpus(make_plan(_args(pin="on", learner_threads=99), cores=2)) == (cpus[:-1], cpus[-1:])


def _usable_cores_in_a_child_on(cores: list[int]) -> int:
    """``usable_cores()`` as a child process reports it after narrowing its affinity to ``cores``."""
    code = f"import os\nos.sched_setaffinity(0, {cores!r})\nfrom bench.impala.plan import usable_cores\nprint(usable_cores())"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no sched_setaffinity on this platform")
def test_usable_cores_follows_the_affinity():
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        pytest.skip(f"this process may run on one core only ({mine}): narrowing its affinity cannot change the count")
    # one core of the machine's several: os.cpu_count() would still say all of them
    assert _usable_cores_in_a_child_on(mine[:1]) == 1
    # two: a count that ignored the affinity and answered 1 would fail here
    assert _usable_cores_in_a_child_on(mine[:2]) == 2


def test_policy_lag_counts_updates_between_acting_and_learning(ring):
    store = WeightStore.create(make_model("mlp", OBS, A))
    try:
        learner = _learner(ring, store, publish_every=2)
        # published: version 1 holds 0 updates, version 2 holds 2 (publish_every=2)
        updates_in = {1: 0, 2: 2}
        expected = []
        for step, version in enumerate([1, 1, 1, 2, 2, 1]):
            _fill(ring, B, step, policy_version=version)
            learner.step(timeout=5)
            expected.append(step - updates_in[version])  # the lag is taken before the update
        s = learner.statistics()
        assert expected == [0, 1, 2, 1, 2, 5]
        assert (s.policy_lag_batches, s.policy_lag_sum) == (6, sum(expected))
    finally:
        store.close()


def test_weights_can_be_published_every_s_seconds_instead(shm_leak_check):
    now = [0.0]
    model = make_model("mlp", OBS, A)
    store = WeightStore.create(model)
    try:
        publisher = WeightPublisher(model, store, every=3, seconds=1.0, clock=lambda: now[0])
        published = []
        for step, t in enumerate([0.2, 0.5, 1.1, 1.5, 2.05, 2.2, 2.9], start=1):
            now[0] = t
            version = store.version
            publisher(step)
            if store.version != version:
                published.append(step)
    finally:
        store.close()
    assert published == [3, 6]  # the first update a second after the last publish; every=3 no longer counts
    for bad in (-1.0, float("nan"), "1"):
        with pytest.raises(ValueError, match=r"publish_seconds must be a number >= 0 \(0: every 3 update\(s\)\), got"):
            WeightPublisher(make_model("mlp", OBS, A), None, every=3, seconds=bad)
    with pytest.raises(ValueError, match=r"publish_seconds must be >= 0 \(0: every publish_every updates\), got -1"):
        LearnerConfig(publish_seconds=-1).check()


def test_the_policy_lag_weighs_each_known_version_by_its_rows_and_forgets_the_oldest(shm_leak_check):
    model = make_model("mlp", OBS, A)
    store = WeightStore.create(model)
    try:
        publisher = WeightPublisher(model, store)
        version = {}
        for steps in (0, 4, 10):
            publisher.publish(steps)
            version[steps] = store.version
        unknown = version[10] + 1000
        rows = torch.tensor([[version[0], version[4]], [version[10], version[10]], [unknown, -1]])
        assert publisher.lag(rows, 12) == (12 + 8 + 2 + 2) / 4  # rows of unknown versions are left out
        assert publisher.lag(torch.tensor([[unknown, -1]]), 12) is None
        assert publisher.steps_at(version[4]) == 4 and publisher.steps_at(unknown) is None

        for k in range(HISTORY):
            publisher.publish(100 + k)
        assert publisher.steps_at(version[0]) is None  # pushed out by the newest HISTORY versions
        assert publisher.steps_at(store.version) == 100 + HISTORY - 1
        assert publisher.lag(torch.tensor([version[0], store.version]), 5000) == 5000 - (100 + HISTORY - 1)
    finally:
        store.close()
