"""bench.learn.games' mechanics, on run folders the tests write (no training): the score at
each mark is the mean of the last 100 games ended by it, or "not reached" with the frames the
run stopped at; the frames to a target are those of the first game whose window reached it,
its minutes the run's first log row at or after them; the protocol is named from config.json
and described setting by setting, and a reference is compared only under its own protocol;
the table is built again from the folders alone; bad options are refused naming the value;
each game runs as bench.learn with its target, past it, resumed where it has runs."""

from __future__ import annotations

import json

import pytest

from bench.learn import __main__ as learn
from bench.learn import games, table
from bench.learn.targets import TARGETS

ENVPOOL = {"protocol": "envpool", "sticky_actions": 0.0, "full_action_space": False, "noop_max": 30}
ENVPOOL |= {"episodic_life": True, "reward_clip": 1.0}
STICKY = {"protocol": "sticky", "sticky_actions": 0.25, "full_action_space": True, "noop_max": 0}
STICKY |= {"episodic_life": False, "reward_clip": 1.0}
FRAMES_PER_GAME = 50_000


def make_run(folder, env: str, config: dict, returns: list[float], seconds_per_million: float = 6.0) -> None:
    """A run folder as bench.impala leaves it: game i ends at (i + 1) x 50,000 frames with
    ``returns[i]``; a log row every 1M frames up to the last game, at 6 s per 1M frames."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"env": env, **config}))
    rows = "".join(f"{(i + 1) * FRAMES_PER_GAME},{r},700\r\n" for i, r in enumerate(returns))
    (folder / "episodes.csv").write_text("frames,return,steps\r\n" + rows)
    last = len(returns) * FRAMES_PER_GAME
    log = "".join(f"{k * 1_000_000},{k * seconds_per_million},,\n" for k in range(1, last // 1_000_000 + 1))
    (folder / "log.csv").write_text("frames,seconds,fps,mean_return\n" + log)


def slow_mean_at(returns: list[float], mark: int) -> float:
    """The mean of the last 100 games that ended at or before ``mark``, written out plainly."""
    ended = [r for i, r in enumerate(returns) if (i + 1) * FRAMES_PER_GAME <= mark]
    last = ended[len(ended) - 100 :]
    return sum(last) / len(last)


@pytest.fixture
def kept(tmp_path):
    """Breakout, seeds 0 and 1, envpool protocol: seed 0 to 50M frames, seed 1 stopped at 25M;
    bench.learn's summary.json beside them. Pong, seed 0, sticky protocol, stopped at 5M."""
    out = tmp_path / "games"
    seed0 = [float(i) for i in range(1000)]  # window means i - 49.5: 400 first at game 450
    seed1 = [2.0 * i for i in range(500)]  # 2 (i - 49.5): 400 first at game 250
    make_run(out / "ale-breakout-v5" / "seed-0", "ALE/Breakout-v5", ENVPOOL, seed0)
    make_run(out / "ale-breakout-v5" / "seed-1", "ALE/Breakout-v5", ENVPOOL, seed1)
    summary = {
        "machine": {"cpu": "test cpu", "cpus": 2},
        "runs": [{"seed": 0, "reached": {"400": {"frames": 22_550_000, "seconds": 150.0}}}, {"seed": 1, "reached": {}}],
    }
    (out / "ale-breakout-v5" / "summary.json").write_text(json.dumps(summary))
    make_run(out / "ale-pong-v5" / "seed-0", "ALE/Pong-v5", STICKY, [-21.0 + i / 10 for i in range(100)])
    return out, seed0, seed1


