"""``python -m bench.hosts``: the README's several-hosts commands, on hosts made on this
machine and joined by links of a chosen rate and delay.

    python -m bench.hosts                                   # 2 hosts, 1gbit,0.5ms links, 120 s
    python -m bench.hosts --hosts 3 --link 10gbit,50us --seconds 120
    python -m bench.hosts -- --env ALE/Breakout-v5          # after --: more options for every job

As root. It makes ``--hosts`` network namespaces on one switch (``bench/hosts/netns.py``),
each with its own address and a ``--link``; measures the link from host 0 to host 1
(round trips and a 16 MiB transfer); starts ``python -m shmpad.net.broker`` on host 0 and
``python -m bench.impala --peers <host 0>:4431 --group hosts --peer-host <its address>``
on every host, with one fresh ``SHMPAD_TOKEN``; prints their lines as they come, prefixed
with the host; stops the jobs as Ctrl+C would after ``--seconds`` (each writes its
checkpoint), and removes the hosts, also when it is itself killed. The exit status is 1
when a job failed (stopped jobs exit 130 after their checkpoint: that counts as done).

``--cores split`` (the default) runs each host's job on its own share of this machine's
cores, as separate machines would; the broker and the links' delayers run anywhere.
"""

from __future__ import annotations

import os
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from bench.common.cli import parser_for
from bench.common.jobs import exit_on_sigterm
from bench.hosts.netns import Hosts, HostsUnavailable, Link

PORT = 4431
STOP_GRACE_S = 150.0  # as bench.impala.compare gives a stopped run to write its checkpoint
STOPPED = 130  # bench.impala's exit status when stopped before --total-frames
SETS_IT = "bench.hosts sets it for every job"
REFUSED_JOB_FLAGS = {
    "--peers": SETS_IT,
    "--group": SETS_IT,
    "--peer-host": SETS_IT,
    "--out": SETS_IT,
    "--member-seed": "every job gets the flags after --, and one member seed would have every host play the same "
    "games; each job draws its own",
}
"""job flags refused after --, and why"""


@dataclass
class Args:
    hosts: int = 2
    """hosts to make, each a network namespace with its own address on one switch"""
    link: str = "1gbit,0.5ms"
    """every host's link: RATE,DELAY as tc writes them (10gbit,50us; 1gbit,0.5ms; 0: no limit, no delay)"""
    seconds: float = 120.0
    """how long the jobs run before they are stopped as Ctrl+C stops them (they may end sooner)"""
    cores: str = "split"
    """split: each host's job on its own share of this machine's cores; all: every job on every core"""
    out: str = ""
    """folder for each host's run (h0/, h1/ ...) and log (h0.log ...); unset: runs/hosts-<date>-<time>"""


def parse_args(argv: list[str] | None) -> tuple[Args, Link, list[str]]:
    argv = sys.argv[1:] if argv is None else list(argv)
    job_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    mine = argv[: argv.index("--")] if "--" in argv else argv
    parser = parser_for(
        Args,
        "python -m bench.hosts",
        "The README's several-hosts commands on hosts made on this machine (network namespaces),\n"
        "joined by links of a chosen rate and delay. As root.",
        epilog="examples:\n"
        "  python -m bench.hosts                                   2 hosts, 1gbit,0.5ms links, 120 s\n"
        "  python -m bench.hosts --hosts 3 --link 10gbit,50us --seconds 120\n"
        "  python -m bench.hosts -- --env ALE/Breakout-v5          after --: more options for every job",
        choices={"cores": ("split", "all")},
    )
    args = Args(**vars(parser.parse_args(mine)))
    if args.hosts < 1:
        parser.error(f"--hosts must be at least 1, got {args.hosts}")
    if args.seconds <= 0:
        parser.error(f"--seconds must be > 0, got {args.seconds}")
    try:
        link = Link.parse(args.link)
    except ValueError as e:
        parser.error(f"--link: {e}")
    for flag, why in REFUSED_JOB_FLAGS.items():
        if flag in job_args or any(a.startswith(flag + "=") for a in job_args):
            parser.error(f"{flag}: {why}")
    return args, link, job_args


