"""``python -m shmpad.top [PROGRAM] [--once] [--json] [--interval S]``.

Without a program it lists the shmpad programs running on this host. With one (its name
or its launcher's pid) it shows the program live, refreshed every ``--interval`` seconds,
until the program ends or Ctrl+C; ``--once`` shows one sample (rates over one interval)
and exits; ``--json`` prints it as JSON for scripts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from shmpad.top.sample import Sampler, find_program, programs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m shmpad.top",
        description="A live view of a running shmpad program on this host: its nodes (CPU, memory, state), "
        "rings, weight stores, courier servers and the counters its nodes publish.",
    )
    parser.add_argument("program", nargs="?", help="the program's name or its launcher's pid (default: list them)")
    parser.add_argument("--once", action="store_true", help="print one sample and exit")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables (with --once, or a list)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    return parser


def _console():
    try:
        from rich.console import Console
    except ImportError:
        sys.exit("python -m shmpad.top needs rich for its tables: pip install 'shmpad[top]' (or use --once --json)")
    return Console()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not (0.05 <= args.interval <= 3600):
        _parser().error(f"--interval must be between 0.05 and 3600 seconds, got {args.interval}")
    if args.program is None:
        running = programs()
        if args.json:
            print(json.dumps(running, indent=1))
        else:
            from shmpad.top.view import render_programs

            _console().print(render_programs(running))
        return 0
    try:
        sampler = Sampler(find_program(args.program))
    except LookupError as e:
        print(f"shmpad.top: {e}", file=sys.stderr)
        return 2
    try:
        if args.once:
            sampler.sample()
            time.sleep(args.interval)  # the rates are over this interval
            sample = sampler.sample()
            if args.json:
                print(json.dumps(sample, indent=1))
            else:
                from shmpad.top.view import render

                _console().print(render(sample))
            return 0
        if args.json:
            _parser().error("--json prints one sample: use it with --once")
        return _live(sampler, args.interval)
    finally:
        sampler.close()


def _live(sampler: Sampler, interval: float) -> int:
    console = _console()
    from rich.live import Live

    from shmpad.top.view import render

    try:
        with Live(render(sampler.sample()), console=console, auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(interval)
                sample = sampler.sample()
                live.update(render(sample), refresh=True)
                if sample["phase"] in ("ended", "launcher gone"):
                    break
        console.print(f"program {sample['program']!r} has ended")
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
