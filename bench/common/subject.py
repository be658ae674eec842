"""What every benchmark measures: subjects, each with a name and a family, chosen on
the command line by name, glob or family, and left out when their imports fail here.

Each benchmark's subject module extends ``Subject`` with its own contract (what runs
in which process); this base holds only what every contract shares.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

__all__ = ["Subject", "available", "select"]


class Subject:
    """Built in the parent from a plan before any fork; closed in the parent once
    every child has exited (or been killed)."""

    name: ClassVar[str]
    family: ClassVar[str]  # "shmpad" for ours; the others per benchmark ("peer", "ceiling", "floor")

    def __init__(self, plan: Any):
        self.plan = plan

    def close(self) -> None:
        pass


S = TypeVar("S", bound=type[Subject])


def select(subjects: list[S], patterns_text: str) -> list[S]:
    """The subjects ``--subjects`` names: comma-separated names, globs or families."""
    patterns = [p.strip() for p in patterns_text.split(",") if p.strip()]
    chosen = [s for s in subjects if any(p == s.family or fnmatch.fnmatchcase(s.name, p) for p in patterns)]
    if not chosen:
        names = ", ".join(s.name for s in subjects)
        families = ", ".join(dict.fromkeys(s.family for s in subjects))
        raise SystemExit(f"--subjects {patterns_text!r} matches none of: {names} (or a family: {families})")
    return chosen


def available(subjects: list[S], why_not: Callable[[S], str | None]) -> tuple[list[S], list[str]]:
    """Subjects whose imports work here, and a note for each one left out:
    ``why_not(subject)`` says what is missing, or None when nothing is."""
    ok, notes = [], []
    for s in subjects:
        reason = why_not(s)
        if reason is None:
            ok.append(s)
        else:
            notes.append(f"{s.name}: skipped, {reason}")
    return ok, notes
