cd /tmp  # any folder: the editable install of this repository runs
for r in 1 2 3 4; do
 for pin in off on; do
  [ $(( r % 2 )) -eq 0 ] && pin=$([ $pin = off ] && echo on || echo off)
  rm -rf /tmp/pinrun2; timeout 300 python -m bench.impala --pin $pin --total-frames 150000 --log-interval 5 --out /tmp/pinrun2 > /tmp/pinrun2.log 2>&1
  python -c "
import csv,statistics
rows=list(csv.DictReader(open('/tmp/pinrun2/log.csv')))
rows=rows[len(rows)//3:]
print('pin=$pin round $r', round(statistics.median(float(x['fps']) for x in rows)), [round(float(x['fps'])) for x in rows], 'env busy', [x['env_busy'] for x in rows][-2:], 'learner ms', [x['learner_ms'] for x in rows][-2:], flush=True)
"
 done
done
