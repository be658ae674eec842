"""bench.impala end to end: CartPole learns through the whole stack (forked env
workers, trajectory ring, weight store, learner), and a short Atari run writes its
progress lines, CSV, picture and a checkpoint it can resume from."""

from __future__ import annotations

import csv
import importlib.util
import os
import sys

import gymnasium
import numpy as np
import pytest
import torch
from helpers import run_command
from helpers.net_procs import ROOT, Broker, procs, run_group_jobs  # noqa: F401 (procs is a fixture)

from bench.impala.progress import startup_seconds
from learners import make_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_bench(*args: str, timeout: float, module: str = "bench.impala") -> str:
    status, text = run_bench_status(*args, timeout=timeout, module=module)
    assert status == 0, text[-3000:]
    return text


def run_bench_status(*args: str, timeout: float, module: str = "bench.impala") -> tuple[int, str]:
    status, out, _ = run_command([sys.executable, "-m", module, *args], timeout, module, cwd=ROOT)
    return status, out


def read_log(out_dir) -> list[dict]:
    with open(os.path.join(out_dir, "log.csv")) as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_cartpole_learns_through_the_full_stack(tmp_path):
    out = tmp_path / "cartpole"
    # 16 environments per worker step about 1.5x the frames/s of 8 on 2 cores (the actors are the
    # bottleneck), so 750K frames take the time 500K did; 500K stopped short of a reliable 400 (395.9 once in CI).
    # gamma 0.98 reaches 500 sooner than 0.99 (probably because its shorter horizon makes the 500-step
    # time limit, which the learner takes for a termination, spoil fewer value targets), and at learning
    # rate 0.005 it fell from 497 to 378 after reaching 500 (training return over 100 episodes); at 0.003 such
    # dips stayed above 460. With both, 7 runs scored 479.8-500; gamma 0.99 at 0.005 had scored 402.9 and 411.3 in 8.
    run_bench(
        "--env",
        "CartPole-v1",
        "--model",
        "mlp",
        "--total-frames",
        "750000",
        "--learning-rate",
        "0.003",
        "--discount",
        "0.98",
        "--entropy-cost",
        "0.01",
        "--batch-size",
        "16",
        "--envs-per-worker",
        "16",
        "--log-interval",
        "5",
        "--out",
        str(out),
        "--launch-type",
        "test_mp",
        timeout=600,
    )
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    assert state["frames"] >= 750_000
    with open(out / "episodes.csv") as f:
        episodes = list(csv.DictReader(f))
    assert len(episodes) >= state["episodes"] - 1 and all(1 <= float(e["return"]) <= 500 for e in episodes)
    assert all(int(e["steps"]) == float(e["return"]) for e in episodes)  # CartPole pays 1 a step: length is return
    assert [int(e["frames"]) for e in episodes] == sorted(int(e["frames"]) for e in episodes)
    lags = [float(r["policy_lag"]) for r in read_log(out) if r["policy_lag"] != ""]
    assert lags and all(0 <= lag < 50 for lag in lags), lags  # updates between acting and learning
    rows = [r for r in read_log(out) if r["env_busy"] != ""]  # where the time goes, from the actors' counters
    assert rows, "no row had the actors' counters"
    for r in rows:
        assert 0 < float(r["env_busy"]) <= 1 and 0 < float(r["inference_share"]) <= 1, r
        assert float(r["inference_ms"]) > 0 and float(r["learner_ms"]) > 0, r
    model = make_model("mlp", (4,), 2)
    model.load_state_dict(state["model"])
    env = gymnasium.make("CartPole-v1")
    rng = np.random.default_rng(0)
    returns = []
    for episode in range(20):
        obs, _ = env.reset(seed=1000 + episode)
        total, over = 0.0, False
        while not over:
            with torch.no_grad():
                logits = model(torch.as_tensor(obs, dtype=torch.float32)[None, None]).policy_logits[0, 0]
            probs = torch.softmax(logits, -1).numpy().astype(np.float64)
            action = int(rng.choice(2, p=probs / probs.sum()))  # the stochastic policy, not its argmax
            obs, reward, terminated, truncated, _ = env.step(action)
            total += reward
            over = terminated or truncated
        returns.append(total)
    assert np.mean(returns) >= 400, f"mean return over 20 episodes {np.mean(returns):.1f}: {returns}"


