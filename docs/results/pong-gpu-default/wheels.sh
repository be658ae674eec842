#!/usr/bin/env bash
# The packages shmpad's job needs that the GPU box's image lacks (its python3 is 3.12 with torch, numba,
# numpy, matplotlib, cloudpickle, absl-py and typing-extensions, but no gymnasium, ale-py, posix-ipc or
# setproctitle) as wheels for CPython 3.12 on x86-64 Linux, fetched here into .whl/ at the repository's
# root, which git ignores (.git/info/exclude) and the device call carries. The versions are the ones this
# repository's tests ran with. Run from the repository's root: bash docs/results/pong-gpu-default/wheels.sh
set -euo pipefail
mkdir -p .whl .git/info
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d .whl gymnasium==1.4.0 farama-notifications==0.0.6 ale-py==0.12.1 posix-ipc==1.3.2 setproctitle==1.3.8
ls -l .whl
