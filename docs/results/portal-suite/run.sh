#!/usr/bin/env bash
# portal's own test suite, run against portal and against shmpad.portal with only the
# import changed (`import portal` -> `import shmpad.portal as portal`). The tests are
# copied to a scratch folder outside the repository; none of them is kept here.
#
#   bash docs/results/portal-suite/run.sh PORTAL_CHECKOUT PORTAL_PYTHON
#
# PORTAL_CHECKOUT: a checkout of danijar/portal (its tests/ folder is used);
# PORTAL_PYTHON: a Python with portal, pytest and pytest-timeout installed (not this
# repository's venv). shmpad.portal runs with this repository's .venv.
set -euo pipefail
src=$1
portal_python=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
work=$(mktemp -d)
cp -r "$src/tests" "$work/portal"
cp -r "$src/tests" "$work/shmpad"
sed -i 's/^import portal$/import shmpad.portal as portal/' "$work"/shmpad/*.py
run() {  # folder, python, output
    (cd "$1" && uptime && "$2" -m pytest -p no:cacheprovider --timeout 120 -rf -v . ; uptime) > "$3" 2>&1 || true
}
run "$work/portal" "$portal_python" "$here/portal-3.8.3.txt"
PYTHONPATH="$root" run "$work/shmpad" "$root/.venv/bin/python" "$here/shmpad.portal.txt"
rm -rf "$work"
