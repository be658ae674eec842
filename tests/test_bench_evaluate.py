"""bench.evaluate: a run's checkpoint plays fresh episodes with the sampled and the greedy
policy; the returns are the game's true score; figures go to the terminal and eval.csv;
--gif writes the first episode; a folder that is not a run is a one-line error."""

from __future__ import annotations

import csv
import json
import os

import imageio.v2 as imageio
import pytest
import torch

from actors import EnvConfig
from bench.evaluate import play
from learners import make_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_folder(path, env="CartPole-v1", model="mlp", frames=1234):
    os.makedirs(path, exist_ok=True)
    spec = EnvConfig(env).spec()
    torch.manual_seed(0)
    net = make_model(model, spec.obs_shape, spec.num_actions)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"env": env, "model": model, "use_lstm": False, "full_action_space": False}, f)
    torch.save({"model": net.state_dict(), "frames": frames}, os.path.join(path, "checkpoint.pt"))
    return net


class AlwaysLeft(torch.nn.Module):
    """A CartPole policy whose greedy action is always 0: the pole falls in ~10 steps."""

    use_lstm = False

    def forward(self, obs, done=None, core_state=()):
        T, B = obs.shape[:2]
        logits = torch.tensor([5.0, -5.0]).expand(T, B, 2)
        return type("Out", (), {"policy_logits": logits, "core_state": ()})()


def test_returns_are_the_true_score_and_greedy_is_deterministic():
    env = EnvConfig("CartPole-v1")
    greedy = play.play(env, AlwaysLeft(), episodes=3, greedy=True, seed=1)
    assert all(8 <= r <= 12 for r in greedy), greedy  # CartPole pays 1 per step until the pole falls
    assert play.play(env, AlwaysLeft(), episodes=3, greedy=True, seed=1) == greedy
    capped = play.play(env, AlwaysLeft(), episodes=2, greedy=True, seed=1, max_steps=5)
    assert capped == [5.0, 5.0]  # cut after 5 steps, counted with the score it had


def test_main_prints_both_policies_and_appends_eval_csv(tmp_path, capsys):
    run = tmp_path / "run"
    _run_folder(run)
    assert play.main([str(run), "--episodes", "3"]) == 0
    assert play.main([str(run), "--episodes", "2", "--policy", "greedy"]) == 0
    out = capsys.readouterr().out
    assert f"evaluating {run} (CartPole-v1, model mlp, 1,234 frames)" in out
    assert " sampled: 3 episodes, return mean" in out and "  greedy: 2 episodes, return mean" in out
    with open(run / "eval.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["policy"], r["episodes"], r["frames"]) for r in rows] == [
        ("sampled", "3", "1234"),
        ("greedy", "3", "1234"),
        ("greedy", "2", "1234"),
    ]
    for r in rows:
        assert float(r["min"]) <= float(r["median"]) <= float(r["max"]) and float(r["min"]) >= 1


def test_an_atari_run_is_played_under_its_protocol_over_whole_games(tmp_path, capsys):
    run = tmp_path / "run"
    _run_folder(run, env="ALE/Pong-v5", model="shallow", frames=7)
    with open(run / "config.json") as f:
        config = json.load(f)
    config.update(protocol="sticky", sticky_actions=0.25, full_action_space=True, noop_max=0, episodic_life=False)
    with open(run / "config.json", "w") as f:
        json.dump(config, f)
    with pytest.raises(RuntimeError):  # the folder's model has Pong's minimal 6 actions, not the full 18
        play.load_run(str(run))
    _run_folder(run, env="ALE/Pong-v5", model="shallow", frames=7)
    config.update(full_action_space=False, episodic_life=True, protocol="custom")
    with open(run / "config.json", "w") as f:
        json.dump(config, f)
    _, env, _, _ = play.load_run(str(run))
    assert (env.sticky_actions, env.noop_max, env.full_action_space) == (0.25, 0, False)
    assert env.terminal_on_life_loss is False  # whole games, whatever the training did
    # a run from before the protocol was a setting: no sticky actions, 30 no-ops, no life loss
    _run_folder(run, env="ALE/Pong-v5", model="shallow", frames=7)
    assert play.main([str(run), "--episodes", "1", "--max-steps", "50", "--policy", "greedy"]) == 0
    out = capsys.readouterr().out
    assert "custom protocol: sticky actions 0, minimal action set, up to 30 no-ops, no life loss" in out


def test_gif_of_an_atari_episode(tmp_path):
    run = tmp_path / "pong"
    _run_folder(run, env="ALE/Pong-v5", model="shallow")
    gif = tmp_path / "pong.gif"
    args = [str(run), "--episodes", "1", "--policy", "greedy", "--max-steps", "60", "--gif", str(gif)]
    assert play.main(args) == 0
    frames = imageio.mimread(gif)
    # every second step, the RGB screen (the GIF writer merges identical frames: the serve's first ones are)
    assert 15 <= len(frames) <= 30 and frames[0].shape[:2] == (210, 160)


def test_not_a_run_is_a_one_line_error(tmp_path, capsys):
    assert play.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m bench.evaluate: error: {tmp_path} is not a bench.impala run with a checkpoint")
    with pytest.raises(SystemExit):
        play.parse_args([str(tmp_path), "--episodes", "0"])


@pytest.mark.slow
def test_the_published_pong_checkpoint_loads_and_plays_well(tmp_path):
    """The published ResNet with the last action and reward as inputs: loaded from its run
    folder as a user would, it wins points from the start (+4 to +6 in 700 steps at seeds
    0-2; with its policy head scrambled it scored -16)."""
    config, env, model, frames = play.load_run(os.path.join(ROOT, "docs", "results", "pong-h200-deep"))
    assert config["env"] == "ALE/Pong-v5" and config["last_action_reward"] and frames > 30_000_000
    returns = play.play(env, model, episodes=1, greedy=False, max_steps=700, seed=0)
    assert returns[0] >= 2
