"""The learner alone, bf16 against fp32: bench.impala.learner_cost's bare loop (the default Pong job's
learner: Nature CNN, compiled, its plan's threads), 3 interleaved rounds. Run from any folder with this
repository's venv active: python docs/results/cpu-bf16/learner_rounds.py

The figures in this folder were made by this script's first version (commit 8b2275f), which called the
same loop through the modules of then, bench.impala and bench.impala_learner_cost; it now goes through
bench.impala.train and bench.impala.learner_cost, which took their place."""

from bench.impala import learner_cost as cost
from bench.impala import train

cost.LEARNER_SECONDS = 6.0
res = {"on": [], "off": []}
for r in range(3):
    for b in ("off", "on") if r % 2 == 0 else ("on", "off"):
        job = train.resolve(train.parse_args(["--bf16", b, "--pin", "off"]))
        out = cost._bare_loop(job, job.env.spec())
        res[b].append(out["updates_per_s"])
        print(r, b, round(out["updates_per_s"], 3), flush=True)
print({k: [round(x, 3) for x in v] for k, v in res.items()})
print("ratios on/off", [round(a / b, 2) for a, b in zip(res["on"], res["off"])])