def test_scores_at_the_marks_and_frames_and_minutes_to_the_target(kept):
    out, seed0, seed1 = kept
    breakout = table.read_game(str(out / "ale-breakout-v5"), "ALE/Breakout-v5", [10_000_000, 40_000_000], 100)
    s0, s1 = breakout["seeds"]
    assert s0["frames"] == 50_000_000 and s1["frames"] == 25_000_000
    assert s0["marks"][10_000_000] == {"reached": True, "mean": slow_mean_at(seed0, 10_000_000), "games": 100}
    assert s0["marks"][10_000_000]["mean"] == 149.5  # games 100..199
    assert s0["marks"][40_000_000]["mean"] == slow_mean_at(seed0, 40_000_000) == 749.5
    assert s1["marks"][10_000_000]["mean"] == slow_mean_at(seed1, 10_000_000) == 299.0
    assert s1["marks"][40_000_000] == {"reached": False, "ran_to": 25_000_000}
    # the first window at 400: seed 0's game 450 ends at 22.55M frames, its first log row after is 23M (138 s)
    assert breakout["target"]["score"] == 400 and "rl_games" in breakout["target"]["why"]
    assert s0["target"] == {"frames": 22_550_000, "seconds": 138.0, "wall_seconds": 150.0}
    assert s1["target"] == {"frames": 12_550_000, "seconds": 78.0}  # game 250; no wall-clock in the summary
    assert breakout["machine"] == {"cpu": "test cpu", "cpus": 2}

    text = table.table([breakout], [10_000_000, 40_000_000], 100, "python -m bench.learn.games --table-only")
    row = next(line for line in text.splitlines() if line.startswith("| ALE/Breakout-v5 |"))
    cells = [c.strip() for c in row.strip("|").split(" | ")]
    assert cells[2] == "2 (0, 1)"
    assert cells[3] == "median 224.2 (seed 0: 149.5, seed 1: 299.0)"
    assert cells[4] == "seed 0: 749.5, seed 1: not reached: ran to 25.00M frames"  # no median without seed 1's
    assert cells[6] == "median 17.55M (seed 0: 22.55M, seed 1: 12.55M)"
    assert cells[7] == "seed 0: 2.3 (wall-clock 2.5), seed 1: 1.3"


def test_a_run_short_of_a_mark_and_of_its_target(kept):
    out, _, _ = kept
    (out / "ale-breakout-v5" / "summary.json").unlink()
    (out / "ale-breakout-v5" / "seed-0").rename(out / "seed-0-elsewhere")  # seed 1 alone
    breakout = table.read_game(str(out / "ale-breakout-v5"), "ALE/Breakout-v5", [10_000_000, 40_000_000], 100, 1e6)
    (s1,) = breakout["seeds"]
    assert s1["target"] is None and breakout["target"] == {"score": 1e6, "why": "given with --target"}
    text = table.table([breakout], [10_000_000, 40_000_000], 100, "cmd")
    cells = next(line for line in text.splitlines() if line.startswith("| ALE/Breakout")).strip("|").split(" | ")
    assert [c.strip() for c in cells[3:8]] == [
        "299.0",
        "not reached: ran to 25.00M frames",
        "1,000,000 (given with --target)",
        "not reached: ran to 25.00M frames",
        "not reached",
    ]


def test_the_protocol_is_named_and_a_reference_compared_only_under_its_own(kept):
    out, _, _ = kept
    marks = [10_000_000, 40_000_000]
    breakout = table.read_game(str(out / "ale-breakout-v5"), "ALE/Breakout-v5", marks, 100)
    pong = table.read_game(str(out / "ale-pong-v5"), "ALE/Pong-v5", marks, 100)
    assert breakout["protocol"]["name"] == "envpool"
    assert breakout["protocol"]["description"] == (
        "envpool protocol: sticky actions 0, minimal action set, up to 30 no-ops, life loss ends a training "
        "episode, rewards clipped to +-1; returns are whole games"
    )
    assert pong["protocol"]["name"] == "sticky"
    assert pong["protocol"]["description"].startswith(
        "sticky protocol: sticky actions 0.25, full action set, no no-ops"
    )
    assert all(r["comparable"] for r in breakout["references"])
    assert pong["target"] is None and pong["references"] and not any(r["comparable"] for r in pong["references"])
    assert pong["seeds"][0]["marks"][10_000_000] == {"reached": False, "ran_to": 5_000_000}

    text = table.table([breakout, pong], marks, 100, "cmd")
    pong_row = next(line for line in text.splitlines() if line.startswith("| ALE/Pong-v5 |"))
    assert "sticky protocol: sticky actions 0.25" in pong_row and "(config.json: sticky)" in pong_row
    assert "| no target | no target |" in pong_row and "| none |" in pong_row
    assert "(under the envpool protocol: not comparable with this run)" in pong_row
    assert "[1] CleanRL PPO (ppo_atari_envpool_xla_jax.py): 430.09 +- 8.12 at 40M frames, 42.35 min, 3 seeds" in text
    assert "[3] rl_games PPO in EnvPool's demo notebook: 18.07 at 4.26M frames, minutes not stated, 1 seed" in text
    assert "[1] CleanRL PPO (ppo_atari_envpool_xla_jax.py): 20.39 +- 0.24 at 40M frames" in pong_row  # one note each
    notes = text.split("## References")[1]
    assert notes.count("35896b1fefa9898b904f7e09bcbe6e168e15d2a9") == 1 and "EnvPool presses FIRE" in notes