def core_shares(count: int, mode: str) -> list[list[int] | None]:
    """Each host's cores: this process's cores cut into ``count`` shares (round-robin when
    there are fewer cores than hosts), or None for every host with ``all``."""
    cores = sorted(os.sched_getaffinity(0))
    if mode == "all":
        return [None] * count
    if len(cores) < count:
        return [[cores[i % len(cores)]] for i in range(count)]
    size = len(cores) // count
    return [cores[i * size : (i + 1) * size] for i in range(count)]


def tee(proc: subprocess.Popen, label: str, log_path: str) -> threading.Thread:
    """Copy ``proc``'s output to ``log_path`` and to stdout, each line prefixed with ``label``."""

    def copy() -> None:
        with open(log_path, "w") as log:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                sys.stdout.write(f"[{label}] {line}")
                sys.stdout.flush()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


def measure_line(hosts: Hosts) -> str:
    seen = hosts.measure(0, 1, rounds=50, mib=16)
    rtt = seen["rtt_us"]
    rate = seen["mib"] * 8 * 2**20 / seen["seconds"] / 1e9
    return (
        f"link h0 -> h1 measured: round trip min {rtt[0]:.0f} us, median {statistics.median(rtt):.0f} us, "
        f"max {rtt[-1]:.0f} us (50 pings); {seen['mib']} MiB in {seen['seconds']:.3f} s ({rate:.2f} Gbit/s)"
    )


def run(args: Args, link: Link, job_args: list[str]) -> int:
    out = args.out or os.path.join("runs", time.strftime("hosts-%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    env = {**os.environ, "SHMPAD_TOKEN": secrets.token_hex(16)}
    shares = core_shares(args.hosts, args.cores)
    with Hosts(args.hosts, link) as hosts:
        delay = f", delay by {hosts.delay_by}" if hosts.delay_by else ""
        print(f"# bench.hosts: {args.hosts} hosts on one switch, each link {link}{delay}; output in {out}", flush=True)
        for host, cpus in zip(hosts, shares):
            print(f"#   h{host.index}: {host.ip} ({host.namespace}), cores {cpus or 'all'}", flush=True)
        if args.hosts >= 2:
            print(f"# {measure_line(hosts)}", flush=True)
        address = f"{hosts[0].ip}:{PORT}"
        broker_cmd = [sys.executable, "-m", "shmpad.net.broker", "--host", hosts[0].ip, "--port", str(PORT)]
        broker = hosts[0].popen(broker_cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threads = [tee(broker, "broker", os.path.join(out, "broker.log"))]
        jobs = []
        for host, cpus in zip(hosts, shares):
            cmd = [sys.executable, "-m", "bench.impala", "--peers", address, "--group", "hosts"]
            cmd += ["--peer-host", host.ip, "--out", os.path.join(out, f"h{host.index}"), *job_args]
            print(f"# h{host.index}$ {' '.join(cmd[1:])}", flush=True)
            proc = host.popen(cmd, cpus=cpus, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            jobs.append(proc)
            threads.append(tee(proc, f"h{host.index}", os.path.join(out, f"h{host.index}.log")))
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline and any(j.poll() is None for j in jobs):
            hosts.check()
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        stopped = [j for j in jobs if j.poll() is None]
        for job in stopped:
            os.killpg(job.pid, signal.SIGINT)
        for job in stopped:
            try:
                job.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
        hosts[0].kill()  # the broker; the jobs' sessions are over
        for thread in threads:
            thread.join(30)
    failed = [
        f"h{i}: exit {j.returncode}"
        for i, j in enumerate(jobs)
        if j.returncode != 0 and not (j in stopped and j.returncode == STOPPED)
    ]
    ends = ", ".join(f"h{i} {'stopped' if j in stopped else 'ended'} ({j.returncode})" for i, j in enumerate(jobs))
    print(f"# bench.hosts: {ends}; the hosts are removed", flush=True)
    if failed:
        print(f"# bench.hosts: FAILED: {'; '.join(failed)} (logs in {out})", flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args, link, job_args = parse_args(argv)
    exit_on_sigterm()
    try:
        return run(args, link, job_args)
    except HostsUnavailable as e:
        print(f"python -m bench.hosts: error: cannot make the hosts here: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
