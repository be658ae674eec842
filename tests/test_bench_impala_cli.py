"""bench.impala as a new user meets it: a grouped --help, mistakes caught before launch in
one line (exit status 2), defaults that fit the env, run folders that are never
overwritten, a resume that checks what it resumes, Ctrl+C that says where it stopped, and
--top's live view under the progress lines in a terminal (tmux)."""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
from helpers import Tmux, kill_and_reap, run_command, start_session, track_pid, wait_until

from actors import EnvPool
from bench.impala import progress, rundir, train
from bench.impala.plan import MLP_MAX_ACTORS, make_plan, usable_cores

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--num-workers", "1", "--envs-per-worker", "4", "--log-interval", "1", "--launch-type", "test_mp"]


def bench(*args: str, timeout: float = 120) -> tuple[int, str, str]:
    return run_command([sys.executable, "-m", "bench.impala", *args], timeout, "bench.impala", ROOT, split=True)


def test_help_groups_the_options_with_choices_and_examples():
    rc, out, _ = bench("--help")
    assert rc == 0
    for heading in ("environment:", "model:", "learning:", "actors:", "several hosts", "output:", "examples:"):
        assert f"\n{heading}" in out, heading
    assert "--model {shallow,deep,mlp}" in out and "--optimizer {adam,rmsprop}" in out
    assert "--reduction {mean,sum}" in out and "--device {cpu,cuda}" in out
    assert "(default:" not in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--out", "/proc/impala"], "--out /proc/impala: cannot write there"),
        (["--env", "Pong-v5"], "unknown environment id 'Pong-v5'; did you mean"),
        (["--resume", "--out", "/nonexistent/run"], "--resume: there is no run in /nonexistent/run"),
        (["--model", "big"], "invalid choice: 'big'"),
    ],
)
def test_mistakes_are_caught_before_launch_in_one_line(args, message):
    rc, out, err = bench(*args)
    assert rc == 2 and message in err, err
    assert "Traceback" not in err + out
    if "invalid choice" not in message:  # argparse's own errors come with the usage
        assert err.count("\n") == 1, err


def test_classic_control_gets_its_own_defaults_unless_given():
    cartpole = train.parse_args(["--env", "CartPole-v1", "--learning-rate", "0.01"])
    assert (cartpole.model, cartpole.total_frames, cartpole.discount) == ("mlp", 750_000, 0.98)
    assert cartpole.learning_rate == 0.01  # given on the command line: kept
    assert cartpole.publish_seconds == 0.01  # a 2 ms update is not made to publish every time
    assert train.parse_args(["--env", "CartPole-v1", "--publish-seconds", "0"]).publish_seconds == 0
    pong = train.parse_args([])
    assert (pong.model, pong.total_frames, pong.publish_seconds) == ("shallow", 200_000, 0)
    cartpole = train.parse_args(["--env", "CartPole-v1", "--algo", "appo"])  # APPO's own defaults, not Atari's
    assert (cartpole.learning_rate, cartpole.unroll_length, cartpole.kl_target, cartpole.normalize_input) == (
        0.003,
        20,
        0,
        False,
    )