def test_a_run_from_before_the_protocol_setting_says_so(tmp_path):
    config = {"env": "ALE/Breakout-v5", "reward_clip": 1.0, "full_action_space": False}  # as docs/results/pong-h200's
    entry = table.protocol_entry(config)
    assert entry["name"] is None
    assert entry["description"].startswith(
        "custom protocol: sticky actions 0, minimal action set, up to 30 no-ops, no life loss"
    )
    assert entry["description"].endswith("(recorded before the protocol was a setting)")
    assert table.protocol_entry({"env": "CartPole-v1"}) == {
        "name": None,
        "description": "CartPole-v1 is not an Atari game: no protocol",
    }


def test_table_only_builds_the_table_from_the_folders_alone(kept, capsys):
    out, _, _ = kept
    assert games.main(["--table-only", "--out", str(out), "--games", "ALE/Pong-v5,ALE/Breakout-v5"]) == 0
    report = json.loads((out / "games.json").read_text())
    assert [g["game"] for g in report["games"]] == ["ALE/Pong-v5", "ALE/Breakout-v5"]  # the order given
    assert report["marks"] == [10_000_000, 40_000_000] and report["window"] == 100
    md = (out / "games.md").read_text()
    assert md == capsys.readouterr().out.rstrip("\n") + "\n"
    assert (
        md.startswith("# bench.learn.games: 2 game(s)") and "Command: `python -m bench.learn.games --table-only" in md
    )
    assert games.main(["--table-only", "--out", str(out)]) == 0  # every game in the folder, by folder name
    assert [g["game"] for g in json.loads((out / "games.json").read_text())["games"]] == [
        "ALE/Breakout-v5",
        "ALE/Pong-v5",
    ]
    assert games.main(["--table-only", "--out", str(out), "--marks", "1M", "--target", "ALE/Pong-v5=-17"]) == 0
    pong = json.loads((out / "games.json").read_text())["games"][1]  # its one window of 100 games: -16.05
    assert pong["target"]["score"] == -17 and pong["seeds"][0]["target"] == {"frames": 5_000_000, "seconds": 30.0}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--games", ""], "--games must name at least one game (gymnasium ids, comma-separated), got ''"),
        (["--games", " , "], "--games must name at least one game (gymnasium ids, comma-separated), got ' , '"),
        (
            ["--games", "ALE/Breakot-v5"],
            "--games: unknown environment id 'ALE/Breakot-v5'; did you mean 'ALE/Breakout-v5'",
        ),
        (["--games", "ALE/Pong-v5,ALE/Pong-v5"], "--games names a game twice: ALE/Pong-v5,ALE/Pong-v5"),
        (
            ["--games", "ALE/Alien-v5"],
            "--games: no target for ALE/Alien-v5 under the envpool protocol in bench/learn/targets.py (it has "
            "ALE/BeamRider-v5, ALE/Breakout-v5, ALE/Pong-v5, ALE/Qbert-v5, ALE/Seaquest-v5, ALE/SpaceInvaders-v5); "
            "give one with --target ALE/Alien-v5=SCORE",
        ),
        (
            ["--games", "ALE/Pong-v5", "--", "--protocol", "sticky"],
            "no target for ALE/Pong-v5 under the sticky protocol",
        ),
        (["--games", "ALE/Pong-v5", "--target", "ALE/Pong-v5=x"], "--target takes GAME=SCORE, got 'ALE/Pong-v5=x'"),
        (
            ["--games", "ALE/Pong-v5", "--target", "ALE/Qbert-v5=1"],
            "'ALE/Qbert-v5' is not one of the games (ALE/Pong-v5)",
        ),
        (
            ["--games", "ALE/Pong-v5", "--marks", "2X"],
            "--marks takes frame counts (10M, 500K, 5e6) separated by commas, got '2X'",
        ),
        (
            ["--games", "ALE/Pong-v5", "--frames", "1M,2M"],
            "--frames takes one frame count (10M, 500K, 5e6), got '1M,2M'",
        ),
        (["--games", "ALE/Pong-v5", "--", "--algo", "ppo"], "ALE/Pong-v5: bench.impala refused the flags '--algo ppo'"),
        (["--games", "ALE/Pong-v5", "--", "--seed", "3"], "--seed: bench.learn sets it for every run"),
        (["--table-only", "--out", "/nonexistent/games"], "give a folder, got '/nonexistent/games'"),
    ],
)
def test_mistakes_are_refused_naming_the_value(argv, message, capsys):
    with pytest.raises(SystemExit):
        games.parse_args(argv)
    assert message in capsys.readouterr().err


