"""What a link costs: steps/s of a group of hosts that reduce the Nature CNN's gradients
every step, against one host running alone on the same cores, per link and backend.

    python -m bench.hosts.cost                       # 2 hosts; links 0, 10gbit,50us, 1gbit,0.5ms; 3 rounds
    python -m bench.hosts.cost --hosts 2,3 --rounds 3 --steps 20
    python -m bench.hosts.cost --save docs/results/hosts-link-cost

As root (``bench/hosts/netns.py`` makes the hosts). For each ``--links`` entry it makes
``max(--hosts)`` hosts on one switch behind that link and measures the link from host 0
to host 1 (round trips, an 8 MiB transfer). Then ``--rounds`` rounds; each runs, one
after the other, in an order that turns over from round to round:

- ``alone``: one host's learner (``bench/hosts/cost_worker.py``) with no group, on core
  share 0, the share host 0 has in a group;
- per link, group size and ``--backends`` entry: a group of that many hosts, each on its
  share of this machine's cores (``bench.hosts.core_shares``), reducing the model's
  gradients every step;
- per ``--half-links`` entry, group size and backend: the same group reducing a float32
  tensor of half the gradients' bytes in their place (what bf16 gradients would send).

Every arm is fresh processes: ``--warmup`` untimed steps, then ``--steps`` timed ones. A
group's steps/s is its slowest member's. ``vs alone`` is, per round, the group's steps/s
over the alone arm's of the same round; ``half/full`` the half arm's over the full one's;
the table gives their medians over the rounds (with the rounds' range), the median
reduction time per step, the payload bytes per reduction, and the bytes each host's
``eth0`` sent per step. The load (``/proc/loadavg``) is printed at the start and the end.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from bench.common.cli import parser_for
from bench.common.evidence import cpu_model
from bench.common.jobs import exit_on_sigterm
from bench.hosts.__main__ import core_shares
from bench.hosts.cost_worker import BACKENDS, Settings
from bench.hosts.netns import Hosts, HostsUnavailable, Link

PORT = 4460
ARM_TIMEOUT_S = 300.0


@dataclass
class Args:
    hosts: str = "2"
    """group sizes to measure, comma-separated (each at least 2)"""
    links: str = "0 10gbit,50us 1gbit,0.5ms"
    """links to measure, space-separated, each RATE,DELAY as tc writes them (0: no limit, no delay)"""
    backends: str = "shmpad,gloo"
    """the group's reduction backends, comma-separated (shmpad: its ring; gloo)"""
    half_links: str = "1gbit,0.5ms"
    """links (of --links) on which the groups also reduce half the bytes (bf16's); empty: none"""
    rounds: int = 3
    """rounds of every arm, in an order that turns over from round to round"""
    steps: int = 20
    """timed steps per arm"""
    warmup: int = 3
    """untimed steps before them"""
    batch: int = 32
    """synthetic frames per step and host"""
    frame: int = 84
    """frame side (84: the job's; smaller makes a smaller model, for tests; at least 36)"""
    save: str = ""
    """folder for report.json (every arm's every host, the links' measurements, the machine)"""


@dataclass(frozen=True)
class Arm:
    name: str  # "alone", or "<link> <n> hosts <backend> <payload>"
    link: str
    hosts: int
    backend: str
    payload: str = "model"


def parse_args(argv: list[str] | None = None) -> tuple[Args, list[int], list[str], list[str], list[str]]:
    parser = parser_for(Args, "python -m bench.hosts.cost", __doc__.split("\n\n")[0])
    args = Args(**vars(parser.parse_args(argv)))
    try:
        sizes = [int(h) for h in args.hosts.split(",") if h.strip()]
    except ValueError:
        parser.error(f"--hosts takes comma-separated group sizes, got {args.hosts!r}")
    if not sizes or min(sizes) < 2:
        parser.error(f"--hosts takes group sizes of at least 2, got {args.hosts!r}")
    links = args.links.split()
    if not links:
        parser.error(f"--links takes at least one link, got {args.links!r}")
    for text in links:
        try:
            Link.parse(text)
        except ValueError as e:
            parser.error(f"--links: {e}")
    half = args.half_links.split()
    if any(h not in links for h in half):
        parser.error(f"--half-links must be links of --links ({', '.join(links)}), got {args.half_links!r}")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    allowed = [b for b in BACKENDS if b != "none"]
    if not backends or any(b not in allowed for b in backends):
        parser.error(f"--backends takes comma-separated entries of {', '.join(allowed)}, got {args.backends!r}")
    for name, value, least in (("rounds", args.rounds, 1), ("steps", args.steps, 1), ("warmup", args.warmup, 1)):
        if value < least:
            parser.error(f"--{name} must be at least {least}, got {value}")
    if args.batch < 1:
        parser.error(f"--batch must be at least 1, got {args.batch}")
    if args.frame < 36:
        parser.error(f"--frame must be at least 36 (the Nature CNN's smallest input), got {args.frame}")
    return args, sizes, links, backends, half


