"""Training that shrugs off faults: the steps/s a group of learners keeps while a member
is SIGKILLed or SIGSTOPped every ``--interval`` seconds, against a fault-free run.

    python -m bench.elastic                                   # 4 learners, shmpad and gloo, 3 rounds of 120 s arms
    python -m bench.elastic --rounds 1 --seconds 60 --interval 15 --backends shmpad
    python -m bench.elastic --json --save docs/results/elastic
    python -m bench.elastic --restart fork,job --faults kill  # the cheap restart and the job's, side by side

Method. ``--rounds`` rounds; in each, for each backend and each ``--restart`` kind, two
arms, each a fresh group: ``clean`` (no faults) and ``faults``. ``--arms together`` (the
default) runs the two side by side, at once: a shared machine's speed drifts by a fifth
from one arm to the next, and then it drifts for both alike (``--faults none`` runs the
faults arm without faults, so that its kept is the method's own noise;
``docs/results/elastic/README.md`` has both methods' figures). Side by side, the clean
group gets the cores the faulted one leaves idle while it recovers, which counts against
the faults arm. ``--arms apart`` runs them one after the other, the faults arm first in
every other round. Each arm starts a broker in this process (the command line's
heartbeat, timeout and settle delay) and ``--peers`` learner processes. Its clock starts
at the whole group's first step; rates are counted from ``--warmup`` seconds later to
``--seconds`` after the start (side by side: over the seconds both arms ran). In the
``faults`` arm, every ``--interval`` seconds (later where the group is not whole again
by then) a member picked at random is faulted, ``--faults`` in turn: ``kill`` (SIGKILL,
then a new process under its name at once) or ``stop`` (SIGSTOP, then SIGCONT
``--stop-seconds`` later).

``--restart`` says what the learners are and how a killed one starts again, one kind or
several run in turn within each round, each with its own clean and faults arms:

- ``fork``: ``bench.elastic.learner``, an MLP of ``--width`` on batches of ``--batch``,
  one torch thread each, forked from a fork server that imported torch once (as a
  supervisor with a warm parent restarts a worker);
- ``exec``: the same MLP learner in a new interpreter that imports torch itself;
- ``job``: ``bench.elastic.job_learner``, the Pong job's learner (by default the Nature
  CNN and IMPALA's update, ``python -m bench.impala --peers ... --algo impala``, compiled and in bf16 as
  its plan says for this machine; ``--job`` adds the job's flags) in a new interpreter, as
  a user's supervisor starts the job again: the job's imports, settings, model,
  ``Learner``, compiling and ``join_group`` all count. It resumes by joining the group and
  receiving its state (weights, optimiser, schedule, version), as any joiner does. Its
  batches are synthetic (no actors): that module's docstring says what is the job's own.

``kept`` is the faults arm's steps/s over the clean arm's of the same kind in the same
round; the summary gives its median over the rounds, by backend and kind, and names the
kind. Per fault: the detection time (until every survivor stopped waiting for the
victim), the time until every survivor stepped without it, and the rejoin time (from the
restart or the SIGCONT to the victim's first step in the whole group, with the state
transfer); for a killed job learner, each stage of its way back. Every step's weights
digest is compared across the learners that reached that version.
``bench/elastic/report.py`` defines each figure.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import sys
from dataclasses import dataclass

from bench.common.cli import parser_for
from bench.common.evidence import cpu_model
from bench.elastic.group import RECOVER_S, RunFailed, run_arm, run_arms_together
from bench.elastic.learner import TOKEN
from bench.elastic.report import HEADER, ArmFigures, figures, table
from shmpad.net.broker import HEARTBEAT_S, SETTLE_S, TIMEOUT_S

KINDS = ("kill", "stop")
RESTARTS = ("fork", "exec", "job")
RESTART_WORDS = {
    "fork": "forked from a warm fork server (torch imported once)",
    "exec": "a new interpreter importing torch",
    "job": "a new interpreter running the job's learner, resuming from the group's state",
}
"""how each ``--restart`` kind starts a learner again, for the headline"""
ARMS = ("together", "apart")


@dataclass
class Args:
    peers: int = 4
    """learner processes in the group"""
    seconds: float = 120.0
    """length of each arm, from the whole group's first step"""
    interval: float = 30.0
    """seconds between faults in the faults arm"""
    faults: str = "kill,stop"
    """the faults to inject, in turn: kill (SIGKILL and restart), stop (SIGSTOP, then SIGCONT); none: the
    faults arm runs without faults (its kept is the method's noise)"""
    stop_seconds: float = 3.0
    """how long a stopped learner stays stopped (the broker drops it after its timeout)"""
    backends: str = "shmpad,gloo"
    """the accumulator's data planes to run, comma-separated"""
    warmup: float = 5.0
    """seconds after the group's first step that the rates leave out"""
    width: int = 256
    """fork and exec: hidden width of the learners' MLP (64 -> width -> width -> 8)"""
    batch: int = 32
    """fork and exec: samples per learner per step (job: the job's --batch-size unrolls)"""
    rounds: int = 3
    """rounds of a clean arm and a faults arm per backend and restart kind; kept is the median of the rounds'
    ratios"""
    arms: str = "together"
    """together: a round's clean and faults arms run side by side, at once (the machine's drift falls on both);
    apart: one after the other, the first alternating"""
    seed: int = 0
    """seed of the fault injector's choice of victims (round r uses seed + r)"""
    restart: str = "fork"
    """how learners start and restart, comma-separated kinds run in turn each round: fork (the MLP, from a fork
    server that imported torch once), exec (the MLP, a new interpreter importing torch itself), job (the Pong
    job's learner in a new interpreter: its imports, model, compiling and join; synthetic batches)"""
    job: str = ""
    """--restart job: the job's flags (python -m bench.impala's, e.g. --job="--model deep"); the benchmark gives
    the group's --peers, --group, --min-peers and --backend, and --learner-threads (this machine's cores over
    the two arms' learners) unless given here"""
    json: bool = False
    """print one JSON object per arm, then one per backend and restart kind with its kept ratios, instead of the
    table"""
    save: str = ""
    """a directory to write the report (output.txt) and every arm's figures (results.json) into"""


