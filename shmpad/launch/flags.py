"""Launchpad's command-line flags, on absl's ``FLAGS`` when absl is importable.

Launchpad programs are absl apps (``app.run(main)``) and pass ``--lp_launch_type=...``:
absl refuses a flag nobody defined, so importing shmpad defines Launchpad's flags with
Launchpad's names and types (once: a program that also imports Launchpad keeps its
definitions). ``launch()`` reads the values an absl app parsed from its command line
(``app.run`` does before ``main``); otherwise, and without absl, it reads ``sys.argv``
itself, every time.

One default differs from Launchpad's: ``--lp_launch_type`` defaults to shmpad's
default launch type, ``local_mp`` (Launchpad's is ``local_mt``), so that
``LAUNCH_TYPE.value`` is what ``launch()`` does.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

__all__ = ["LAUNCH_TYPE", "absl_value", "argv_value"]

try:
    from absl import flags as _absl_flags
except ImportError:  # shmpad runs without absl: it reads argv itself
    _absl_flags = None

_LAUNCH_TYPES = ["local_mt", "local_mp", "test_mt", "test_mp"]
_DEFAULT_LAUNCH_TYPE = "local_mp"


def argv_value(name: str, argv: Sequence[str]) -> str | None:
    """The value of ``--name=value`` or ``--name value`` in ``argv`` (the last one wins)."""
    value = None
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
        elif arg == f"--{name}" and i + 1 < len(argv):
            value = argv[i + 1]
    return value


class _ArgvFlag:
    """``LAUNCH_TYPE`` without absl: ``.value`` as the command line gives it."""

    def __init__(self, name: str, default: str):
        self.name = name
        self.default = default

    @property
    def value(self) -> str:
        return argv_value(self.name, sys.argv[1:]) or self.default


def _define() -> Any:
    """Define Launchpad's flags on absl's FLAGS unless defined already; the launch type's
    flag holder (or, without absl, an ``_ArgvFlag``)."""
    if _absl_flags is None:
        return _ArgvFlag("lp_launch_type", _DEFAULT_LAUNCH_TYPE)
    fl, defined = _absl_flags, _absl_flags.FLAGS
    if "lp_launch_type" in defined:
        holder = _absl_flags.FlagHolder(defined, defined["lp_launch_type"])
    else:
        holder = fl.DEFINE_enum(
            "lp_launch_type",
            _DEFAULT_LAUNCH_TYPE,
            _LAUNCH_TYPES,
            "How to launch a Launchpad program when launch() is called",
            allow_override=True,
        )
    if "lp_termination_notice_secs" not in defined:
        fl.DEFINE_integer(
            "lp_termination_notice_secs",
            10,
            "Seconds a stopping node gets before it is killed (a finite number >= 0; 0 kills at once).",
        )
    if "lp_worker_manager_v2" not in defined:
        fl.DEFINE_bool(
            "lp_worker_manager_v2", False, "Accepted for Launchpad compatibility; shmpad has one worker manager."
        )
    if "tmux_open_window" not in defined:
        fl.DEFINE_string("tmux_open_window", None, "Accepted for Launchpad compatibility (shmpad does not use tmux).")
    if "tmux_session_name" not in defined:
        fl.DEFINE_string(
            "tmux_session_name", "launchpad", "Accepted for Launchpad compatibility (shmpad does not use tmux)."
        )
    return holder


# Set via --lp_launch_type; Launchpad's ``lp.LAUNCH_TYPE`` (``LAUNCH_TYPE.value`` is a str).
LAUNCH_TYPE = _define()


def absl_value(name: str) -> Any:
    """The value of Launchpad's flag ``name`` that an absl app parsed from its command line
    (``app.run`` parses before ``main``); None without absl, before absl parsed, or when
    the flag was not given. shmpad never parses ``sys.argv`` into absl's global ``FLAGS``
    itself: values parsed once would stick for the life of the process, whatever the
    command line of a later ``launch()`` says; it reads ``sys.argv`` instead."""
    if _absl_flags is None:
        return None
    defined = _absl_flags.FLAGS
    if not defined.is_parsed() or name not in defined or not defined[name].present:
        return None
    return defined[name].value
