#!/bin/sh
# Alternating runs of bench.ringbuf, SPSC 64 B get_bytes 1->1, from two checkouts:
#   OLD=/path/to/main NEW=/path/to/this ROUNDS=5 sh docs/results/ringbuf-exactly-once/run.sh > raw.jsonl
# Each line: {"code": "old"|"new", "round": i, ...the bench's JSON line}.
set -e
for i in $(seq 1 "${ROUNDS:-5}"); do
  for code in old new; do
    if [ "$code" = old ]; then dir=$OLD; else dir=$NEW; fi
    line=$(cd "$dir" && PYTHONPATH=$dir python -m bench.ringbuf --sizes 64 --producers 1 \
      --subjects shmpad-spsc --rounds 1 --seconds 1 --json 2>/dev/null | grep '"transport"')
    echo "{\"code\": \"$code\", \"round\": $i, ${line#\{}"
  done
done
