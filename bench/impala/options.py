"""The main job's options: ``Args``, one field per command-line option with its help under
it, its values those of the default command (Pong, APPO, the envpool protocol); and
``parse_args``, which reads ``--env``, ``--algo`` and ``--protocol`` first, makes
the defaults of that job (``bench/impala/defaults.py``) the parser's, so that ``--help`` shows
what will run, then parses the command line and checks it before anything starts. The rules
are the configs' own (``bench/impala/job.py`` builds them): their errors come back as parser
errors naming the flags."""

from __future__ import annotations

import argparse
import dataclasses
import re
import secrets
import sys
from dataclasses import dataclass

import shmpad as lp
from actors.envs.protocol import PROTOCOLS, protocol_of
from bench.common.cli import explicit_options, parser_for
from bench.impala import rundir
from bench.impala.defaults import algo_for, defaults_for, switched_on
from bench.impala.job import configs
from bench.impala.plan import env_family
from bench.impala.usage import CHOICES, EXAMPLES, HELP_GROUPS
from shmpad.net.auth import load_token
from shmpad.net.wire import parse_address

__all__ = ["Args", "DESCRIPTION", "UsageError", "as_flags", "make_parser", "parse_args"]

DESCRIPTION = "APPO or IMPALA (V-trace) on Atari with shmpad: the project's main job."
"""the first line of ``--help``"""


class UsageError(Exception):
    """A mistake found before launch; main prints its one-line message and exits with status 2."""