def test_atari_defaults_to_appo_with_rl_games_settings_and_impala_keeps_its_own(monkeypatch):
    pong = train.parse_args([])
    assert (pong.algo, pong.unroll_length, pong.batch_size, pong.minibatches) == ("appo", 128, 64, 4)
    assert (pong.learning_rate, pong.kl_target, pong.clip, pong.baseline_cost) == (3e-4, 0.01, 0.2, 2.0)
    assert (pong.init, pong.normalize_input, pong.value_clip, pong.grad_norm_clip) == ("orthogonal", True, 0, 1.0)
    job = train.resolve(pong, make_plan(pong, cores=2, cpu_bf16=True))
    # a batch of 64 environments on 2 cores (1 actor x 2 workers), 4 epochs, a ring of one batch
    assert (job.plan.num_actors, job.plan.num_workers, job.plan.envs_per_worker) == (1, 2, 32)
    assert (job.learner.epochs, job.queue_slots, job.model.normalize_input) == (4, 64, True)
    assert train.resolve(pong, make_plan(pong, cores=16, cpu_bf16=True)).plan.envs_per_worker == 16  # 8 workers
    given = train.parse_args(["--batch-size", "32", "--learning-rate", "1e-3", "--no-normalize-input"])
    assert (given.batch_size, given.learning_rate, given.normalize_input, given.kl_target) == (32, 1e-3, False, 0.01)
    eight = train.parse_args(["--envs-per-worker", "8"])  # given: the plan keeps it, below one batch
    assert train.resolve(eight, make_plan(eight, cores=2, cpu_bf16=True)).plan.envs_per_worker == 8
    impala = train.parse_args(["--algo", "impala"])
    assert (impala.unroll_length, impala.batch_size, impala.learning_rate, impala.entropy_cost) == (20, 32, 6e-4, 6e-4)
    assert (impala.kl_target, impala.normalize_input, impala.init) == (0, False, "torch")
    assert train.resolve(impala, make_plan(impala, cores=2, cpu_bf16=True)).queue_slots == 4 * 32
    from bench.impala.usage import advice

    assert "--total-frames 10_000_000" in advice(pong) and "--model deep" in advice(impala)  # after a smoke test
    monkeypatch.setenv("SHMPAD_TOKEN", "t" * 32)
    peers = train.parse_args(["--peers", "127.0.0.1:5555"])  # a group runs APPO too (pong-hosts-appo)
    assert (peers.algo, peers.learning_rate, peers.normalize_input, peers.batch_size) == ("appo", 3e-4, True, 64)


def test_appo_minibatches_of_steps_are_an_option_checked_before_launch(capsys):
    job = train.resolve(
        train.parse_args(["--algo", "appo", "--shuffle", "steps", "--batch-size", "6", "--minibatches", "4"])
    )
    assert (job.learner.shuffle, job.learner.minibatches) == ("steps", 4)  # 6 x 128 steps: any divisor of 768
    assert train.resolve(train.parse_args(["--algo", "appo"])).learner.shuffle == "unrolls"
    for argv, message in (
        (["--shuffle", "steps", "--batch-size", "6", "--unroll-length", "20", "--minibatches", "7"], "a batch's 120"),
        (["--shuffle", "steps", "--use-lstm"], "an LSTM core needs whole unrolls"),
        (["--shuffle", "frames"], "invalid choice: 'frames'"),
    ):
        with pytest.raises(SystemExit):
            train.parse_args(["--algo", "appo", *argv])
        assert message in capsys.readouterr().err


def test_peers_take_a_backend_and_env_urls(monkeypatch):
    monkeypatch.setenv("SHMPAD_TOKEN", "t" * 32)
    args = train.parse_args(["--peers", "127.0.0.1:5555", "--backend", "gloo"])
    assert (args.peers, args.backend) == ("127.0.0.1:5555", "gloo")
    assert train.parse_args(["--peers", "env://"]).backend == "shmpad"  # env:// is no HOST:PORT, and is accepted
    with pytest.raises(SystemExit):
        train.parse_args(["--peers", "127.0.0.1:5555", "--backend", "mpi"])


def _first_observations(job, index: int = 0) -> np.ndarray:
    """The first observations of actor ``index``'s environments, seeded as run_actor seeds them."""
    env_seed, _ = train.actor_seeds(job, index)
    with EnvPool(job.env, 1, 4, seed=env_seed) as pool:
        return pool.recv(timeout=60).obs.copy()


