"""What ``pip install .`` gives besides the packages: the documented console scripts, and
the license the project metadata names."""

from __future__ import annotations

import importlib
import os

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest brings tomli, the same parser
    import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.rl  # imports bench.impala
def test_the_console_scripts_name_callables_and_the_license_is_there():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["scripts"] == {"shmpad-impala": "bench.impala.train:main", "shmpad-broker": "shmpad.net.broker:main"}
    for target in project["scripts"].values():
        module, _, name = target.partition(":")
        assert callable(getattr(importlib.import_module(module), name)), target
    assert project["license"] == {"text": "Apache-2.0"}
    with open(os.path.join(ROOT, "LICENSE")) as f:
        text = f.read()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