@dataclass
class Args:
    env: str = "ALE/Pong-v5"
    """gymnasium environment id; Atari ids get IMPALA's preprocessing"""
    protocol: str = "envpool"
    """Atari: the protocol a result is stated under, a preset of the five options below it: envpool (no sticky actions, minimal action set, up to 30 no-ops, episodic life, rewards clipped to 1: the fast published PPO runs') or sticky (sticky actions 0.25, all 18 actions, no no-ops, no life loss: ALE v5's recommendation and DreamerV3's); any of the five given otherwise makes it custom"""
    sticky_actions: float = 0.0
    """Atari: the probability that an emulator frame repeats the previous action"""
    noop_max: int = 30
    """Atari: a reset plays 1..N no-op frames (0: none)"""
    episodic_life: bool = True
    """Atari: a lost life ends a training episode (the game goes on, and returns are whole games)"""
    model: str = "shallow"
    """shallow (Nature CNN), deep (IMPALA ResNet) or mlp (vector observations)"""
    use_lstm: bool = False
    """an LSTM core after the torso; each unroll carries the core state it started from"""
    init: str = "orthogonal"
    """the network's initial weights: torch (each layer's default) or orthogonal (PPO's: gain sqrt(2), policy head 0.01, baseline head 1)"""
    last_action_reward: bool = False
    """feed the core/heads the previous action (one-hot) and the clipped reward, as torchbeast's and moolib's Atari nets do"""
    total_frames: int = 200_000
    """stop after this many environment frames (frame skip counted)"""
    unroll_length: int = 128
    """T: steps per unroll"""
    batch_size: int = 64
    """B: unrolls per learner update"""
    num_actors: int = 0
    """actor nodes, each with its own env workers and batched inference (0: from the plan)"""
    num_workers: int = 0
    """env worker processes per actor (0: from the plan)"""
    envs_per_worker: int = 0
    """environments each worker steps (0: from the plan, 16)"""
    optimizer: str = "adam"
    """the optimiser"""
    adam_eps: float = 1e-8
    """Adam's epsilon (torch's default; PPO's Atari runs use 1e-5)"""
    learning_rate: float = 3e-4
    """initial learning rate, adapted to --kl-target or else decayed linearly to 0 over --lr-decay-frames"""
    lr_decay_frames: int = 0
    """frames over which the learning rate decays linearly to 0 (0: --total-frames); moolib's Atari configuration decays over 200M frames whatever it stops at"""
    entropy_cost: float = 0.01
    """weight of the entropy bonus"""
    baseline_cost: float = 2.0
    """weight of the baseline loss"""
    discount: float = 0.99
    """gamma"""
    reward_clip: float = 1.0
    """clip rewards to [-c, c] for the learner (0: no clipping)"""
    grad_norm_clip: float = 1.0
    """clip the gradient norm (0: no clipping)"""
    reduction: str = "mean"
    """loss reduction over time and batch: mean (moolib) or sum (torchbeast)"""
    algo: str = "appo"
    """impala (one V-trace step per batch) or appo (PPO's clipped steps on V-trace's targets, over minibatches of each batch, several epochs); each env family has its own (Atari: appo, on one host and in a group; others: impala), and with it its defaults (bench/impala/defaults.py)"""
    epochs: int = 4
    """appo: passes over each batch"""
    minibatches: int = 4
    """appo: minibatches per pass (with --shuffle unrolls, --batch-size must be a multiple)"""
    shuffle: str = "unrolls"
    """appo: a minibatch is whole unrolls, or single steps drawn from across the batch as PPO does (feed-forward models only)"""
    clip: float = 0.2
    """appo: PPO's epsilon, how far one batch's steps may move an action's probability ratio"""
    value_clip: float = 0.0
    """appo: how far one batch's steps may move the baseline before its loss stops pulling (0: no clipping)"""
    kl_target: float = 0.01
    """appo: adapt the learning rate after every minibatch step, x1.5 when the step's KL was under half of this and /1.5 when over twice this, instead of --lr-decay-frames (rl_games' adaptive schedule; 0: off)"""
    vtrace_lambda: float = 0.95
    """V-trace's lambda (1: IMPALA's; appo: 0.95, PPO's GAE lambda)"""
    full_action_space: bool = False
    """Atari: all 18 actions instead of the game's minimal set"""
    normalize_value: bool = False
    """appo: the baseline predicts values standardised by running statistics of the value targets, which the learner updates from each batch (rl_games' normalize_value)"""
    normalize_input: bool = True
    """standardise every input element (pixel) by running statistics that the learner updates from each batch, instead of scaling frames by 1/255 (rl_games' normalize_input)"""
    queue_slots: int = 0
    """trajectory ring slots (0: 4 batches for impala; for appo 1 batch, or on a GPU one slot per environment in whole batches)"""
    lockstep: bool = False
    """one actor and the learner take turns: the actor steps with the weights of every update its batches made and waits for each, so a run repeats itself on one machine (slower: nothing overlaps)"""
    device: str = "cpu"
    """where inference and the learner run"""
    learner_threads: int = 0
    """torch threads of the learner (0: from the plan; actors use 1)"""
    compile: str = "auto"
    """torch.compile the learner's forward pass and loss: auto (convolutional models on the CPU), on, off"""
    bf16: str = "auto"
    """bf16 autocast in the learner (and on a CPU in the actors' inference): auto (on a GPU, and on a CPU with AVX512-BF16 or AMX), on, off"""
    cuda_graph: str = "off"
    """replay the actors' forward pass from a CUDA graph (--device cuda): on, off (off until measured on a GPU)"""
    pin: str = "auto"
    """pin the learner to its own cores and the actors with their env workers to the rest: auto (on a CPU), on, off"""
    publish_every: int = 1
    """learner updates between two publishes of the weights to the actors"""
    publish_seconds: float = 0.0
    """publish the weights at the first update this many seconds after the last publish, instead of every --publish-every updates (0: off)"""
    top: bool = False
    """draw the live view of python -m shmpad.top (nodes, rings, weights, counters) at the bottom of this terminal while the progress lines scroll above it (needs a terminal and rich)"""
    tensorboard: bool = False
    """also write the progress rows, every loss and the policy lag as TensorBoard scalars into --out/tensorboard (pip install tensorboard)"""
    seed: int = 0
    """seeds every environment and the networks (with --peers, the environments together with --member-seed)"""
    member_seed: int = -1
    """--peers: seeds this member's environments and action sampling together with --seed, so that the group's members play different games (-1: drawn at random when the job starts, written to config.json; with --resume, the one config.json holds)"""
    out: str = ""
    """folder for config.json, log.csv, curve.png and checkpoint.pt; unset: a new runs/<env>-<date>-<time> (with --resume: the newest run of --env)"""
    log_interval: float = 5.0
    """seconds between progress lines"""
    checkpoint_minutes: float = 10.0
    """minutes between checkpoints (also written at the end)"""
    resume: bool = False
    """continue the run in --out from its checkpoint, with its optimiser state (same env and model)"""
    launch_type: str = "local_mp"
    """shmpad launch type"""
    peers: str = ""
    """HOST:PORT of a broker (python -m shmpad.net.broker): this host's learner joins --group and averages gradients with the group's other learners; the token comes from $SHMPAD_TOKEN or --token-file"""
    group: str = "impala"
    """the broker group to train with (--peers)"""
    peer_host: str = "127.0.0.1"
    """address on which this learner listens for the group's other learners (--peers); loopback reaches only this host: give an address the other hosts can reach"""
    token_file: str = ""
    """file holding the group's shared token (--peers; default: $SHMPAD_TOKEN)"""
    min_peers: int = 1
    """--peers: wait until this many learners are in the group before the first step (later the group may shrink)"""
    virtual_batch_size: int = 0
    """--peers: unrolls the group sums before each step (0: one step per reduction, i.e. batch size x peers)"""
    backend: str = "shmpad"
    """--peers: what moves the gradients: shmpad (its TCP ring), gloo or nccl (a torch.distributed process group per member list), auto (nccl on CUDA, else the ring below 4 learners and gloo from 4)"""


