"""DreamerV3's parallel launcher (``embodied/run/parallel.py``) in miniature, runnable on
portal or on ``shmpad.portal`` with only the import changed.

Its processes and calls are DreamerV3's: an actor ``BatchServer`` answers the ``act``
calls of the environments in batches of ``--batch`` and hands each batch's transitions
to the replay and the logger from its done function; a replay ``Server`` whose
``sample`` blocks until ``--replay-min`` transitions arrived (on its own worker, as
DreamerV3's rate limiter does); a logger ``Server``; a learner that streams samples two
ahead; environment processes with ``autoconn=False`` clients that reconnect after
``Disconnected``; all under ``run``. The agent is a stand-in (the action is read off
the observation): the calls, shapes and processes are what is modelled.

It stops through the error file, as a DreamerV3 program stops on an error: once the
learner has trained ``--steps`` steps it writes the error file, every process watching
it exits with code 2, and ``run`` raises. With ``--restart-after N`` the actor closes
its server after N batches and serves again on the same port, so that every
environment sees ``Disconnected`` and reconnects; the learner then also waits, before
the stop, until the logger has counted a reconnect of every environment. ``--tcp-envs 0,2`` makes those
environments call the actor over TCP, as if from another host. ``--close-timeout S``
bounds that restart's close: portal 3.8.3's ``BatchServer.close`` closes its inner
server before its batcher has had every batch it forwarded answered, so a batch forwarded in that
window is never answered and the close waits for ever without a bound
(docs/results/portal-close-race).

    python -m bench.portal.launcher --logdir /tmp/run --envs 4 --batch 4 --steps 20

Each process leaves its pid in ``LOGDIR/pids/`` and the logger keeps its counts (and
``actor/close_s``, the seconds the restart's close took) in
``LOGDIR/logger.json`` (the tests read both).
"""

from __future__ import annotations

import argparse
import collections
import importlib
import json
import os
import pathlib
import threading
import time

import numpy as np

__all__ = ["main", "parse"]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.portal.launcher", description=__doc__.split("\n\n")[0])
    p.add_argument("--logdir", required=True, help="where the error file, the pids and the logger's counts go")
    p.add_argument("--impl", default="shmpad.portal", help="the module to run on: shmpad.portal or portal")
    p.add_argument("--envs", type=int, default=4, help="environment processes")
    p.add_argument("--batch", type=int, default=4, help="the actor's batch (act calls per policy step)")
    p.add_argument("--steps", type=int, default=20, help="learner steps before the program stops itself")
    p.add_argument("--replay-min", type=int, default=64, help="transitions the replay holds before sample() returns")
    p.add_argument("--sample", type=int, default=8, help="transitions per sampled batch")
    p.add_argument("--size", type=int, default=64, help="observation images are SIZE x SIZE x 3 uint8")
    p.add_argument("--restart-after", type=int, default=0, help="the actor restarts its server after this many batches")
    p.add_argument(
        "--close-timeout",
        type=float,
        default=None,
        help="seconds the actor's restart waits for its old server to close (default: no bound)",
    )
    p.add_argument("--tcp-envs", default="", help="comma-separated ids of environments that call over TCP")
    p.add_argument("--interval", type=float, default=0.2, help="seconds between looks at the error file")
    return p.parse_args(argv)


def _record(args: argparse.Namespace, name: str) -> None:
    pids = pathlib.Path(args.logdir) / "pids"
    pids.mkdir(exist_ok=True)
    (pids / f"{name}-{os.getpid()}").touch()


def actor(args, ports):
    portal = importlib.import_module(args.impl)
    _record(args, "actor")
    replay = portal.Client(f"127.0.0.1:{ports['replay']}", "ActorReplay", maxinflight=8)
    logger = portal.Client(f"127.0.0.1:{ports['logger']}", "ActorLogger", maxinflight=8)
    batches = [0]
    enough = threading.Event()

    def workfn(obs):
        envid = obs.pop("envid")
        assert envid.shape == (args.batch,), envid.shape
        action = (obs["image"].reshape(args.batch, -1)[:, 0] % 4).astype(np.int32)
        trans = {"envid": envid, **obs, "action": action}
        [x.setflags(write=False) for x in trans.values()]
        return {"action": action, "reset": obs["is_last"].copy()}, trans

    def donefn(trans):
        replay.add_batch(trans)
        logger.tran({k: v for k, v in trans.items() if k != "image"})
        batches[0] += 1
        if args.restart_after and batches[0] >= args.restart_after:
            enough.set()

    server = portal.BatchServer(ports["actor"], name="Actor")
    server.bind("act", workfn, donefn, args.batch, 1)
    if args.restart_after:
        server.start(block=False)
        enough.wait()
        began = time.monotonic()
        server.close(args.close_timeout)  # every environment's link breaks: they reconnect to the next server
        logger.add({"actor/restarts": 1, "actor/close_s": time.monotonic() - began})
        server = portal.BatchServer(ports["actor"], name="Actor")
        server.bind("act", workfn, donefn, args.batch, 1)
    server.start()


