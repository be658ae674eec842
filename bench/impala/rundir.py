"""A training run's folder: its default name, what it records, and when a run may use it.

    runs/<env-slug>-<YYYYmmdd-HHMMSS>/   the default --out: one folder per env and start time
        config.json       every setting of the run (written before launch)
        log.csv, curve.png, checkpoint.pt

A new run never writes into a folder that holds another run (two runs of one env would
mix their logs; of two envs, their checkpoints); ``--resume`` needs a folder that holds
a checkpoint of the same env and model. Every refusal is one line, raised as
``RunDirError`` before anything is launched.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "CHECKPOINT",
    "CONFIG",
    "EPISODES",
    "LOG",
    "RunDirError",
    "check",
    "check_checkpoint",
    "checkpoint_frames",
    "default_out",
    "latest_run",
    "remove_temp_files",
    "run_config",
    "write_config",
]

CONFIG = "config.json"
CHECKPOINT = "checkpoint.pt"
LOG = "log.csv"
EPISODES = "episodes.csv"
RUNS = "runs"


class RunDirError(ValueError):
    """A run folder that this run may not use; the message is one line for the user."""


def env_slug(env_id: str) -> str:
    """``ALE/Pong-v5`` -> ``ale-pong-v5``: an env id as a folder name."""
    return re.sub(r"[^a-z0-9.]+", "-", env_id.lower()).strip("-")


def default_out(env_id: str, root: str = RUNS) -> str:
    return os.path.join(root, f"{env_slug(env_id)}-{time.strftime('%Y%m%d-%H%M%S')}")


def latest_run(env_id: str, root: str = RUNS) -> str | None:
    """The newest folder under ``root`` named for ``env_id`` that holds a checkpoint."""
    runs = [
        d for d in glob.glob(os.path.join(root, f"{env_slug(env_id)}-*")) if os.path.exists(os.path.join(d, CHECKPOINT))
    ]
    return max(runs, default=None)  # the names sort by start time


def recorded_config(out: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(out, CONFIG)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def check(out: str, config: Mapping[str, Any], resume: bool, identity: Sequence[str]) -> None:
    """Raise ``RunDirError`` unless this run may use ``out``: a new run needs a folder
    without a run in it; ``--resume`` one with a checkpoint whose recorded ``identity``
    keys (env, model...) are those of ``config``."""
    recorded = recorded_config(out)
    has_checkpoint = os.path.exists(os.path.join(out, CHECKPOINT))
    if resume:
        if not os.path.isdir(out):
            raise RunDirError(f"--resume: there is no run in {out} (no such folder); give --out the run to continue")
        if not has_checkpoint:
            raise RunDirError(f"--resume: {out} holds no {CHECKPOINT}; nothing to continue (start it without --resume)")
        if recorded is not None:
            differs = [k for k in identity if k in recorded and recorded[k] != config[k]]
            if differs:
                was = ", ".join(f"{k} {recorded[k]!r}" for k in differs)
                now = ", ".join(f"{k} {config[k]!r}" for k in differs)
                raise RunDirError(f"--resume: {out} is a run of {was}; this command asks for {now}")
    elif recorded is not None or has_checkpoint or os.path.exists(os.path.join(out, LOG)):
        what = f"a run of {recorded['env']!r}" if recorded and "env" in recorded else "a run"
        raise RunDirError(f"--out {out} already holds {what}; continue it with --resume or choose another --out")


def run_config(options: Mapping[str, Any], plan: Any) -> dict[str, Any]:
    """config.json: every option, with the plan's choices (``bench.impala.plan.Plan``) in
    place of 0 and auto."""
    return {
        **options,
        "num_actors": plan.num_actors,
        "num_workers": plan.num_workers,
        "envs_per_worker": plan.envs_per_worker,
        "learner_threads": plan.learner_threads,
        "compile": "on" if plan.compile else "off",
        "bf16": "on" if plan.bf16 else "off",
        "pin": "on" if plan.pin else "off",
    }


def write_config(out: str, config: Mapping[str, Any]) -> None:
    """Create ``out`` and write every setting of the run to its ``config.json``."""
    try:
        os.makedirs(out, exist_ok=True)
        tmp = os.path.join(out, f"{CONFIG}.tmp.{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump(dict(config), f, indent=2)
            f.write("\n")
        os.replace(tmp, os.path.join(out, CONFIG))
    except OSError as e:
        raise RunDirError(f"--out {out}: cannot write there ({e.strerror or e})") from None


def check_checkpoint(out: str, model: torch.nn.Module, settings: str) -> int:
    """The frames of ``out``'s checkpoint, after checking that it holds ``model``'s
    parameters (``settings``: the options that built ``model``, for the message)."""
    path = os.path.join(out, CHECKPOINT)
    try:
        import torch  # here: reading a run's files needs no torch

        state = torch.load(path, map_location="cpu", weights_only=False)
        theirs = {k: tuple(v.shape) for k, v in state["model"].items()}
        frames = int(state["frames"])
    except Exception as e:  # a truncated or foreign file: torch, pickle and zipfile raise many kinds
        raise RunDirError(f"--resume: cannot read {path} ({type(e).__name__}: {e})") from None
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if theirs != ours:
        differs = sorted(set(theirs) ^ set(ours)) or [k for k in ours if ours[k] != theirs[k]]
        raise RunDirError(
            f"--resume: {path} holds another network than {settings} builds "
            f"({len(differs)} parameters differ, first {differs[0]!r}); resume with the run's own settings"
        )
    return frames


def checkpoint_frames(out: str) -> int | None:
    """The frames of ``out``'s checkpoint; None without one."""
    try:
        import torch

        return int(torch.load(os.path.join(out, CHECKPOINT), map_location="cpu", weights_only=False)["frames"])
    except Exception:  # no checkpoint, or one cut short by a kill
        return None


def remove_temp_files(out: str) -> None:
    """Remove the ``checkpoint.pt.tmp.<pid>`` a learner killed mid-save leaves behind."""
    for path in glob.glob(os.path.join(glob.escape(out), f"{CHECKPOINT}.tmp.*")):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