PROTOCOL_OPTIONS = {"protocol", *PROTOCOLS["envpool"].fields()}
"""the options that set the Atari protocol (``actors/envs/protocol.py``)"""

CONFIG_WORDS = {
    "kind": "model",
    **{w: w for w in ("algo", "clip", "discount", "epochs", "minibatches", "optimizer", "shuffle")},
}
"""the names in a config's messages that are options though they have no underscore (most
options' names do; English words like "group" or "model" stay words), and a ModelConfig's
``kind``, which is ``--model``"""


def as_flags(message: str) -> str:
    """A config's error message with every ``Args`` field it names as the option that sets it:
    ``batch_size (64) must be a multiple of minibatches (3)`` -> ``--batch-size (64) ...``."""
    names = {f.name: f.name for f in dataclasses.fields(Args) if "_" in f.name} | CONFIG_WORDS

    def flag(match: re.Match) -> str:
        word = match.group(0)
        return f"--{names[word].replace('_', '-')}" if word in names else word

    return re.sub(r"(?<![-'\w])[a-z][a-z0-9_]*(?![\w'])", flag, message)


LOCKSTEP = {"num_actors": 1, "publish_every": 1, "publish_seconds": 0.0}
"""what --lockstep needs: one actor (the order of several would be the scheduler's), and every update published"""


def _lockstep(args: Args, given: set[str], parser) -> Args:
    """``args`` with ``LOCKSTEP``'s values, or the parser's error where the command line gave others."""
    if args.peers:
        parser.error("--lockstep takes turns between one host's actor and learner; a group (--peers) is not in step")
    if args.resume:
        parser.error("--lockstep starts from the learner's first weights: a run resumed (--resume) is not in step")
    if args.device != "cpu":
        parser.error(
            f"--lockstep runs on the CPU, got --device {args.device}: a GPU learner publishes its weights "
            "after its next update, which in lock step never comes, and cuDNN picks kernels by timing"
        )
    for name, value in LOCKSTEP.items():
        allowed = (value, 0) if name == "num_actors" else (value,)  # --num-actors 0: the plan's choice
        if name in given and getattr(args, name) not in allowed:
            parser.error(f"--lockstep runs with --{name.replace('_', '-')} {value:g}, got {getattr(args, name):g}")
    return dataclasses.replace(args, **LOCKSTEP)