def test_the_members_of_a_group_play_different_games(monkeypatch, capsys, tmp_path):
    """Members run the same command: with one --seed, each still seeds its actors apart
    (--member-seed, drawn when not given), so the group does not learn from copies of one game."""
    monkeypatch.setenv("SHMPAD_TOKEN", "t" * 32)
    group = ["--env", "CartPole-v1", "--peers", "127.0.0.1:5555"]
    a, b = train.parse_args(group), train.parse_args(group)
    assert 0 <= a.member_seed < 2**31 and 0 <= b.member_seed < 2**31
    assert a.member_seed != b.member_seed  # two draws of 31 bits
    ja, jb = train.resolve(a), train.resolve(b)
    assert ja.actor_seed != jb.actor_seed and ja.seed == jb.seed == 0  # the networks start alike
    assert set(train.actor_seeds(ja, 0)).isdisjoint(train.actor_seeds(jb, 0))
    assert not np.array_equal(_first_observations(ja), _first_observations(jb))
    # one --member-seed repeats a member's games; config.json keeps the one drawn
    again = train.resolve(train.parse_args([*group, "--member-seed", str(a.member_seed)]))
    assert again.actor_seed == ja.actor_seed
    assert np.array_equal(_first_observations(again), _first_observations(ja))
    assert rundir.run_config(dataclasses.asdict(a), ja.plan)["member_seed"] == a.member_seed
    # --resume goes on with the member seed its config.json holds
    out = tmp_path / "member"
    rundir.write_config(str(out), rundir.run_config(dataclasses.asdict(a), ja.plan))
    resumed = train.parse_args([*group, "--resume", "--out", str(out)])
    assert resumed.member_seed == a.member_seed
    # one host: its actors keep --seed, as before
    alone = train.resolve(train.parse_args(["--env", "CartPole-v1", "--seed", "3"]))
    assert (alone.actor_seed, train.actor_seeds(alone, 1)) == (3, (3 + 1_000_003, 4))
    for argv, message in [
        (["--member-seed", "4"], "--member-seed 4 seeds a member of a group: give --peers too"),
        ([*group, "--member-seed", "-2"], "--member-seed must be >= 0, or -1 (drawn at random), got -2"),
        (["--seed", "-1"], "--seed must be >= 0, got -1"),
    ]:
        with pytest.raises(SystemExit):
            train.parse_args(argv)
        assert message in capsys.readouterr().err


def test_args_are_resolved_once_into_what_the_nodes_need(monkeypatch):
    monkeypatch.setenv("SHMPAD_TOKEN", "t" * 32)
    args = train.parse_args(["--env", "CartPole-v1", "--peers", "127.0.0.1:5555", "--min-peers", "2"])
    job = train.resolve(args)
    assert (job.env.env_id, job.model.kind, job.out) == ("CartPole-v1", "mlp", args.out)
    assert (job.learner.batch_size, job.learner.learning_rate, job.learner.frames_per_step) == (16, 0.003, 1)
    assert job.queue_slots == 4 * args.batch_size  # --queue-slots 0: 4 batches
    assert (job.group.broker, job.group.min_size) == ("127.0.0.1:5555", 2)
    assert train.resolve(train.parse_args([])).group is None
    assert train.resolve(train.parse_args(["--adam-eps", "1e-5"])).learner.adam_eps == 1e-5
    assert train.resolve(train.parse_args([])).learner.adam_eps == 1e-8  # torch's
    with pytest.raises(SystemExit):
        train.parse_args(["--adam-eps", "0"])  # "--adam-eps must be > 0, got 0.0"
    # config.json: every option in Args' order, the plan's choices in place of 0 and auto
    config = rundir.run_config(dataclasses.asdict(args), job.plan)
    assert list(config) == list(dataclasses.asdict(args))
    assert (config["num_actors"], config["envs_per_worker"]) == (job.plan.num_actors, job.plan.envs_per_worker)
    assert config["compile"] == ("on" if job.plan.compile else "off") and config["pin"] in ("on", "off")


def test_the_default_out_is_a_new_folder_per_env_and_start():
    assert train.parse_args(["--env", "CartPole-v1"]).out.startswith(os.path.join("runs", "cartpole-v1-20"))
    assert train.parse_args([]).out.startswith(os.path.join("runs", "ale-pong-v5-20"))


def test_the_progress_line_names_the_role_that_bounds_the_run():
    assert progress.bound(0.76, 0.0).startswith("learner-bound: queue  76% full, learner waits   0%")
    assert progress.bound(0.02, 0.4).startswith("actor-bound")
    assert progress.bound(0.2, 0.05).startswith("balanced")


