"""``python -m bench.impala.learner_cost``: an update's operations land in the phase that
computes them (counted against the arithmetic of a small MLP), and the command's report
has every arm and phase (timings are not checked: a benchmark is never a timed unit test)."""

from __future__ import annotations

import json

import pytest
import torch
from test_bench_impala import run_bench_status

from bench.impala import learner_cost, train

pytestmark = pytest.mark.rl

T, B = 8, 4
HIDDEN = 64
MLP = (
    f"--env CartPole-v1 --model mlp --algo appo --unroll-length {T} --batch-size {B} --compile off --learner-threads 1"
)


def _job(flags: str):
    return train.resolve(train.parse_args(flags.split(), prog="test"))


@pytest.mark.parametrize("shuffle", ["steps", "unrolls"])
def test_an_appo_updates_operations_are_counted_in_their_phases(shuffle):
    epochs, minibatches = 2, 2
    job = _job(f"{MLP} --epochs {epochs} --minibatches {minibatches} --shuffle {shuffle}")
    spec = job.env.spec()
    unroll = learner_cost._prepared_unroll(job, spec)
    batch = {k: torch.from_numpy(v).unsqueeze(1).expand(v.shape[0], B, *v.shape[1:]).clone() for k, v in unroll.items()}
    flops = learner_cost._update_flops(job, spec, batch)
    (obs_dim,) = spec.obs_shape
    # per sample, forward: the torso's two layers, the policy and baseline heads (2 flops a multiply-add)
    products = obs_dim * HIDDEN + HIDDEN * HIDDEN + HIDDEN * spec.num_actions + HIDDEN * 1
    forward = 2 * products
    # backward: the weights' gradients of every layer, the inputs' of every layer but the first
    backward = 2 * products + 2 * (products - obs_dim * HIDDEN)
    # a minibatch of whole unrolls carries the bootstrap row through the model too
    rows = T * B if shuffle == "steps" else (T + 1) * B
    assert flops == {
        "targets": forward * (T + 1) * B,
        "forward": forward * rows * epochs,
        "backward": backward * rows * epochs,
        "optimizer": 0,
        "other": 0,
    }


def test_the_peak_is_a_rate_of_a_matrix_product():
    assert learner_cost.peak_gflops(torch.float32, seconds=0.05) > 0


def test_the_command_reports_every_arm_and_phase():
    status, out = run_bench_status(
        "--common",
        f"{MLP} --epochs 1 --minibatches 1",
        "--arm",
        "",
        "--arm",
        "--isa avx2",
        "--rounds",
        "1",
        "--updates",
        "1",
        timeout=600,
        module="bench.impala.learner_cost",
    )
    lines = out.splitlines()
    assert lines[-1].startswith("report: "), out[-3000:]
    report = json.loads(lines[-1][len("report: ") :])
    assert set(report["arms"]) == {"(defaults)", "--isa avx2"}
    for arm in report["arms"].values():
        assert not arm["errors"] and arm["rounds"] == 1
        assert set(arm["phase_s"]) == set(learner_cost.PHASES)
        assert arm["gflop_per_update"] > 0 and arm["update_s"] > 0 and arm["peak_fp32"] > 0
        assert sum(arm["phase_s"].values()) == pytest.approx(arm["update_s"], rel=0.05)
    assert report["runs"]["--isa avx2"][0]["cpu_capability"] == "AVX2"
    assert set(report["speedup"]) == {"--isa avx2"}
    assert any(line.startswith("target: the first arm's update at >= 0.6 of the fp32 peak") for line in lines)
    assert status == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--arm", "--isa avx9"], "--isa takes one of ['avx2', 'native'], got ['avx9']"),
        (["--arm", "--thp yes"], "--thp takes one of ['off', 'on'], got ['yes']"),
        (["--arm=--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--rounds", "0"], "--rounds and --updates must be >= 1, got 0 and 2"),
        (["--env", "CartPole-v1"], "bench.impala flags go in --common or --arm"),
        (["--arm", "--device cuda"], "measures a learner on the CPU (its peak too), got --device cuda"),
        (["--common=--use-lstm"], "measures feed-forward models only; drop --use-lstm"),
    ],
)
def test_bad_arguments_fail_before_any_measurement(args, message, capsys, monkeypatch):
    monkeypatch.setattr(learner_cost, "_measure_in_process", _no_measurement)
    with pytest.raises(SystemExit) as exit:
        learner_cost.main(args)
    out = capsys.readouterr()
    assert exit.value.code != 0 and message in f"{exit.value.code} {out.err}", (exit.value.code, out)


def _no_measurement(*args, **kwargs):
    raise AssertionError("a measurement started")