def replay(args, ports):
    portal = importlib.import_module(args.impl)
    _record(args, "replay")
    items: collections.deque = collections.deque(maxlen=10_000)
    ready = threading.Condition()
    rng = np.random.default_rng(0)

    def add_batch(trans):
        with ready:
            for i in range(len(trans["envid"])):
                items.append({k: v[i] for k, v in trans.items()})
            ready.notify_all()
        return {}

    def sample():
        with ready:  # blocks, as DreamerV3's rate limiter does, until there is enough
            ready.wait_for(lambda: len(items) >= args.replay_min)
            chosen = [items[i] for i in rng.integers(0, len(items), args.sample)]
        return {k: np.stack([c[k] for c in chosen]) for k in chosen[0]}

    server = portal.Server(ports["replay"], name="Replay")
    server.bind("add_batch", add_batch, workers=1)
    server.bind("sample", sample, workers=1)
    server.start()


def logger(args, ports):
    portal = importlib.import_module(args.impl)
    _record(args, "logger")
    counts: collections.Counter = collections.Counter()
    path = pathlib.Path(args.logdir) / "logger.json"

    def dump():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(counts))
        os.replace(tmp, path)

    def add(metrics):
        for key, value in metrics.items():
            if isinstance(value, str):
                counts[key] = value
            elif key.endswith(("restarts", "reconnects")):
                counts[key] += float(value)
            else:
                counts[key] = float(value)
        dump()

    def tran(trans):
        counts["env_steps"] += len(trans["envid"])
        counts["episodes"] += int(trans["is_last"].sum())
        if counts["env_steps"] % (16 * args.batch) == 0:
            dump()

    server = portal.Server(ports["logger"], name="Logger")
    server.bind("add", add)
    server.bind("tran", tran)
    server.bind("reconnected", lambda: sum(1 for k in counts if k.endswith("/reconnects")))
    server.start()


def learner(args, ports):
    portal = importlib.import_module(args.impl)
    _record(args, "learner")
    replay = portal.Client(f"127.0.0.1:{ports['replay']}", "LearnerReplay")
    logger = portal.Client(f"127.0.0.1:{ports['logger']}", "LearnerLogger", maxinflight=1)
    futures = collections.deque([replay.sample() for _ in range(2)])
    for step in range(args.steps):
        futures.append(replay.sample())
        batch = futures.popleft().result()
        assert batch["image"].shape == (args.sample, args.size, args.size, 3), batch["image"].shape
        logger.add({"train/steps": step + 1}).result()
    while args.restart_after and logger.reconnected().result() < args.envs:
        time.sleep(0.05)  # the restart is what this run is for: every environment reconnects before the stop
    # the program-wide stop: every process watching the error file ends
    errfile = pathlib.Path(args.logdir) / "error"
    errfile.write_text(f"learner finished {args.steps} steps")
    while True:
        time.sleep(1)  # until the watcher ends this process too


def env(envid, args, ports):
    portal = importlib.import_module(args.impl)
    _record(args, f"env{envid}")
    if str(envid) in args.tcp_envs.split(","):
        os.environ["SHMPAD_TRANSPORT"] = "tcp"  # this process's calls go over TCP, as from another host
    logger = portal.Client(f"127.0.0.1:{ports['logger']}", f"Env{envid}Logger", maxinflight=1)
    actor = portal.Client(f"127.0.0.1:{ports['actor']}", f"Env{envid}", autoconn=False)
    actor.connect()
    # (portal's Client has no ``transport``: an unknown attribute is a method call there; it is all TCP)
    kind = actor.transport if hasattr(type(actor), "transport") else "tcp"
    logger.add({f"transport/env{envid}": kind})
    rng = np.random.default_rng(envid)
    done, length = True, 0
    while True:
        length = 0 if done else length + 1
        obs = {
            "image": rng.integers(0, 255, (args.size, args.size, 3), np.uint8),
            "reward": np.float32(rng.normal()),
            "is_first": done,
            "is_last": length == 49,
            "is_terminal": False,
        }
        try:
            act = actor.act({"envid": envid, **obs}).result()
            done = bool(act["reset"]) or obs["is_last"]
        except portal.Disconnected:
            logger.add({f"env{envid}/reconnects": 1})
            actor.connect()
            done = True


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    portal = importlib.import_module(args.impl)
    logdir = pathlib.Path(args.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    portal.setup(errfile=logdir / "error", interval=args.interval)
    ports: dict = {}
    while len(set(ports.values())) < 3:  # free_port() may name one port twice
        ports = {name: portal.free_port() for name in ("actor", "replay", "logger")}
    workers = [
        portal.Process(logger, args, ports, name="logger"),
        portal.Process(replay, args, ports, name="replay"),
        portal.Process(actor, args, ports, name="actor"),
        portal.Process(learner, args, ports, name="learner"),
    ]
    workers += [portal.Process(env, i, args, ports, name=f"env{i}") for i in range(args.envs)]
    portal.run(workers)


if __name__ == "__main__":
    main()