def test_a_run_log_starts_anew_or_appends_with_the_columns_it_was_started_with(tmp_path):
    with progress.RunLog(str(tmp_path), resume=False) as log:
        log.episodes(100, [(-21.0, 764), (-20.0, 812)])
        log.row({"frames": 100, "seconds": 1.5, "not_a_column": 7})
    assert (tmp_path / "episodes.csv").read_text().splitlines() == [
        "frames,return,steps",
        "100,-21.0,764",
        "100,-20.0,812",
    ]
    with progress.RunLog(str(tmp_path), resume=True) as log:
        log.episodes(150, [(-18.0, 901)])
    assert (tmp_path / "episodes.csv").read_text().splitlines()[-1] == "150,-18.0,901"
    old = ["frames", "seconds"]  # a log an older version started, with fewer columns
    (tmp_path / "log.csv").write_text("frames,seconds\n100,1.5\n")
    (tmp_path / "episodes.csv").write_text("frames,return\n100,-21.0\n100,-20.0\n")  # before lengths were kept
    with progress.RunLog(str(tmp_path), resume=True) as log:
        log.episodes(200, [(-19.0, 850)])
        log.row({"frames": 200, "seconds": 3.0, "mean_return": -19.0})
    assert (tmp_path / "log.csv").read_text().splitlines() == [",".join(old), "100,1.5", "200,3.0"]
    assert (tmp_path / "episodes.csv").read_text().splitlines() == [
        "frames,return",
        "100,-21.0",
        "100,-20.0",
        "200,-19.0",
    ]
    with progress.RunLog(str(tmp_path), resume=False) as log:  # a new run (rundir refuses a used folder first)
        log.row({"frames": 1})
    assert (tmp_path / "log.csv").read_text().splitlines()[0] == ",".join(progress.CSV_COLUMNS)
    assert (tmp_path / "episodes.csv").read_text().splitlines() == ["frames,return,steps"]


def test_the_progress_row_says_where_the_time_goes_from_the_actors_counters():
    """Env workers busy, inference per batch and share, learner per update, from the growth of
    every actor's running totals since the last row; a restarted actor counts from zero."""
    from types import SimpleNamespace

    def learner(steps, wait):
        stats = SimpleNamespace(
            frames=steps * 100, mean_return=1.0, episodes=0, steps=steps, wait_seconds=wait, learning_rate=1e-3,
            last_loss={}, policy_lag_sum=0.0, policy_lag_batches=0,
        )  # fmt: skip
        return SimpleNamespace(statistics=lambda: stats, accumulator=None)

    ring = SimpleNamespace(statistics=lambda: SimpleNamespace(size=1, capacity=4))
    first = {
        "actor/0": dict(frames=0, env_s=1.0, wait_s=1.0, batches=10, inf_wait_s=0.0, inf_s=1.0, rollout_s=0.0),
        "actor/1": dict(frames=0, env_s=5.0, wait_s=5.0, batches=50, inf_wait_s=1.0, inf_s=2.0, rollout_s=1.0),
    }
    last = {"t": 0.0, "frames": 0, "steps": 0, "wait": 0.0}
    progress.progress(learner(0, 0.0), ring, last, now=1.0, seconds=1.0, actors=first)
    second = {
        "actor/0": dict(frames=0, env_s=4.0, wait_s=2.0, batches=30, inf_wait_s=1.0, inf_s=2.0, rollout_s=1.0),
        "actor/1": dict(
            frames=0, env_s=2.0, wait_s=0.0, batches=10, inf_wait_s=0.0, inf_s=0.5, rollout_s=0.5
        ),  # restarted
    }
    row = progress.progress(learner(8, 1.0), ring, last, now=3.0, seconds=3.0, actors=second)
    # growth: actor/0 env 3, wait 1, batches 20, loop 1+1+1; actor/1 from zero: env 2, wait 0, batches 10, loop 0+0.5+0.5
    assert row["env_busy"] == pytest.approx(5 / 6, abs=1e-3)
    assert row["inference_ms"] == pytest.approx(1e3 * 1.5 / 30, abs=0.01)
    assert row["inference_share"] == pytest.approx(1.5 / 4, abs=1e-3)
    assert row["learner_ms"] == pytest.approx(1e3 * (2.0 - 1.0) / 8, abs=0.1)  # 2 s, 1 of them waiting, 8 updates
    line = progress.progress_line(row)
    assert "env workers busy 83%, inference 50.0 ms/batch (38% of the actor loop), learner 125 ms/update" in line
    quiet = progress.progress(learner(8, 1.0), ring, last, now=4.0, seconds=4.0, actors=second)
    assert [quiet[k] for k in ("env_busy", "inference_ms", "inference_share", "learner_ms")] == [""] * 4
    assert "|" not in progress.progress_line(quiet)  # nothing measured: no breakdown
    assert [quiet[k] for k in ("entropy", "clip_fraction", "approx_kl")] == [""] * 3  # no update yet
    appo = learner(9, 1.0)
    appo.statistics().last_loss.update(total=0.5, entropy=-1.25, clip_fraction=0.125, approx_kl=0.0075)
    row = progress.progress(appo, ring, last, now=5.0, seconds=5.0, actors=second)
    assert [row[k] for k in ("loss", "entropy", "clip_fraction", "approx_kl")] == [0.5, 1.25, 0.125, 0.0075]