def arms_of(sizes: list[int], links: list[str], backends: list[str], half: list[str]) -> list[Arm]:
    arms = [Arm("alone", "", 1, "none")]
    for link in links:
        for n in sizes:
            for backend in backends:
                arms.append(Arm(f"{link} {n} hosts {backend}", link, n, backend))
                if link in half:
                    arms.append(Arm(f"{link} {n} hosts {backend} half", link, n, backend, "half"))
    return arms


def order(arms: list[Arm], round_: int) -> list[Arm]:
    """Round 0 in order, round 1 reversed, round 2 rotated by a third, and so on."""
    turned = arms[::-1] if round_ % 2 else arms
    shift = (round_ // 2) * max(1, len(arms) // 3) % len(arms)
    return turned[shift:] + turned[:shift]


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows, else "unknown"."""
    return cpu_model() or platform.processor() or "unknown"


def run_arm(arm: Arm, made: Hosts, args: Args, shares: list, port: int) -> list[dict]:
    """Start the arm's learners, one per host, and return each one's JSON record."""
    broker = f"{made[0].ip}:{port}"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0"}
    procs = []
    try:
        for rank in range(arm.hosts):
            host = made[rank]
            s = Settings(
                rank,
                arm.hosts,
                host.ip,
                broker,
                arm.backend,
                arm.payload,
                args.batch,
                args.frame,
                args.steps,
                args.warmup,
            )
            argv = [sys.executable, "-m", "bench.hosts.cost_worker", json.dumps(asdict(s))]
            procs.append(host.popen(argv, cpus=shares[rank], env=env, stdout=subprocess.PIPE, text=True))
        deadline = time.monotonic() + ARM_TIMEOUT_S
        records = []
        for rank, proc in enumerate(procs):
            try:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"{arm.name}: h{rank} did not finish within {ARM_TIMEOUT_S:g} s") from None
            if proc.returncode != 0:
                raise RuntimeError(f"{arm.name}: h{rank} exited with {proc.returncode}")
            records.append(json.loads(out.strip().splitlines()[-1]))
        return records
    finally:
        for host in list(made)[: arm.hosts]:
            host.kill()


def rate(records: list[dict]) -> float:
    """The group's steps/s: its slowest member's."""
    return min(r["steps"] / r["seconds"] for r in records)


def summarize(arms: list[Arm], results: dict[str, list[list[dict] | None]]) -> list[dict]:
    """One row per arm: medians over the rounds of its rate and of its per-round ratios."""
    alone = [rate(r) if r else None for r in results["alone"]]
    rows = []
    for arm in arms:
        runs = results[arm.name]
        rates = [rate(r) if r else None for r in runs]
        vs_alone = [g / a for g, a in zip(rates, alone) if g and a]
        row = {
            "arm": arm.name,
            "link": arm.link,
            "hosts": arm.hosts,
            "backend": arm.backend,
            "payload": arm.payload,
            "rounds": sum(1 for r in runs if r),
            "steps_per_s": statistics.median([r for r in rates if r]) if any(rates) else None,
            "rates": rates,
            "vs_alone": vs_alone,
            "vs_alone_median": statistics.median(vs_alone) if vs_alone else None,
        }
        done = [r for r in runs if r]
        if arm.backend != "none" and done:
            row["payload_bytes"] = done[0][0]["payload_bytes"]
            row["reduce_ms"] = 1e3 * statistics.median([t for r in done for h in r for t in h["reduce_s"]])
            row["sent_per_step"] = statistics.median([h["sent"] / h["steps"] for r in done for h in r])
        if arm.payload == "half":
            full = results[arm.name.removesuffix(" half")]
            ratios = [rate(h) / rate(f) for h, f in zip(runs, full) if h and f]
            row["half_vs_full"] = ratios
            row["half_vs_full_median"] = statistics.median(ratios) if ratios else None
        rows.append(row)
    return rows


def fmt(x: float | None, spec: str) -> str:
    return "failed" if x is None else format(x, spec)


def spread(xs: list[float]) -> str:
    return f"{min(xs):.3f}-{max(xs):.3f}" if xs else "-"


def print_table(rows: list[dict], model_bytes: int) -> None:
    print(
        f"{'arm':<34} {'steps/s':>8} {'vs alone':>9} {'(rounds)':>13} {'reduce ms':>10} {'payload MB':>11} {'sent MB/step':>13} {'half/full':>10}"
    )
    for row in rows:
        half = row.get("half_vs_full_median")
        print(
            f"{row['arm']:<34} {fmt(row['steps_per_s'], '.2f'):>8} {fmt(row['vs_alone_median'], '.3f'):>9} "
            f"{spread(row['vs_alone']):>13} {fmt(row.get('reduce_ms'), '.1f') if 'reduce_ms' in row else '-':>10} "
            f"{row.get('payload_bytes', 0) / 1e6:>11.2f} {row.get('sent_per_step', 0) / 1e6:>13.2f} "
            f"{fmt(half, '.3f') if 'half_vs_full' in row else '':>10}"
        )
    print(f"model: {model_bytes} bytes of float32 parameters ({model_bytes // 4} parameters) per reduction")


def main(argv: list[str] | None = None) -> int:
    args, sizes, links, backends, half = parse_args(argv)
    exit_on_sigterm()
    arms = arms_of(sizes, links, backends, half)
    shares = core_shares(max(sizes), "split")
    machine = {"cpu": cpu_name(), "cores": sorted(os.sched_getaffinity(0)), "load_start": loadavg()}
    print(f"# bench.hosts.cost: {machine['cpu']}, cores {machine['cores']}, load {machine['load_start']}", flush=True)
    print(f"# hosts' core shares: {shares}; {args.batch} frames of {args.frame}x{args.frame} per step", flush=True)
    results: dict[str, list[list[dict] | None]] = {a.name: [] for a in arms}
    failures: list[str] = []
    measured: dict[str, dict] = {}
    made: dict[str, Hosts] = {}
    port = PORT
    try:
        for text in links:
            made[text] = Hosts(max(sizes), Link.parse(text))
            seen = made[text].measure(0, 1, rounds=20, mib=8)
            measured[text] = {**seen, "delay_by": made[text].delay_by}
            rtt = seen["rtt_us"]
            print(
                f"# link {text} (delay by {made[text].delay_by or 'none'}): round trip min {rtt[0]:.0f} us, "
                f"median {statistics.median(rtt):.0f} us; {seen['mib']} MiB in {seen['seconds']:.3f} s "
                f"({seen['mib'] * 8 * 2**20 / seen['seconds'] / 1e9:.2f} Gbit/s)",
                flush=True,
            )
        for round_ in range(args.rounds):
            for arm in order(arms, round_):
                port += 1
                try:
                    records = run_arm(arm, made[arm.link or links[0]], args, shares, port)
                except RuntimeError as e:
                    failures.append(f"round {round_}: {e}")
                    print(f"FAILED round {round_}: {e}", flush=True)
                    records = None
                results[arm.name].append(records)
                if records:
                    print(f"# round {round_} {arm.name}: {rate(records):.2f} steps/s, load {loadavg()}", flush=True)
            for text in links:
                made[text].check()
    except HostsUnavailable as e:
        print(f"python -m bench.hosts.cost: error: cannot make the hosts here: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        for hosts in made.values():
            hosts.close()
    machine["load_end"] = loadavg()
    rows = summarize(arms, results)
    model_bytes = next((h["model_bytes"] for r in results["alone"] if r for h in r), 0)
    print(f"# load at the end {machine['load_end']}", flush=True)
    print_table(rows, model_bytes)
    for failure in failures:
        print(f"FAILED {failure}")
    if args.save:
        os.makedirs(args.save, exist_ok=True)
        report = {"args": asdict(args), "machine": machine, "links": measured, "rows": rows, "raw": results}
        with open(os.path.join(args.save, "report.json"), "w") as f:
            json.dump(report, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
