"""shmpad's subjects in ``python -m bench.envpool`` (``bench/envpool/contract.py``): its ``EnvPool``
stepped with random actions (``shmpad-random``) and driven by ``BatchedInference`` of the IMPALA
network (``shmpad-impala-cpu``).
"""

from __future__ import annotations

from typing import Any

from bench.envpool.contract import RandomActions, timed

__all__ = ["run_shmpad_impala", "run_shmpad_random"]


def _pool(args: Any):
    from actors import EnvPool

    return EnvPool(args.env, args.cores, args.num_envs // args.cores, halves=2, seed=0)


def run_shmpad_random(args: Any) -> tuple[float, dict]:
    pool = _pool(args)
    try:
        half = pool.half_size
        random_actions = RandomActions(pool.spec.num_actions, half, 0)

        def step() -> int:
            pool.recv(timeout=60)
            pool.send(random_actions.next())
            return half * 4

        before = pool.statistics()
        frames, elapsed = timed(step, args.warmup, args.seconds)
        return frames / elapsed, _where(pool, before, elapsed, None)
    finally:
        pool.close()


def run_shmpad_impala(args: Any) -> tuple[float, dict]:
    import torch

    from actors.inference import BatchedInference
    from learners import make_model

    torch.set_num_threads(1)
    pool = _pool(args)
    try:
        model = make_model("deep", pool.spec.obs_shape, pool.spec.num_actions)
        inference = BatchedInference(
            pool,
            model,
            device=args.device,
            policy=lambda m, obs: m(obs[None]).policy_logits[0],  # [B, A]
        )

        def step() -> int:
            inference.step(timeout=120)
            return pool.half_size * 4

        before = pool.statistics()
        frames, elapsed = timed(step, min(args.warmup, 1.0), args.seconds)
        return frames / elapsed, _where(pool, before, elapsed, inference)
    finally:
        pool.close()


def _where(pool, before, elapsed: float, inference) -> dict:
    """Shares of the counted time: per worker in environments and waiting; in the
    pool's process waiting for workers and (with inference) in the network.
    Counted from just before the warm-up, so they are shares, not seconds."""
    after = pool.statistics()
    env = [a - b for a, b in zip(after.worker_env_seconds, before.worker_env_seconds)]
    wait = [a - b for a, b in zip(after.worker_wait_seconds, before.worker_wait_seconds)]
    span = [e + w for e, w in zip(env, wait)]
    out = {
        "worker_env_share": round(sum(env) / max(sum(span), 1e-9), 3),
        "worker_wait_share": round(sum(wait) / max(sum(span), 1e-9), 3),
    }
    if inference is not None:
        s = inference.statistics()
        busy = s.wait_seconds + s.inference_seconds + s.rollout_seconds
        out["inference_share"] = round(s.inference_seconds / max(busy, 1e-9), 3)
        out["inference_wait_share"] = round(s.wait_seconds / max(busy, 1e-9), 3)
        out["inference_ms_per_batch"] = round(1e3 * s.inference_seconds / max(s.batches, 1), 2)
    return out