def test_a_run_folder_is_never_overwritten_and_resume_checks_what_it_resumes(tmp_path):
    out = str(tmp_path / "run")
    rc, text, err = bench("--env", "CartPole-v1", "--total-frames", "2000", *SMALL, "--out", out, "--top")
    assert rc == 0, err
    # --top without a terminal: one line, and the run goes on without the view
    assert err.count("stdout is not one: running without it") == 1, err
    assert text.startswith(f"IMPALA on CartPole-v1: model mlp, 2,000 frames, out {out}")
    assert re.search(
        rf"plan for {usable_cores()} core\(s\), cpu: {min(usable_cores(), MLP_MAX_ACTORS)} actor\(s\) x 1 env workers "
        r"x 4 envs, learner 1 thread\(s\), eager, fp32",  # an MLP's actors get one core each, up to 2
        text,
    ), text
    assert os.path.exists(os.path.join(out, "config.json"))
    rc, _, err = bench("--env", "ALE/Pong-v5", *SMALL, "--out", out)
    assert rc == 2 and f"--out {out} already holds a run of 'CartPole-v1'; continue it with --resume" in err
    rc, _, err = bench("--env", "Acrobot-v1", *SMALL, "--out", out, "--resume")
    assert rc == 2 and "is a run of env 'CartPole-v1'; this command asks for env 'Acrobot-v1'" in err
    rc, _, err = bench("--env", "CartPole-v1", "--algo", "appo", *SMALL, "--out", out, "--resume")
    assert rc == 2 and "is a run of algo 'impala'; this command asks for algo 'appo'" in err
    rc, text, err = bench("--env", "CartPole-v1", "--total-frames", "2000", *SMALL, "--out", out, "--resume")
    assert rc == 0 and "raise --total-frames" in text and "wrote" not in text, text + err
    os.remove(os.path.join(out, "config.json"))  # a run from before config.json: the checkpoint itself is checked
    rc, _, err = bench("--env", "Acrobot-v1", *SMALL, "--out", out, "--resume")
    assert (
        rc == 2 and "checkpoint.pt holds another network than --env Acrobot-v1 --model mlp --init torch builds" in err
    )
    assert err.count("\n") == 1, err


