#!/usr/bin/env bash
# The README's test command five times in a row, in the fresh clone's venv, while the soak's job keeps both cores busy.
cd /work/runs/s45/main && . .venv/bin/activate
for i in 1 2 3 4 5; do
  out=/work/runs/s45/suite/run-$i.txt
  {
    echo "# run $i of 5, commit $(git rev-parse --short HEAD), started $(date -u +%FT%TZ)"
    echo "# /proc/loadavg at start: $(cat /proc/loadavg)"
    echo "# command: python -m pytest -q"
  } > "$out"
  start=$(date +%s)
  python -m pytest -q >> "$out" 2>&1
  rc=$?
  end=$(date +%s)
  {
    echo "# exit status $rc, $((end - start)) s, ended $(date -u +%FT%TZ)"
    echo "# /proc/loadavg at end: $(cat /proc/loadavg)"
  } >> "$out"
  echo "run $i rc=$rc $((end - start)) s" >> /work/runs/s45/suite/summary.txt
done
