cd /tmp  # any folder: the editable install of this repository runs
for r in 1 2 3 4; do
 for b in off on; do
  [ $(( r % 2 )) -eq 0 ] && b=$([ $b = off ] && echo on || echo off)
  rm -rf /tmp/bf16run; timeout 300 python -m bench.impala --bf16 $b --total-frames 200000 --log-interval 5 --out /tmp/bf16run > /tmp/bf16run.log 2>&1
  python -c "
import csv,statistics
rows=list(csv.DictReader(open('/tmp/bf16run/log.csv')))
rows=rows[len(rows)//3:]
print('bf16=$b round $r', round(statistics.median(float(x['fps']) for x in rows)), [round(float(x['fps'])) for x in rows], 'env busy', [x['env_busy'] for x in rows][-2:], 'learner ms', [x['learner_ms'] for x in rows][-2:], flush=True)
"
 done
done
