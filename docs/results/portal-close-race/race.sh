#!/usr/bin/env bash
# The actor restart of bench.portal.launcher, N rounds of three configurations, interleaved:
#   portal         portal 3.8.3, the restart's close unbounded
#   portal-bound   portal 3.8.3, --close-timeout 5 (what tests/test_portal_program.py runs)
#   shmpad         shmpad.portal, unbounded
# A run that has not ended in 60 s is interrupted (SIGINT, as a user's Ctrl-C) and counted as hung;
# any of its processes still alive after that are killed by the pids it recorded.
# The output of a hung run is kept beside this script as hung-CONFIG-ROUND.log.
# Usage: bash docs/results/portal-close-race/race.sh [N] > docs/results/portal-close-race/runs.tsv
#        CONFIGS=portal bash docs/results/portal-close-race/race.sh 30 > .../runs-portal.tsv
set -u
N=${1:-40}
OUT=$(mktemp -d)
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE/../../.."
printf 'round\tconfig\texit\tseconds\tclose_s\trestarts\tsteps\n'
for round in $(seq 1 "$N"); do
  for config in ${CONFIGS:-portal portal-bound shmpad}; do
    case $config in
      portal) flags="--impl portal" ;;
      portal-bound) flags="--impl portal --close-timeout 5" ;;
      shmpad) flags="--impl shmpad.portal" ;;
    esac
    dir=$OUT/$config-$round
    began=$(date +%s.%N)
    timeout -s INT 60 python -m bench.portal.launcher --logdir "$dir" $flags \
      --envs 3 --batch 3 --steps 6 --restart-after 10 > "$dir.log" 2>&1
    code=$?
    seconds=$(python -c "print(f'{$(date +%s.%N) - $began:.1f}')")
    sleep 2
    if [ "$code" = 124 ]; then cp "$dir.log" "$HERE/hung-$config-$round.log"; fi
    for f in "$dir"/pids/*; do kill -KILL "${f##*-}" 2>/dev/null; done
    python - "$dir" "$round" "$config" "$code" "$seconds" <<'PY'
import json, pathlib, sys
d, rnd, cfg, code, sec = sys.argv[1:]
p = pathlib.Path(d) / "logger.json"
c = json.loads(p.read_text()) if p.exists() else {}
close = c.get("actor/close_s")
print(rnd, cfg, code, sec, "-" if close is None else f"{close:.2f}", int(c.get("actor/restarts", 0)), int(c.get("train/steps", 0)), sep="\t")
PY
  done
done
rm -rf "$OUT"
