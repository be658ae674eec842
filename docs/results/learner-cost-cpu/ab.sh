#!/usr/bin/env bash
# The APPO learner's update before and after f31c8b6 (RunningNorm's moments of frames in one
# numba pass; APPO's targets evaluated in chunks, compiled), in interleaved rounds: each round
# runs `python -m bench.impala.learner_cost` once in a tree at 51dc46e (the learner before,
# with f31c8b6's bench/impala/learner_cost.py copied in) and once in a tree at f31c8b6, the
# order alternating. Two arms each: the default job on this CPU (Pong APPO, bf16, compiled, one
# learner thread) and the same on AVX2's kernels in fp32 (--isa avx2 --bf16 off).
# Usage: bash ab.sh OUT [ROUNDS]   (from the repository root; OUT gets each run's --save folder)
set -euo pipefail
out=$(realpath -m "$1")
rounds=${2:-3}
root=$(pwd)
trees=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$trees/before" 2>/dev/null || true; git -C "$root" worktree remove --force "$trees/after" 2>/dev/null || true; rm -rf "$trees"' EXIT
git worktree add -q --detach "$trees/before" 51dc46e
git worktree add -q --detach "$trees/after" f31c8b6
git show f31c8b6:bench/impala/learner_cost.py > "$trees/before/bench/impala/learner_cost.py"
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
    for tree in $order; do
        echo "round $r: $tree" >&2
        (cd "$trees/$tree" && "$root/.venv/bin/python" -m bench.impala.learner_cost --rounds 1 \
            --arm "" --arm "--isa avx2 --bf16 off" --save "$out/$tree-$r" > /dev/null)
    done
done
