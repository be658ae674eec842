"""The learner alone, bf16 against fp32: bench.impala_learner_cost's bare loop (the default Pong job's
learner: Nature CNN, compiled, its plan's threads), 3 interleaved rounds. Run from any folder with this
repository's venv active: python docs/results/cpu-bf16/learner_rounds.py"""

from bench import impala
from bench import impala_learner_cost as cost

cost.LEARNER_SECONDS = 6.0
res = {"on": [], "off": []}
for r in range(3):
    for b in ("off", "on") if r % 2 == 0 else ("on", "off"):
        args = impala.parse_args(["--bf16", b, "--pin", "off"], measuring=True)
        out = cost._bare_loop(args, impala.env_config(args).spec())
        res[b].append(out["updates_per_s"])
        print(r, b, round(out["updates_per_s"], 3), flush=True)
print({k: [round(x, 3) for x in v] for k, v in res.items()})
print("ratios on/off", [round(a / b, 2) for a, b in zip(res["on"], res["off"])])