def make_parser(
    argv: list[str], prog: str = "python -m bench.impala", defaults=None
) -> tuple[argparse.ArgumentParser, dict, str]:
    """The parser for the job that ``argv``'s ``--env``, ``--algo`` and ``--protocol``
    name, with that job's defaults (``bench/impala/defaults.py``, then a benchmark's
    own ``defaults``) as its own; and those defaults, and the env family."""
    first = argparse.ArgumentParser(add_help=False)
    for name in ("env", "algo", "protocol"):
        first.add_argument(f"--{name}", default=getattr(Args, name) if name in ("env", "protocol") else None)
    known, _ = first.parse_known_args(argv)
    try:
        family = env_family(known.env)
    except ValueError as e:
        raise UsageError(f"--env: {e}") from None
    algo = algo_for(family, known.algo)
    table = {"env": known.env, **defaults_for(family, algo, known.protocol), **(defaults or {})}
    return parser_for(Args, prog, DESCRIPTION, HELP_GROUPS, CHOICES, EXAMPLES, switched_on(), table), table, family


def parse_args(argv: list[str] | None = None, prog: str = "python -m bench.impala", defaults=None) -> Args:
    """The job's settings: the defaults of the job that ``--env``, ``--algo`` and ``--protocol``
    name (``bench/impala/defaults.py``) under what the command line gives,
    checked. ``defaults``: a benchmark's own values for options the command line leaves out,
    over the table's (``bench.impala.throughput``'s short run)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, table, family = make_parser(argv, prog, defaults)
    args = Args(**{**table, **vars(parser.parse_args(argv))})
    given = explicit_options(parser, argv)
    if family != "atari" and given & PROTOCOL_OPTIONS - {"reward_clip"}:
        names = ", ".join(f"--{k.replace('_', '-')}" for k in sorted(given & PROTOCOL_OPTIONS - {"reward_clip"}))
        parser.error(f"{names}: Atari settings, and {args.env} is not an Atari game")
    if family == "atari":  # "custom" where an option changed a preset's (EnvConfig checks the values)
        args = dataclasses.replace(args, protocol=protocol_of(args).name)
    if args.total_frames < 1:
        parser.error(f"--total-frames must be >= 1, got {args.total_frames}")
    for name in ("num_actors", "num_workers", "envs_per_worker", "learner_threads"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0 (0: from the plan), got {getattr(args, name)}")
    if args.cuda_graph == "on" and not args.device.startswith("cuda"):
        parser.error(
            f"--cuda-graph on replays the actors' forward pass on a GPU: give --device cuda, got {args.device}"
        )
    if args.lockstep:
        args = _lockstep(args, given, parser)
    if args.min_peers < 1:
        parser.error(f"--min-peers must be >= 1, got {args.min_peers}")
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    if args.member_seed < -1:
        parser.error(f"--member-seed must be >= 0, or -1 (drawn at random), got {args.member_seed}")
    if args.member_seed >= 0 and not args.peers:
        parser.error(f"--member-seed {args.member_seed} seeds a member of a group: give --peers too")
    try:
        configs(args)
    except (TypeError, ValueError) as e:
        parser.error(as_flags(str(e)))
    if args.peers:
        try:
            if args.peers != "env://":  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (shmpad.net.envcluster)
                parse_address(args.peers)
            load_token(token_file=args.token_file or None)
        except (ValueError, lp.ShmpadError) as e:
            parser.error(f"--peers {args.peers}: {e}")
    if not args.out:
        found = rundir.latest_run(args.env) if args.resume else None
        if args.resume and found is None:
            raise UsageError(f"--resume: no run of {args.env} under {rundir.RUNS}/ holds a checkpoint; give --out DIR")
        args = dataclasses.replace(args, out=found or rundir.default_out(args.env))
    if args.peers and args.member_seed < 0:  # drawn once, here: config.json keeps it
        recorded = (rundir.recorded_config(args.out) or {}) if args.resume else {}
        kept = recorded.get("member_seed")  # --resume goes on with the member's own seed
        args = dataclasses.replace(
            args, member_seed=kept if isinstance(kept, int) and kept >= 0 else secrets.randbelow(2**31)
        )
    return args
