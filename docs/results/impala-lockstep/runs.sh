#!/usr/bin/env bash
# bench.impala --lockstep on the pixel test's settings (tests/test_bench_impala.py,
# test_pixels_learn_through_the_full_stack): seeds 0-2, with bf16 inference as the plan
# chooses it here (auto) and off (as on a CPU without native bf16), and seed 0 twice more
# with each to show that a run repeats itself. Prints, per run, the final mean return over
# the last 100 episodes and a digest of the checkpoint's weights and of episodes.csv.
# Usage: bash docs/results/impala-lockstep/runs.sh > docs/results/impala-lockstep/runs.txt
# BF16S and SEEDS choose other runs; with PyTorch's kernels held to AVX2 (as on a CPU without AVX-512):
#   ATEN_CPU_CAPABILITY=avx2 BF16S=off SEEDS="0 1 2 0" bash docs/results/impala-lockstep/runs.sh > .../runs-avx2.txt
# and oneDNN (the convolutions) held to AVX2 as well:
#   ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 BF16S=off SEEDS="0 1 2 0" bash ... > .../runs-onednn-avx2.txt
# and LOCKSTEP= runs the same without --lockstep (asynchronous, as before):
#   LOCKSTEP= BF16S=auto SEEDS="0 0" bash docs/results/impala-lockstep/runs.sh > .../async.txt
set -eu
cd "$(dirname "$0")/../../.."
OUT=$(mktemp -d)
lscpu | grep -E '^Model name|^Flags' | sed 's/^Flags:.*\(avx512_bf16\).*/Flags: ... \1 .../; s/^Flags:.*avx2.*/Flags: ... avx2 (no avx512_bf16) .../' | head -2
LOCKSTEP=${LOCKSTEP---lockstep}
echo "ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-} ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-} LOCKSTEP=$LOCKSTEP"
for bf16 in ${BF16S:-auto off}; do
  for seed in ${SEEDS:-0 1 2 0}; do
    run=$OUT/bf16-$bf16-seed-$seed-$RANDOM
    python -m bench.impala --env shmpad/Spot-v0 --model shallow --compile off --total-frames 40000 \
      --batch-size 8 --num-workers 1 --envs-per-worker 8 --learner-threads 1 --learning-rate 0.002 \
      --discount 0.5 --log-interval 5 --launch-type test_mp $LOCKSTEP --bf16 $bf16 --seed $seed \
      --out "$run" > "$run.log" 2>&1
    python - "$run" "$bf16" "$seed" <<'PY'
import csv, hashlib, sys, torch
run, bf16, seed = sys.argv[1:]
rows = list(csv.DictReader(open(f"{run}/log.csv")))
state = torch.load(f"{run}/checkpoint.pt", weights_only=False)
weights = hashlib.sha256(b"".join(state["model"][k].numpy().tobytes() for k in sorted(state["model"]))).hexdigest()[:16]
episodes = hashlib.sha256(open(f"{run}/episodes.csv", "rb").read()).hexdigest()[:16]
print(f"bf16 {bf16:4}  seed {seed}  frames {rows[-1]['frames']:>6}  steps {state['steps']:4}  "
      f"mean_return {float(rows[-1]['mean_return']):6.2f}  weights {weights}  episodes {episodes}")
PY
  done
done
rm -rf "$OUT"
