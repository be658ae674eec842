"""One host of ``python -m bench.hosts.cost``: a learner's update of the Nature CNN on
synthetic frames, alone or in a group whose every step is one gradient reduction.

    python -m bench.hosts.cost_worker SETTINGS_JSON

Each step: a forward and backward pass of the default model (``ActorCritic(NatureTorso())``,
6 actions) on ``batch`` synthetic uint8 frames of ``frame`` x ``frame`` (drawn once), a
stand-in loss (the policy's log-sum-exp plus the squared baseline: every parameter gets a
gradient; not the APPO loss), then, in a group, ``Accumulator.reduce_gradients`` over
``backend``, then an SGD step. ``payload`` ``half`` reduces, in place of the model's
gradients, one float32 tensor of half their bytes (what bf16 gradients would put on the
wire; the model's own gradients then stay this host's). Rank 0 serves the group's broker
in this process. After ``warmup`` untimed steps (a reduction lines the members up), it
times ``steps`` steps and prints one JSON line: the steps, their seconds, each step's
reduction seconds, the bytes the model's gradients and the reduced payload hold, and the
bytes ``eth0`` sent and received over the timed steps (``/proc/net/dev`` of the host's
namespace, every packet: the allreduce's, its headers, the broker's heartbeats).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass

import torch

from learners.models import ActorCritic, NatureTorso
from shmpad.net.accumulator import Accumulator
from shmpad.net.broker import Broker

TOKEN = "bench-hosts-cost"
ACTIONS = 6
PAYLOADS = ("model", "half")
BACKENDS = ("none", "shmpad", "gloo")


@dataclass(frozen=True)
class Settings:
    rank: int
    hosts: int  # 1 with backend "none": alone
    ip: str
    broker: str  # host 0's ip:port
    backend: str = "none"
    payload: str = "model"
    batch: int = 32
    frame: int = 84
    steps: int = 20
    warmup: int = 3
    op_timeout: float = 60.0


def model_for(frame: int) -> ActorCritic:
    return ActorCritic(NatureTorso((4, frame, frame)), ACTIONS)


def parameter_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def eth0_bytes() -> tuple[int, int]:
    """(received, sent) by this namespace's eth0 so far."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "eth0":
                fields = rest.split()
                return int(fields[0]), int(fields[8])
    return 0, 0


def run(s: Settings) -> dict:
    torch.manual_seed(s.rank)
    torch.set_num_threads(1)
    model = model_for(s.frame)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    obs = torch.randint(0, 256, (s.batch, 4, s.frame, s.frame), dtype=torch.uint8)  # [B, C, H, W]
    reduced: torch.nn.Module = model
    if s.payload == "half":
        reduced = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(parameter_bytes(model) // 8))])
        reduced[0].grad = torch.ones_like(reduced[0])
    broker = acc = None
    try:
        if s.backend != "none":
            host, port = s.broker.rsplit(":", 1)
            if s.rank == 0:
                broker = Broker(host, int(port), TOKEN, heartbeat_s=1.0, timeout_s=30.0, settle_s=0.1)
            acc = Accumulator(
                reduced,
                broker=s.broker,
                group="cost",
                name=f"h{s.rank}",
                host=s.ip,
                token=TOKEN,
                op_timeout=s.op_timeout,
                min_size=s.hosts,
                check_every=0,
                backend=s.backend,
            )
            if not acc.ready(timeout=s.op_timeout):
                raise RuntimeError(f"h{s.rank}: the group of {s.hosts} did not form within {s.op_timeout} s")
        reduce_s: list[float] = []

        def step() -> None:
            features = model.torso(obs)  # [B, 512]
            loss = model.policy(features).logsumexp(-1).mean() + model.baseline(features).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            if acc is not None:
                t0 = time.perf_counter()
                if not acc.reduce_gradients(s.batch):
                    raise RuntimeError(f"h{s.rank}: a reduction was abandoned (the group changed)")
                reduce_s.append(time.perf_counter() - t0)
            optimizer.step()

        for _ in range(s.warmup):
            step()
        reduce_s.clear()
        rx0, tx0 = eth0_bytes()
        t0 = time.perf_counter()
        for _ in range(s.steps):
            step()
        seconds = time.perf_counter() - t0
        rx1, tx1 = eth0_bytes()
        return {
            "rank": s.rank,
            "steps": s.steps,
            "seconds": seconds,
            "reduce_s": reduce_s,
            "model_bytes": parameter_bytes(model),
            "payload_bytes": parameter_bytes(reduced) if acc is not None else 0,
            "sent": tx1 - tx0,
            "received": rx1 - rx0,
        }
    finally:
        if acc is not None:
            acc.close()
        if broker is not None:
            broker.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    print(json.dumps(run(Settings(**json.loads(argv[0])))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
