"""Command lines from dataclasses: one ``--option`` per field, its help the field's docstring.

A benchmark declares its options as an ``Args`` dataclass (CleanRL style), with a
docstring under every field; ``parser_for(Args, ...)`` turns that into an argparse
parser, so the options are written once.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools

__all__ = ["parser_for"]


def parser_for(cls: type, prog: str, description: str) -> argparse.ArgumentParser:
    """A parser with ``--field-name`` for every field of the dataclass ``cls``: a flag for
    a bool, else a value of the field's type (int, float or str) defaulting to the field's."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    docs = _field_docs(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            parser.add_argument(flag, action="store_true", help=docs[f.name])
        else:
            kind = {"int": int, "float": float}.get(f.type, str)
            parser.add_argument(flag, type=kind, default=f.default, help=f"{docs[f.name]} (default: {f.default})")
    return parser


def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each dataclass field (read from the source)."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    docs = {}
    for stmt, nxt in itertools.pairwise(body):
        if isinstance(stmt, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[stmt.target.id] = nxt.value.value
    return docs