@pytest.mark.parametrize("interrupts", [1, 2])
def test_ctrl_c_says_where_it_stopped_and_exits_130(tmp_path, interrupts):
    out = str(tmp_path / "run")
    proc = start_session(
        [
            sys.executable,
            "-m",
            "bench.impala",
            "--env",
            "CartPole-v1",
            *SMALL[:-2],
            "--out",
            out,
            "--checkpoint-minutes",
            "0.001",
        ],  # a checkpoint every step: the kill may well come mid-save
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    track_pid(proc.pid)
    try:
        for line in proc.stdout:
            if b"[learner/0] frames" in line:
                break
        for _ in range(interrupts):
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl+C does
        rest = proc.stdout.read().decode()
        assert proc.wait(timeout=60) == 130, rest
    finally:
        kill_and_reap(proc)
    last = rest.strip().splitlines()[-1]
    assert last.startswith("interrupted at ") and last.endswith(f"frames; continue with --resume --out {out}"), rest
    assert "done" not in rest and "short run" not in rest
    assert glob.glob(os.path.join(out, "checkpoint.pt.tmp.*")) == []


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")
def test_top_draws_the_live_view_under_the_progress_lines(tmp_path):
    out = str(tmp_path / "run")
    command = " ".join(
        [sys.executable, "-m", "bench.impala", "--env", "CartPole-v1", "--total-frames", "20000", *SMALL]
        + ["--out", out, "--top", "; echo exited $?; sleep 120"]
    )
    with Tmux("run", command, ROOT, width=200, height=50) as tmux:

        def view_under_progress() -> bool:
            split = tmux.above_and_in_view()
            if split is None:
                return False
            above, view = split
            return (
                any(ln.startswith("[learner/0] frames") for ln in above)
                and any(ln.strip().startswith("learner/0") for ln in view)
                and "trajectories" in "\n".join(view)
            )

        assert wait_until(view_under_progress, 240, 0.2), tmux.pane()
        assert wait_until(lambda: "exited 0" in tmux.pane(), 240, 0.2), tmux.pane()
        assert "program 'impala'" in tmux.pane() and "ended" in tmux.pane(), tmux.pane()
        assert tmux.cursor_shown()  # the view gave the terminal back


def test_publishing_by_seconds_is_checked_and_shown_in_the_plan(capsys):
    from bench.impala.usage import summary

    args = train.parse_args(["--publish-seconds", "0.5"])
    assert args.publish_seconds == 0.5 and "weights published every 0.5 s" in summary(args, train.resolve(args).plan)
    pong = train.parse_args([])
    assert "weights published every 1 update(s)" in summary(pong, train.resolve(pong).plan)
    with pytest.raises(SystemExit):
        train.parse_args(["--publish-seconds", "-1"])
    assert "--publish-seconds must be >= 0 (0: every --publish-every updates), got -1.0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--algo", "appo", "--kl-target", "-1"], "--kl-target must be a finite number >= 0 (0: off), got -1.0"),
        (["--algo", "appo", "--kl-target", "inf"], "--kl-target must be a finite number >= 0 (0: off), got inf"),
        (
            ["--algo", "impala", "--kl-target", "0.01"],
            "--kl-target (0.01) adapts the learning rate between APPO's minibatch steps: needs --algo 'appo'",
        ),
    ],
)
def test_a_kl_target_is_checked_and_reaches_the_learner(argv, message, capsys):
    assert train.resolve(train.parse_args(["--algo", "appo", "--kl-target", "0.01"])).learner.kl_target == 0.01
    with pytest.raises(SystemExit):
        train.parse_args(argv)
    assert message in capsys.readouterr().err


def test_normalize_input_builds_a_model_with_input_statistics():
    job = train.resolve(train.parse_args(["--normalize-input"]))
    assert job.model.normalize_input and train.build_model(job, (4, 84, 84), 6).torso.obs_norm is not None
    assert (
        train.build_model(train.resolve(train.parse_args(["--algo", "impala"])), (4, 84, 84), 6).torso.obs_norm is None
    )
    assert "normalize_input" in train.IDENTITY  # a checkpoint holds the statistics or not: resume only alike


def test_a_group_runs_appo_and_input_statistics_but_no_virtual_batch_with_appo(monkeypatch, capsys):
    monkeypatch.setenv("SHMPAD_TOKEN", "t" * 32)
    impala = train.resolve(train.parse_args(["--algo", "impala", "--normalize-input", "--peers", "127.0.0.1:5555"]))
    assert (impala.learner.algo, impala.model.normalize_input) == ("impala", True)
    appo = train.resolve(train.parse_args(["--peers", "127.0.0.1:5555"]))  # the group's default
    assert (appo.learner.algo, appo.learner.minibatches, appo.learner.kl_target) == ("appo", 4, 0.01)
    assert appo.model.normalize_input  # rl_games' recipe, as on one host
    with pytest.raises(SystemExit):
        train.parse_args(["--algo", "appo", "--peers", "127.0.0.1:5555", "--virtual-batch-size", "64"])
    assert "--virtual-batch-size (64) would sum several reductions into one step" in capsys.readouterr().err


def test_cuda_graph_reaches_the_actors_and_is_refused_without_a_gpu(capsys):
    assert train.resolve(train.parse_args(["--device", "cuda", "--cuda-graph", "on"])).cuda_graph
    assert not train.resolve(train.parse_args(["--device", "cuda"])).cuda_graph  # off until measured
    with pytest.raises(SystemExit):
        train.parse_args(["--cuda-graph", "on"])
    assert "--cuda-graph on replays the actors' forward pass on a GPU: give --device cuda, got cpu" in (
        capsys.readouterr().err
    )


def test_normalize_value_builds_a_model_with_value_statistics_for_appo_only(capsys):
    job = train.resolve(train.parse_args(["--algo", "appo", "--normalize-value"]))
    assert job.model.normalize_value and train.build_model(job, (4, 84, 84), 6).value_norm is not None
    with pytest.raises(SystemExit):
        train.parse_args(["--algo", "impala", "--normalize-value"])
    assert "(--normalize-value) needs --algo 'appo', got 'impala'" in capsys.readouterr().err
    assert "normalize_value" in train.IDENTITY