def test_table_only_refuses_a_game_it_has_no_runs_of(kept, tmp_path, capsys):
    out, _, _ = kept
    with pytest.raises(SystemExit):
        games.parse_args(["--table-only", "--out", str(out), "--games", "ALE/Qbert-v5"])
    assert f"--table-only: no runs of ALE/Qbert-v5 in {out} (it holds ALE/Breakout-v5, ALE/Pong-v5)" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        games.parse_args(["--table-only", "--out", str(tmp_path)])  # tmp_path holds games/, itself no game
    assert f"--table-only: {tmp_path} holds no game's runs" in capsys.readouterr().err


def test_each_game_runs_as_bench_learn_past_its_target_and_resumes_where_it_has_runs(kept, monkeypatch, capsys):
    """bench.learn's main stands in for the runs: it records its command line and, for a new game,
    leaves a run folder as a run would; the second game's stops as Ctrl+C would stop it."""
    out, _, _ = kept
    for seed in (0, 1):
        (out / "ale-breakout-v5" / f"seed-{seed}" / "checkpoint.pt").write_bytes(b"")
    calls = []

    def fake_main(argv):
        calls.append(argv)
        if "ALE/Qbert-v5" in argv:
            make_run(out / "ale-qbert-v5" / "seed-0", "ALE/Qbert-v5", ENVPOOL, [100.0] * 300)
            raise KeyboardInterrupt
        return 0

    monkeypatch.setattr(learn, "main", fake_main)
    argv = ["--games", "ALE/Breakout-v5,ALE/Qbert-v5", "--seeds", "2", "--out", str(out), "--resume"]
    with pytest.raises(KeyboardInterrupt):
        games.main([*argv, "--frames", "60M", "--", "--log-interval", "5"])
    breakout, qbert = calls
    assert breakout[:4] == ["--env", "ALE/Breakout-v5", "--targets", "400.0"]
    assert breakout[breakout.index("--out") + 1] == str(out / "ale-breakout-v5")
    assert breakout[breakout.index("--frames") + 1] == "60000000" and breakout[breakout.index("--seeds") + 1] == "2"
    assert "--keep-going" in breakout and "--resume" in breakout and breakout[-3:] == ["--", "--log-interval", "5"]
    assert qbert[:4] == ["--env", "ALE/Qbert-v5", "--targets", "17246.27"]
    assert TARGETS["ALE/Qbert-v5", "envpool"].score == 17246.27
    assert "--resume" not in qbert  # a game without runs in --out starts
    report = json.loads((out / "games.json").read_text())  # written after the stop all the same
    assert [g["game"] for g in report["games"]] == ["ALE/Breakout-v5", "ALE/Qbert-v5"]
    assert report["games"][1]["seeds"][0]["marks"]["40000000"] == {"reached": False, "ran_to": 15_000_000}
    calls.clear()
    with pytest.raises(SystemExit):
        games.main(["--games", "ALE/Breakout-v5", "--out", str(out)])  # without --resume: the folder is taken
    assert "the folder is not empty (--resume continues its runs)" in capsys.readouterr().err
    assert calls == []
    assert games.main(["--games", "ALE/Breakout-v5", "--out", str(out / "new"), "--stop-at-target"]) == 0
    assert "--keep-going" not in calls[0] and "--resume" not in calls[0]
