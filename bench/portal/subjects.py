"""The calls ``python -m bench.portal`` measures, written once against portal's API and
run on whichever implementation ``--peer`` names (``peers``), one measurement per fresh
interpreter::

    python -m bench.portal.subjects --peer shmpad.portal --pattern roundtrip --seconds 2

prints one JSON line. The patterns:

- ``roundtrip``: a ``Server`` in a worker process with one method, ``echo(x)`` of a
  64-byte ``bytes``; the measuring process calls ``client.echo(x).result()`` one call at
  a time. Reported in microseconds per call.
- ``actor``: DreamerV3's actor pattern. A ``BatchServer`` in a worker process binds
  ``act`` with ``batch=B`` and a done function; ``E`` environment processes each loop
  ``client.act({'envid', 'image': 64x64x3 uint8, 'reward', 'is_first', 'is_last',
  'is_terminal'}).result()``, as DreamerV3's ``parallel_env`` does, and count their steps
  in a shared array; each checks that its answer is its own (the action the server derives
  from that environment's image, no reset) and counts the ones that are not. Reported in
  environment steps per second over the window, which starts once every environment has
  stepped (so start-up, spawning included, is not in it), with how many environments
  stepped in it and the wrong answers.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time

import numpy as np

from bench.portal.peers import PEERS

__all__ = ["roundtrip", "actor", "main"]

START_S = 180.0
"""how long the environments may take to start and make their first step (portal spawns each)"""


def _peer(name: str):
    return next(p for p in PEERS if p.name == name)


def _echo_server(module: str, port: int, server_kw: dict) -> None:
    portal = importlib.import_module(module)
    server = portal.Server(port, "Echo", workers=1, **server_kw)
    server.bind("echo", lambda x: x)
    server.start()


def roundtrip(peer_name: str, seconds: float) -> dict:
    peer = _peer(peer_name)
    portal = importlib.import_module(peer.module)
    port = portal.free_port()
    server = portal.Process(_echo_server, peer.module, port, peer.server_kw, start=True)
    try:
        client = portal.Client(f"127.0.0.1:{port}", "Bench", **peer.client_kw)
        client.connect()
        payload = bytes(range(64))
        for _ in range(200):
            client.echo(payload).result()
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in range(50):
                assert bytes(client.echo(payload).result()) == payload
            calls += 50
        elapsed = time.perf_counter() - start
        client.close()
    finally:
        server.kill()
    return {"calls": calls, "seconds": elapsed, "us_per_call": elapsed / calls * 1e6}


def _actor_server(module: str, port: int, batch: int, server_kw: dict) -> None:
    portal = importlib.import_module(module)
    done = [0]

    def act(obs):
        envid = obs["envid"]
        assert envid.shape == (batch,)
        action = obs["image"].reshape(batch, -1)[:, 0].astype(np.int32)  # each env's first byte
        return {"action": action, "reset": obs["is_last"].copy()}, {"n": batch}

    def donefn(info):
        done[0] += info["n"]

    server = portal.BatchServer(port, "Actor", **server_kw)
    server.bind("act", act, donefn, batch, 1)
    server.start()


def _env(module: str, port: int, envid: int, steps, wrong, size: int, client_kw: dict) -> None:
    portal = importlib.import_module(module)
    client = portal.Client(f"127.0.0.1:{port}", f"Env{envid}", autoconn=False, **client_kw)
    client.connect()
    rng = np.random.default_rng(envid)
    image = rng.integers(0, 255, (size, size, 3), np.uint8)
    image.reshape(-1)[0] = expected = envid % 256  # the server answers it: another env's row shows
    n = 0
    while True:
        obs = {
            "envid": envid,
            "image": image,
            "reward": np.float32(n % 7),
            "is_first": n == 0,
            "is_last": False,
            "is_terminal": False,
        }
        try:
            out = client.act(obs).result()
        except portal.Disconnected:
            client.connect()  # as DreamerV3's environments do
            continue
        if int(out["action"]) != expected or bool(out["reset"]):  # another env's row, or garbled
            wrong[envid] += 1
        n += 1
        steps[envid] = n


def actor(peer_name: str, seconds: float, envs: int = 16, batch: int = 16, size: int = 64) -> dict:
    peer = _peer(peer_name)
    portal = importlib.import_module(peer.module)
    port = portal.free_port()
    steps = portal.context.mp.Array("q", envs, lock=False)
    wrong = portal.context.mp.Array("q", envs, lock=False)
    workers = [portal.Process(_actor_server, peer.module, port, batch, peer.server_kw, start=True)]
    try:
        workers += [
            portal.Process(_env, peer.module, port, i, steps, wrong, size, peer.client_kw, start=True)
            for i in range(envs)
        ]
        deadline = time.monotonic() + START_S
        while min(steps) == 0:  # every environment is connected and has stepped
            if time.monotonic() > deadline or any(w.exitcode not in (None,) for w in workers):
                codes = [w.exitcode for w in workers]
                raise RuntimeError(
                    f"{peer_name}: not every environment stepped within {START_S} s (exit codes {codes})"
                )
            time.sleep(0.05)
        first, start = list(steps), time.perf_counter()
        time.sleep(seconds)
        last, elapsed = list(steps), time.perf_counter() - start
        died = [w.exitcode for w in workers if w.exitcode is not None]
        if died:
            raise RuntimeError(f"{peer_name}: a worker ended during the window (exit codes {died})")
    finally:
        for w in workers:
            w.kill()
    done = sum(last) - sum(first)
    return {
        "env_steps": done,
        "seconds": elapsed,
        "steps_per_s": done / elapsed,
        "envs_stepping": sum(b > a for a, b in zip(first, last)),  # envs that stepped in the window
        "wrong_answers": sum(wrong),  # answers that were not the asking env's own (0)
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.portal.subjects")
    p.add_argument("--peer", required=True, choices=[peer.name for peer in PEERS])
    p.add_argument("--pattern", required=True, choices=["roundtrip", "actor"])
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--envs", type=int, default=16)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=64)
    args = p.parse_args(argv)
    if args.pattern == "roundtrip":
        result = roundtrip(args.peer, args.seconds)
    else:
        result = actor(args.peer, args.seconds, args.envs, args.batch, args.size)
    print(json.dumps({"peer": args.peer, "pattern": args.pattern, **result}), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