@pytest.mark.slow
def test_atari_run_writes_logs_picture_and_resumes(tmp_path):
    out = tmp_path / "pong"
    common = [
        *"--env ALE/Pong-v5 --num-workers 2 --envs-per-worker 2 --batch-size 4 --unroll-length 10 --compile off".split(),
        *f"--log-interval 1 --out {out} --launch-type test_mp".split(),
    ]
    text = run_bench(*common, "--total-frames", "2400", timeout=300)
    assert "[learner/0] frames" in text and "fps" in text and "return(100)" in text and "queue" in text
    startup = startup_seconds(text)  # printed once, after the first update: imports, forks, the first batch
    assert startup is not None and startup > 0 and text.count("start-up: ") == 1, text[-3000:]
    rows = read_log(out)
    assert rows and {"frames", "seconds", "fps", "mean_return"} <= set(rows[0])
    assert int(rows[-1]["frames"]) >= 2400
    with open(out / "curve.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    first = torch.load(out / "checkpoint.pt", weights_only=False)
    assert first["frames"] >= 2400 and first["optimizer"]["state"]  # Adam's moments are saved
    text = run_bench(*common, "--total-frames", "4800", "--resume", timeout=300)
    assert f"resuming {out} at {first['frames']:,} frames" in text
    rows2 = read_log(out)
    assert len(rows2) > len(rows) and int(rows2[-1]["frames"]) >= 4800
    assert float(rows2[len(rows)]["seconds"]) >= float(rows[-1]["seconds"])  # time continues too
    text = run_bench(*common, "--total-frames", "4800", "--resume", timeout=300)  # the target is reached already
    assert "raise --total-frames to train on" in text and "done" not in text
    assert read_log(out) == rows2  # nothing written


@pytest.mark.slow
@pytest.mark.timeout(600)  # two runs, each with its own hang guard
@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_a_lockstep_run_repeats_itself(tmp_path, algo):
    """--lockstep: two runs of one seed end with the same weights, the same optimiser state
    and the same episodes (without it the actor's weights are the scheduler's choice, and two
    runs end apart: docs/results/impala-lockstep). A batch of 8 unrolls is both halves of the
    actor's 8 environments, so in lock step every batch is acted with the weights of the
    update just before it: the policy lag is 0 in every row, whatever the machine's speed."""
    states, episodes = [], []
    for i in range(2):
        out = tmp_path / f"run{i}"
        run_bench(
            *f"--env shmpad/Spot-v0 --algo {algo} --model shallow --compile off --total-frames 5000".split(),
            *"--batch-size 8 --num-workers 1 --envs-per-worker 8 --learner-threads 1 --lockstep".split(),
            *f"--log-interval 5 --out {out} --launch-type test_mp".split(),
            timeout=300,
        )
        states.append(torch.load(out / "checkpoint.pt", weights_only=False))
        episodes.append((out / "episodes.csv").read_text())
        lags = [float(r["policy_lag"]) for r in read_log(out) if r["policy_lag"] != ""]
        assert lags and all(lag == 0 for lag in lags), lags
    a, b = states
    assert a["steps"] == b["steps"] > 0 and a["frames"] == b["frames"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), f"{k} differs between the two runs"
    moments = [(x["optimizer"]["state"][0]["exp_avg"], x["optimizer"]["state"][0]["exp_avg_sq"]) for x in states]
    assert all(torch.equal(m, n) for m, n in zip(*moments))
    assert episodes[0] == episodes[1] and episodes[0].count("\n") > 10


def test_two_hosts_train_one_model_with_peers(tmp_path, procs):
    """``--peers``: two bench.impala runs (each its own actors and learner) join one
    broker group, average gradients every step and end with identical weights."""
    broker = Broker()
    procs.append(broker)
    argvs = []
    for i in range(2):
        args = [
            "--env",
            "CartPole-v1",
            "--model",
            "mlp",
            "--total-frames",
            "20000",
            "--num-workers",
            "1",
            "--envs-per-worker",
            "8",
            "--batch-size",
            "16",
            "--log-interval",
            "1",
            "--out",
            str(tmp_path / f"h{i}"),
            "--launch-type",
            "test_mp",
            "--peers",
            broker.address,
            "--group",
            "cartpole",
            "--min-peers",
            "2",
            "--seed",
            str(i),
        ]
        argvs.append(args)
    run_group_jobs(argvs)
    a, b = (torch.load(tmp_path / f"h{i}" / "checkpoint.pt", weights_only=False) for i in range(2))
    assert a["steps"] == b["steps"] > 0
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), f"{k} differs between the two hosts"


@pytest.mark.slow
def test_pixels_learn_through_the_full_stack(tmp_path):
    """shmpad/Spot-v0 (actors/envs/spot.py): only a policy that reads the frame beats 10 of
    20; the Nature CNN through forked workers, the ring, V-trace and the weight store must
    reach 18 in 40K frames. It runs in lock step (--lockstep), so its outcome does not hang on
    the scheduler: on one machine it is the same every run. Seeds 0-2, with bf16 inference and
    without, all ended at 20.00 (docs/results/impala-lockstep/); asynchronous trials had
    reached 20 by 26K frames."""
    out = tmp_path / "spot"
    # the TensorBoard scalars too where the tensorboard extra is installed (CI installs it; the
    # README's test command does not, and the learning must be checked there as well)
    board = importlib.util.find_spec("tensorboard") is not None
    run_bench(
        *"--env shmpad/Spot-v0 --model shallow --compile off --total-frames 40000 --batch-size 8".split(),
        *"--num-workers 1 --envs-per-worker 8 --learner-threads 1 --learning-rate 0.002 --discount 0.5".split(),
        *f"--log-interval 5 --out {out} --launch-type test_mp --lockstep".split(),
        *(["--tensorboard"] if board else []),
        timeout=300,
    )
    rows = read_log(out)
    assert float(rows[-1]["mean_return"]) >= 18, [r["mean_return"] for r in rows]
    if board:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(out / "tensorboard"))
        events.Reload()
        tags = set(events.Tags()["scalars"])
        assert {"returns/mean_return", "losses/policy_gradient", "learning/policy_lag_updates"} <= tags, tags
        assert [e.step for e in events.Scalars("returns/mean_return")][-1] == int(rows[-1]["frames"])
    from bench.evaluate import play

    _, env, model, _ = play.load_run(str(out))
    greedy = play.play(env, model, episodes=10, greedy=True, seed=3)
    assert sum(greedy) / len(greedy) >= 19, greedy