def parse_args(argv: list[str] | None = None) -> Args:
    parser = parser_for(Args, "python -m bench.elastic", __doc__.split("\n")[0])
    args = Args(**vars(parser.parse_args(argv)))
    kinds = _kinds(args.faults)
    if args.faults != "none" and (not kinds or any(k not in KINDS for k in kinds)):
        parser.error(f"--faults takes none or a comma-separated list of {', '.join(KINDS)}, got {args.faults!r}")
    backends = [b for b in args.backends.split(",") if b]
    if not backends or any(b not in ("shmpad", "gloo") for b in backends):
        parser.error(f"--backends takes a comma-separated list of shmpad, gloo, got {args.backends!r}")
    restarts = _restarts(args.restart)
    if not restarts or any(r not in RESTARTS for r in restarts) or len(set(restarts)) < len(restarts):
        parser.error(f"--restart takes a comma-separated list of {', '.join(RESTARTS)}, got {args.restart!r}")
    if args.job and "job" not in restarts:
        parser.error(f"--job gives the job's flags to --restart job, got --restart {args.restart!r}")
    if "job" in restarts:
        from bench.elastic import job_learner

        try:
            job_learner.check_flags(shlex.split(args.job))
        except ValueError as e:
            parser.error(str(e))
        _job(args)  # the job's parser checks its flags: a bad one exits with its message
    if args.arms not in ARMS:
        parser.error(f"--arms takes one of {', '.join(ARMS)}, got {args.arms!r}")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.peers < 2:
        parser.error(f"--peers must be at least 2 (a fault needs survivors), got {args.peers}")
    if not 0 <= args.warmup < args.seconds:
        parser.error(f"--warmup must be in [0, --seconds), got {args.warmup}")
    if args.interval <= 0 or args.stop_seconds <= 0:
        parser.error(f"--interval and --stop-seconds must be positive, got {args.interval} and {args.stop_seconds}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    kinds = _kinds(args.faults)
    restarts = _restarts(args.restart)
    out: list[str] = []

    def say(line: str) -> None:
        out.append(line)
        print(line, flush=True)

    job = _job(args) if "job" in restarts else None
    if not args.json:
        learners = {r: f"the MLP 64-{args.width}-{args.width}-8, batch {args.batch}" for r in ("fork", "exec")}
        if job is not None:
            from bench.elastic.job_learner import describe

            learners["job"] = describe(job)
        say(
            f"bench.elastic: restarts {', '.join(f'{r}: {RESTART_WORDS[r]} ({learners[r]})' for r in restarts)}; "
            f"groups of {args.peers}, {args.seconds:g} s per arm, a fault every {args.interval:g} s "
            f"({', '.join(kinds) or 'none'} in turn); broker heartbeat {HEARTBEAT_S} s, timeout {TIMEOUT_S} s, "
            f"settle {SETTLE_S} s; clean and faults arms "
            f"{'side by side' if args.arms == 'together' else 'one after the other'}; {_cpu()}, {os.cpu_count()} cores"
        )
        say(HEADER)
    results = []
    failed = False
    kept: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        if not args.json and args.rounds > 1:
            say(f"round {r + 1} of {args.rounds}")
        for backend in (b for b in args.backends.split(",") if b):
            for restart in restarts:
                settings = dict(
                    peers=args.peers,
                    seconds=args.seconds,
                    interval=args.interval,
                    kinds=kinds,
                    width=args.width,
                    batch=args.batch if restart != "job" else job.learner.batch_size,
                    stop_s=args.stop_seconds,
                    seed=args.seed + r,
                    restart=restart,
                    job=tuple(shlex.split(args.job)),
                    threads=_threads(args),
                    recover_s=RECOVER_S[restart],
                )
                arms = {}
                try:
                    arms = _run_round(backend, r, args, settings)
                except RunFailed as e:
                    failed = True
                    say(f"{backend} {restart} round {r + 1}: FAILED: {e}")
                for fig in arms.values():
                    results.append({"round": r + 1, **fig.as_dict()})
                    if args.json:
                        say(json.dumps(results[-1]))
                if False in arms and True in arms and arms[False].steps_per_s > 0:
                    kept.setdefault((backend, restart), []).append(arms[True].steps_per_s / arms[False].steps_per_s)
                if not args.json:
                    for line in table(arms.get(False), arms.get(True)):
                        say(line)
    for (backend, restart), ratios in kept.items():
        summary = {"backend": backend, "restart": restart, "kept_median": statistics.median(ratios), "kept": ratios}
        results.append(summary)
        if args.json:
            say(json.dumps(summary))
        else:
            say(
                f"{backend}, restarts {restart} ({RESTART_WORDS[restart]}): kept {statistics.median(ratios):.1%} of "
                f"the clean steps/s, the median of {len(ratios)} round{'s' if len(ratios) > 1 else ''} "
                f"({', '.join(f'{x:.1%}' for x in ratios)})"
            )
    if args.save:
        os.makedirs(args.save, exist_ok=True)
        with open(os.path.join(args.save, "output.txt"), "w") as f:
            f.write(f"$ python -m bench.elastic {shlex.join(sys.argv[1:] if argv is None else argv)}\n")
            f.write("\n".join(out) + "\n")
        with open(os.path.join(args.save, "results.json"), "w") as f:
            json.dump(results, f, indent=1)
    return 1 if failed else 0


def _restarts(restart: str) -> list[str]:
    return [r for r in restart.split(",") if r]


def _threads(args: Args) -> int:
    """A job learner's torch threads, unless ``--job`` says: two arms' learners share this machine's cores."""
    return max(1, len(os.sched_getaffinity(0)) // (2 * args.peers))


def _job(args: Args):
    """The job the ``job`` learners run, for the headline and the batch size (``bench.impala``'s
    parser checks ``--job``'s flags: a bad one exits with its message, naming it)."""
    from bench.elastic import job_learner

    argv = job_learner.group_argv(shlex.split(args.job), "127.0.0.1:1", args.peers, "shmpad", _threads(args))
    return job_learner.settings(argv, TOKEN, prog="python -m bench.elastic --job")


def _kinds(faults: str) -> tuple[str, ...]:
    return () if faults == "none" else tuple(k for k in faults.split(",") if k)


def _run_round(backend: str, r: int, args: Args, settings: dict) -> dict[bool, ArmFigures]:
    """One round's arms of one backend, by ``faults_on``: side by side, or one after the
    other (the faults arm first in every other round), as ``args.arms`` says."""
    if args.arms == "together":
        clean, faulty = run_arms_together(backend, **settings)
        window = (max(clean.started, faulty.started) + args.warmup, min(clean.ended, faulty.ended))
        return {False: figures(clean, args.warmup, window), True: figures(faulty, args.warmup, window)}
    arms = {}
    for faults_on in (False, True) if r % 2 == 0 else (True, False):  # neither arm always first
        arms[faults_on] = figures(run_arm(backend, faults_on=faults_on, **settings), args.warmup)
    return dict(sorted(arms.items()))


def _cpu() -> str:
    return cpu_model() or platform.processor() or "an unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
