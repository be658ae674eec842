"""DQN on CartPole as a Launchpad program: actors call a batched policy server, insert into
a prioritized replay node, and a learner samples, updates priorities and publishes weights.

    python -m bench.dqn                 # train until the greedy policy averages >= 195
    python -m bench.dqn --num-actors 4 --max-seconds 300
    python -m bench.dqn --lockstep --num-actors 1 --max-updates 4000   # as tests/test_bench_dqn.py runs it

The nodes (one process each under local_mp):

    actor i  --select_action(obs, epsilon)-->  policy server  (lp.batched_handler: the
       |                                        actors' calls run as one forward pass)
       +--insert(transition, priority)-->  replay node (a Prioritized table, shared memory)
    learner  <--sample / update_priorities--  replay node
       +--publish(weights)-->  weight store  --pull-->  policy server

The learner evaluates the greedy policy every --eval-every updates over 20 episodes; once
their mean return reaches --target it runs 20 fresh episodes (other seeds); if their mean
reaches it too, it prints ``final evaluation: ...`` with that mean and stops the program
(exit status 0); otherwise training goes on, until --max-seconds or --max-updates (exit status 1).

How the actors and the learner interleave decides what each update samples from and which
weights each action uses. --lockstep takes the scheduler out of it (one actor): the learner's
update u samples once the table holds exactly ``learning_starts + u / updates_per_step``
transitions, and the actor's next step waits for the weights that update publishes, so the
policy lag and the table's contents at each update are the same on any machine, however
loaded; the replay table's draws are seeded (the learner's client draws the stream of
--seed and its node's name) and do not depend on who held the table's lock when, so a
lock-step run repeats itself exactly on one machine (another CPU may round the network's
arithmetic differently). It is slower (the two take turns); tests use it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import shmpad as lp
from bench.common.cli import parser_for
from shmpad import replay

EVAL_EPISODES = 20


@dataclass
class Args:
    env: str = "CartPole-v1"
    """gymnasium environment id (vector observations, discrete actions)"""
    num_actors: int = 2
    """actor nodes; the policy server batches their calls"""
    max_seconds: float = 90.0
    """give up (exit status 1) if the target is not reached by then"""
    max_updates: int = 0
    """give up (exit status 1) if the target is not reached after this many learner updates (0: no bound)"""
    lockstep: bool = False
    """run the actor and the learner in turns, so that the scheduler decides nothing (one actor; slower)"""
    target: float = 195.0
    """mean greedy return over 20 episodes that counts as solved"""
    seed: int = 1
    """seeds the networks, the environments and the replay sampling"""
    buffer_size: int = 50_000
    """replay table size (a Fifo remover evicts the oldest transition)"""
    learning_starts: int = 1_000
    """transitions in the table before the learner samples"""
    batch_size: int = 64
    """transitions per update"""
    updates_per_step: float = 0.5
    """learner updates per environment step (the replay table's rate limiter holds to it)"""
    learning_rate: float = 1e-3
    """Adam step size"""
    gamma: float = 0.99
    """discount"""
    target_every: int = 250
    """updates between copies of the online network into the target network"""
    publish_every: int = 20
    """updates between weight publishes to the policy server"""
    epsilon_steps: int = 10_000
    """environment steps (all actors) over which epsilon decays from 1 to 0.05"""
    priority_exponent: float = 0.6
    """prioritized replay's alpha"""
    importance_exponent: float = 0.4
    """prioritized replay's beta (importance-sampling correction)"""
    eval_every: int = 1_000
    """updates between greedy evaluations"""
    out: str = ""
    """write the final figures as JSON to this file"""


def q_network(obs_dim: int, actions: int) -> nn.Module:
    return nn.Sequential(nn.Linear(obs_dim, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, actions))


def env_shape(env_id: str) -> tuple[int, int]:
    env = gym.make(env_id)
    obs_dim, actions = env.observation_space.shape[0], int(env.action_space.n)
    env.close()
    return obs_dim, actions


class PolicyServer:
    """Epsilon-greedy actions for many actors at once, with the learner's newest weights."""

    def __init__(self, args: Args, weights) -> None:
        torch.set_num_threads(1)
        self._net = q_network(*env_shape(args.env))
        self._weights = weights
        self._version = None
        self._rng = np.random.default_rng(args.seed)
        # the actors' calls wait up to 2 ms for each other, then go as one forward pass
        self.select_action = lp.batched_handler(batch_size=args.num_actors, timeout=0.002)(self.select_action)

    def select_action(self, obs: np.ndarray, epsilon: np.ndarray) -> np.ndarray:
        # obs: [B, obs_dim], epsilon: [B]
        self._version = self._weights.pull(self._net, newer_than=self._version)
        with torch.no_grad():
            greedy = self._net(torch.from_numpy(obs)).argmax(1).numpy()
        explore = self._rng.random(len(greedy)) < epsilon
        return np.where(explore, self._rng.integers(0, self._net[-1].out_features, len(greedy)), greedy)


def steps_per_update(args: Args) -> int:
    """Environment steps per learner update, which --lockstep needs to be a whole number."""
    steps = round(1 / args.updates_per_step)
    if abs(steps * args.updates_per_step - 1) > 1e-9:
        raise ValueError(f"--lockstep needs 1 / updates_per_step to be a whole number, got {args.updates_per_step}")
    return steps


def updates_before_step(args: Args, step: int) -> int:
    """In lock step, the updates the learner has made before the actor takes step ``step``
    (0-based): update u samples once ``learning_starts + u * steps_per_update`` transitions
    are in, so the step that inserts the transition after those waits for it."""
    if step < args.learning_starts:
        return 0
    return (step - args.learning_starts) // steps_per_update(args) + 1


class Actor:
    def __init__(self, index: int, args: Args, policy, replay_client, weights) -> None:
        self._index = index
        self._args = args
        self._policy = policy
        self._replay = replay_client
        self._weights = weights

    def run(self) -> None:
        args = self._args
        env = gym.make(args.env)
        obs, _ = env.reset(seed=args.seed * 1000 + self._index)
        steps = 0
        while not lp.wait_for_stop(0):
            if args.lockstep and not self._wait_for_learner(steps):
                continue  # look at stop again
            shared_steps = steps * args.num_actors
            epsilon = max(0.05, 1.0 - 0.95 * shared_steps / args.epsilon_steps)
            action = int(self._policy.select_action(obs.astype(np.float32), epsilon))
            next_obs, reward, terminated, truncated, _ = env.step(action)
            transition = {"obs": obs, "action": action, "reward": reward, "next_obs": next_obs, "done": terminated}
            if not self._insert(transition):
                break
            obs = next_obs
            steps += 1
            if terminated or truncated:
                obs, _ = env.reset()
        env.close()

    def _insert(self, transition: dict) -> bool:
        """Insert ``transition``, however long the rate limiter holds it back (the
        environment has taken the step: dropping it would lose it); False once the program
        stops."""
        while True:
            try:
                self._replay.insert(transition, priority=1.0, timeout=1.0)
                return True
            except lp.Timeout:  # the rate limiter waits for the learner; look at stop again
                if lp.wait_for_stop(0):
                    return False
            except lp.Closed:
                return False

    def _wait_for_learner(self, step: int) -> bool:
        """Whether the learner has published the weights of every update it makes before
        ``step`` (version 1 is its initial publish, version 1 + u the one after update u)."""
        want = updates_before_step(self._args, step) + 1
        try:
            return self._weights.wait_for_version(want - 1, timeout=1.0) >= want
        except lp.Timeout:
            return False


def evaluate(net: nn.Module, env_id: str, seeds: range) -> np.ndarray:
    """Greedy returns of one episode per seed, all stepped together."""
    envs = [gym.make(env_id) for _ in seeds]
    obs = np.stack([env.reset(seed=s)[0] for env, s in zip(envs, seeds)]).astype(np.float32)
    returns = np.zeros(len(envs))
    live = np.ones(len(envs), bool)
    while live.any():
        with torch.no_grad():
            actions = net(torch.from_numpy(obs)).argmax(1).numpy()
        for i in np.flatnonzero(live):
            o, r, terminated, truncated, _ = envs[i].step(int(actions[i]))
            returns[i] += r
            obs[i] = o
            live[i] = not (terminated or truncated)
    for env in envs:
        env.close()
    return returns


class Learner:
    def __init__(self, args: Args, replay_client, weights, started: float) -> None:
        self._args = args
        self._replay = replay_client
        self._weights = weights
        self._started = started

    def run(self) -> None:
        args = self._args
        torch.set_num_threads(1)
        torch.manual_seed(args.seed)
        q = q_network(*env_shape(args.env))
        q_target = q_network(*env_shape(args.env))
        q_target.load_state_dict(q.state_dict())
        optimizer = torch.optim.Adam(q.parameters(), lr=args.learning_rate)
        self._weights.publish(q.state_dict())
        updates = 0
        evals = []
        while True:
            if time.monotonic() - self._started > args.max_seconds or updates == args.max_updates > 0:
                return self._finish(q, updates, evals)
            if args.lockstep and not self._wait_for_inserts(updates):
                continue  # look at the bounds again
            try:
                batch = self._replay.sample("replay", args.batch_size, timeout=1.0)
            except lp.Timeout:
                continue
            d = {k: torch.from_numpy(v) for k, v in batch.data.items()}
            with torch.no_grad():  # double DQN: the online net picks, the target net values
                best = q(d["next_obs"]).argmax(1, keepdim=True)
                next_v = q_target(d["next_obs"]).gather(1, best).squeeze(1)
                td_target = d["reward"] + args.gamma * (1.0 - d["done"]) * next_v
            q_sa = q(d["obs"]).gather(1, d["action"].unsqueeze(1)).squeeze(1)
            td = td_target - q_sa
            # importance weights for prioritized sampling: (N P(i))^-beta, normalised by their max
            w = (batch.table_size * batch.probabilities) ** -args.importance_exponent
            w = torch.from_numpy(w / w.max()).float()
            loss = (w * F.smooth_l1_loss(q_sa, td_target, reduction="none")).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            self._replay.update_priorities("replay", batch.keys, td.detach().abs().numpy() + 1e-3)
            updates += 1
            if updates % args.target_every == 0:
                q_target.load_state_dict(q.state_dict())
            if args.lockstep or updates % args.publish_every == 0:  # in lock step the actor waits for each
                self._weights.publish(q.state_dict())
            if updates % args.eval_every == 0:
                mean = float(evaluate(q, args.env, range(10_000, 10_000 + EVAL_EPISODES)).mean())
                evals.append((updates, round(time.monotonic() - self._started, 1), mean))
                print(f"updates {updates}  wall {evals[-1][1]} s  greedy mean return {mean:.1f}", flush=True)
                if mean >= args.target:  # confirmed on other episodes, or training goes on
                    final = evaluate(q, args.env, range(20_000, 20_000 + EVAL_EPISODES))
                    print(f"updates {updates}  confirmation: greedy mean return {final.mean():.1f}", flush=True)
                    if final.mean() >= args.target:
                        return self._finish(q, updates, evals, final)

    def _wait_for_inserts(self, updates: int) -> bool:
        """Whether the table holds the transitions update ``updates`` samples from in lock
        step (the actor inserts no more until that update's weights are out)."""
        want = self._args.learning_starts + updates * steps_per_update(self._args)
        deadline = time.monotonic() + 1.0
        while self._replay.info()["replay"].inserts < want:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.0002)  # the actor takes a step or two meanwhile: a short poll, not a spin
        return True

    def _finish(self, q: nn.Module, updates: int, evals: list, final: np.ndarray | None = None) -> None:
        args = self._args
        final = np.zeros(0) if final is None else final
        info = self._replay.info()["replay"]
        result = {
            "solved": bool(final.size and final.mean() >= args.target),
            "final_mean_return": float(final.mean()) if final.size else None,
            "final_returns": final.tolist(),
            "wall_s": round(time.monotonic() - self._started, 1),
            "updates": updates,
            "env_steps": info.inserts,
            "evaluations": evals,
        }
        print(
            f"final evaluation: mean return {result['final_mean_return']} over {EVAL_EPISODES} episodes, "
            f"solved {result['solved']}, wall {result['wall_s']} s, env steps {info.inserts}, updates {updates}",
            flush=True,
        )
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f)
        lp.stop()


