"""Command lines from dataclasses: one ``--option`` per field, its help the field's docstring.

A benchmark declares its options as an ``Args`` dataclass (CleanRL style), with a
docstring under every field; ``parser_for(Args, ...)`` turns that into an argparse
parser, so the options are written once. The metavar of an option shows its default
(``--total-frames 200000``), so the help needs no ``(default: ...)`` after every line.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
from collections.abc import Mapping, Sequence

__all__ = ["explicit_options", "parser_for"]


def parser_for(
    cls: type,
    prog: str,
    description: str,
    groups: Mapping[str, Sequence[str]] | None = None,
    choices: Mapping[str, Sequence[str]] | None = None,
    epilog: str | None = None,
    negatable: Sequence[str] = (),
    defaults: Mapping[str, object] | None = None,
) -> argparse.ArgumentParser:
    """A parser with ``--field-name`` for every field of the dataclass ``cls``: a flag for
    a bool, else a value of the field's type (int, float or str) defaulting to the field's,
    or to its value in ``defaults`` (which ``--help`` then shows). ``groups`` maps a heading
    to the fields listed under it in ``--help`` (the others come under "options"); ``choices``
    gives the values a field accepts; a bool field named in ``negatable`` (one that a default
    may turn on), or on in ``defaults``, also gets ``--no-field-name``. A bool the command line
    leaves out is left out of the parsed namespace: ``cls(**{**defaults, **vars(namespace)})``
    is the command line's instance."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    docs = _field_docs(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    choices = dict(choices or {})
    for name in [*choices, *(n for names in (groups or {}).values() for n in names)]:
        if name not in fields:
            raise ValueError(f"{cls.__name__} has no field {name!r}; its fields: {', '.join(fields)}")
    homes = {}
    for title, names in (groups or {}).items():
        group = parser.add_argument_group(title)
        homes.update(dict.fromkeys(names, group))
    defaults = dict(defaults or {})
    for f in fields.values():
        flag = "--" + f.name.replace("_", "-")
        home = homes.get(f.name, parser)
        default = defaults.get(f.name, f.default)
        if f.type in ("bool", bool) and (f.name in negatable or default is True):
            # unset, the attribute is left out and the dataclass field (or ``defaults``) gives it
            help_ = f"{docs[f.name]} [{'on' if default else 'off'}]"
            home.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_)
        elif f.type in ("bool", bool):
            home.add_argument(flag, action="store_true", default=argparse.SUPPRESS, help=docs[f.name])
        elif f.name in choices:
            home.add_argument(flag, choices=choices[f.name], default=default, help=f"{docs[f.name]} [{default}]")
        else:
            kind = {"int": int, "float": float}.get(f.type, str)
            metavar = str(default) if default != "" else f.name.upper()
            home.add_argument(flag, type=kind, default=default, metavar=metavar, help=docs[f.name])
    return parser


def explicit_options(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> set[str]:
    """The fields the command line sets (``argv`` as for ``parse_args``), defaults not counted."""
    unset = object()
    namespace = argparse.Namespace(**{a.dest: unset for a in parser._actions if a.dest != "help"})
    parsed = parser.parse_args(argv, namespace=namespace)  # argparse fills in defaults only where unset
    return {name for name, value in vars(parsed).items() if value is not unset}


def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each dataclass field (read from the source)."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    docs = {}
    for stmt, nxt in itertools.pairwise(body):
        if isinstance(stmt, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[stmt.target.id] = nxt.value.value
    return docs
