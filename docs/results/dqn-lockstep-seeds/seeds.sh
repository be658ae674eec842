#!/bin/bash
# python -m bench.dqn in lock step for seeds 1-10, two at a time (2 cores), as tests/test_bench_dqn.py
# runs it; from the repository root: bash docs/results/dqn-lockstep-seeds/seeds.sh [OUT]
out=${1:-docs/results/dqn-lockstep-seeds}
for pair in "1 2" "3 4" "5 6" "7 8" "9 10"; do
  for s in $pair; do
    python -m bench.dqn --lockstep --num-actors 1 --seed $s --max-updates 12000 --max-seconds inf \
      --out "$out/seed$s.json" > "$out/seed$s.log" 2>&1 &
  done
  wait
done