def make_program(args: Args) -> lp.Program:
    obs_dim, _ = env_shape(args.env)
    spec = {
        "obs": (np.float32, (obs_dim,)),
        "action": (np.int64, ()),
        "reward": (np.float32, ()),
        "next_obs": (np.float32, (obs_dim,)),
        "done": (np.float32, ()),
    }
    # a batch of B samples counts B: updates_per_step updates of batch_size per insert
    spi = args.updates_per_step * args.batch_size
    limiter = replay.SampleToInsertRatio(spi, args.learning_starts, error_buffer=spi * 100)

    def tables():
        sampler = replay.Prioritized(args.priority_exponent)
        return [replay.Table("replay", spec, args.buffer_size, sampler, replay.Fifo(), limiter, seed=args.seed)]

    program = lp.Program("dqn")
    weights = program.add_node(lp.WeightStoreNode(q_network(*env_shape(args.env)).state_dict()), "weights")
    buffer = program.add_node(lp.ReplayNode(tables), "replay")
    policy = program.add_node(lp.CourierNode(PolicyServer, args, weights), "policy")
    with program.group("actor"):
        for i in range(args.num_actors):
            program.add_node(lp.PyClassNode(Actor, i, args, policy, buffer, weights))
    program.add_node(lp.PyClassNode(Learner, args, buffer, weights, time.monotonic()), "learner")
    return program


def main(argv: list[str] | None = None) -> int:
    ns = parser_for(Args, "python -m bench.dqn", __doc__.split("\n\n")[0]).parse_args(argv)
    args = Args(**vars(ns))
    if args.lockstep:
        if args.num_actors != 1:
            raise SystemExit(
                f"--lockstep runs one actor (the order of several would be the scheduler's), got --num-actors {args.num_actors}"
            )
        steps_per_update(args)
    started = time.monotonic()
    program = make_program(args)
    lp.launch(program, launch_type="local_mp").wait()
    print(f"program finished in {time.monotonic() - started:.1f} s", flush=True)
    if args.out:
        with open(args.out) as f:
            return 0 if json.load(f)["solved"] else 1
    return 0