def test_lockstep_runs_one_actor_publishing_every_update():
    from bench.impala.usage import summary

    for given in ([], ["--num-actors", "1", "--publish-every", "1"], ["--num-actors", "0"]):
        args = train.parse_args(["--lockstep", *given])
        job = train.resolve(args)
        assert job.lockstep and job.plan.num_actors == 1
        assert (job.learner.publish_every, job.learner.publish_seconds) == (1, 0.0)
        assert "in lock step: the actor waits for every update" in summary(args, job.plan)
    assert not train.resolve(train.parse_args([])).lockstep


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num-actors", "2"], "--lockstep runs with --num-actors 1, got 2"),
        (["--publish-every", "4"], "--lockstep runs with --publish-every 1, got 4"),
        (["--publish-seconds", "0.5"], "--lockstep runs with --publish-seconds 0, got 0.5"),
        (["--peers", "127.0.0.1:5555", "--algo", "impala"], "a group (--peers) is not in step"),
        (["--resume", "--out", "/nonexistent/run"], "a run resumed (--resume) is not in step"),
        (["--device", "cuda"], "--lockstep runs on the CPU, got --device cuda"),
    ],
)
def test_lockstep_refuses_what_would_put_it_out_of_step(argv, message, capsys):
    with pytest.raises(SystemExit):
        train.parse_args(["--lockstep", *argv])
    assert message in capsys.readouterr().err


def test_the_atari_protocol_is_a_preset_whose_options_win_and_is_named_everywhere(tmp_path, capsys):
    envpool = train.parse_args(["--env", "ALE/Breakout-v5"])
    assert (envpool.protocol, envpool.sticky_actions, envpool.full_action_space) == ("envpool", 0.0, False)
    assert (envpool.noop_max, envpool.episodic_life, envpool.reward_clip) == (30, True, 1.0)
    sticky = train.parse_args(["--env", "ALE/Breakout-v5", "--protocol", "sticky"])
    assert (sticky.protocol, sticky.sticky_actions, sticky.full_action_space) == ("sticky", 0.25, True)
    assert (sticky.noop_max, sticky.episodic_life) == (0, False)
    # an option the command line gives wins over the preset, and the protocol is then custom
    changed = train.parse_args(["--env", "ALE/Breakout-v5", "--protocol", "sticky", "--no-full-action-space"])
    assert (changed.protocol, changed.full_action_space, changed.sticky_actions) == ("custom", False, 0.25)
    assert train.parse_args(["--env", "ALE/Breakout-v5", "--sticky-actions", "0"]).protocol == "envpool"
    # what the nodes get
    env = train.resolve(sticky).env
    assert (env.sticky_actions, env.full_action_space, env.noop_max, env.terminal_on_life_loss) == (
        0.25,
        True,
        0,
        False,
    )
    assert train.resolve(envpool).env.terminal_on_life_loss is True
    # the plan line and config.json
    line = train.summary(sticky, make_plan(sticky))
    assert "sticky protocol: sticky actions 0.25, full action set, no no-ops, no life loss" in line
    out = str(tmp_path / "run")
    job = train.resolve(dataclasses.replace(sticky, out=out))
    train.prepare_run(dataclasses.replace(sticky, out=out), job)
    config = rundir.recorded_config(out)
    assert (config["protocol"], config["sticky_actions"], config["episodic_life"]) == ("sticky", 0.25, False)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--protocol", "dqn"], "argument --protocol: invalid choice: 'dqn'"),
        (["--sticky-actions", "1"], "--sticky-actions must be a probability in [0, 1), got 1.0"),
        (["--noop-max", "-1"], "--noop-max must be >= 0, got -1"),
        (["--env", "CartPole-v1", "--protocol", "sticky"], "--protocol: Atari settings, and CartPole-v1 is not"),
        (["--env", "CartPole-v1", "--no-episodic-life"], "--episodic-life: Atari settings, and CartPole-v1 is not"),
    ],
)
def test_a_protocol_out_of_range_or_off_atari_is_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        train.parse_args(argv)
    assert message in capsys.readouterr().err
