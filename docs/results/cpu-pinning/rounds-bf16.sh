# The default Pong job (bf16 learner and actors, compiled learner) pinned and not, and pinned
# with 32 environments per worker: 3 rounds, the order rotating each round; the median frames/s
# of each run's rows after its first third. Run from any folder with this repository's venv active.
cd /tmp
arms=("--pin on" "--pin off" "--pin on --envs-per-worker 32")
for r in 1 2 3; do
 for k in 0 1 2; do
  arm=${arms[$(( (k + r - 1) % 3 ))]}
  rm -rf /tmp/pinrun3; timeout 300 python -m bench.impala $arm --total-frames 150000 --log-interval 5 --out /tmp/pinrun3 > /tmp/pinrun3.log 2>&1
  python -c "
import csv,statistics
rows=list(csv.DictReader(open('/tmp/pinrun3/log.csv')))
rows=rows[len(rows)//3:]
print('$arm | round $r', round(statistics.median(float(x['fps']) for x in rows)), [round(float(x['fps'])) for x in rows], 'learner waits', [x['wait_fraction'] for x in rows][-2:], 'env busy', [x['env_busy'] for x in rows][-2:], 'inference ms', [x['inference_ms'] for x in rows][-2:], 'learner ms', [x['learner_ms'] for x in rows][-2:], flush=True)
"
 done
done
