"""The layout's promises that import-linter cannot see: what ``import shmpad`` loads."""

import subprocess
import sys


def _modules_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return set(out.stdout.split())


def test_import_shmpad_loads_neither_torch_nor_the_broker():
    loaded = _modules_after("import shmpad")
    assert "torch" not in loaded
    assert "shmpad.net.broker" not in loaded
    assert "shmpad.net.accumulator" not in loaded


def test_the_broker_runs_as_a_module_without_a_second_copy():
    # ``python -m shmpad.net.broker`` runs the module as __main__: the package must not have imported it already
    out = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", "shmpad.net.broker", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "usage" in out.stdout.lower()
