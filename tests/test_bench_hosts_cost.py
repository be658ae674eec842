"""``python -m bench.hosts.cost``'s mechanics: one short round on real hosts whose report adds
up (ratios are the arms' own rates, bytes per step are the model's), the arms' order, and
bad options named with their values. Not a measurement: tiny model, two steps an arm.
"""

from __future__ import annotations

import json
import statistics

import pytest
from helpers.hosts import unavailable

from bench.hosts import cost
from bench.hosts.cost_worker import model_for, parameter_bytes

TINY = ["--frame", "36", "--batch", "2", "--steps", "2", "--warmup", "1", "--rounds", "1"]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--hosts", "1"], "--hosts takes group sizes of at least 2, got '1'"),
        (["--hosts", "two"], "--hosts takes comma-separated group sizes, got 'two'"),
        (["--links", "fast"], "--links: a link's rate is a number and one of bit, kbit, mbit, gbit (or 0), got 'fast'"),
        (
            ["--links", "0", "--half-links", "1gbit,0.5ms"],
            "--half-links must be links of --links (0), got '1gbit,0.5ms'",
        ),
        (["--backends", "nccl"], "--backends takes comma-separated entries of shmpad, gloo, got 'nccl'"),
        (["--rounds", "0"], "--rounds must be at least 1, got 0"),
        (["--steps", "0"], "--steps must be at least 1, got 0"),
        (["--frame", "20"], "--frame must be at least 36 (the Nature CNN's smallest input), got 20"),
    ],
)
def test_bad_options_name_their_values(argv, words, capsys):
    with pytest.raises(SystemExit):
        cost.parse_args(argv)
    assert words in capsys.readouterr().err


def test_every_round_runs_every_arm_once_and_the_order_turns_over():
    arms = cost.arms_of([2, 3], ["0", "1gbit,0.5ms"], ["shmpad", "gloo"], ["1gbit,0.5ms"])
    assert len(arms) == 1 + 2 * 2 * 2 + 2 * 2  # alone, full arms, half arms on one link
    orders = [cost.order(arms, r) for r in range(4)]
    for o in orders:
        assert sorted(a.name for a in o) == sorted(a.name for a in arms)
    assert len({tuple(a.name for a in o) for o in orders}) == 4


def test_one_short_round_adds_up(tmp_path, capsys):
    argv = ["--links", "0", "--backends", "shmpad", "--half-links", "0", *TINY, "--save", str(tmp_path)]
    status = cost.main(argv)
    out = capsys.readouterr()
    if status == 2 and "cannot make the hosts here" in out.err:
        unavailable(out.err.strip())
    assert status == 0, out.out + out.err
    report = json.loads((tmp_path / "report.json").read_text())
    rows = {row["arm"]: row for row in report["rows"]}
    raw = report["raw"]
    assert set(rows) == {"alone", "0 2 hosts shmpad", "0 2 hosts shmpad half"}

    def rate(records):  # the group's: its slowest member's
        return min(r["steps"] / r["seconds"] for r in records)

    alone, full, half = (raw[name][0] for name in ("alone", "0 2 hosts shmpad", "0 2 hosts shmpad half"))
    assert len(alone) == 1 and len(full) == len(half) == 2
    assert rows["0 2 hosts shmpad"]["vs_alone"] == [pytest.approx(rate(full) / rate(alone))]
    assert rows["0 2 hosts shmpad half"]["half_vs_full"] == [pytest.approx(rate(half) / rate(full))]
    assert rows["alone"]["vs_alone"] == [pytest.approx(1.0)]

    model_bytes = parameter_bytes(model_for(36))
    assert model_bytes == 4 * sum(p.numel() for p in model_for(36).parameters())
    assert all(r["model_bytes"] == model_bytes for r in alone + full + half)
    assert alone[0]["payload_bytes"] == 0 and alone[0]["sent"] < 64 << 10
    assert rows["0 2 hosts shmpad"]["payload_bytes"] == model_bytes
    assert rows["0 2 hosts shmpad half"]["payload_bytes"] == model_bytes // 8 * 4
    for records, payload in ((full, model_bytes), (half, model_bytes // 8 * 4)):
        for r in records:
            # a ring of 2 sends each member's whole payload once a step (half reduce-scatter,
            # half all-gather); the window may hold the step before's tail and miss its own
            assert (r["steps"] - 1) * payload <= r["sent"] <= (r["steps"] + 1) * payload * 1.2 + (64 << 10)
            assert len(r["reduce_s"]) == r["steps"]
    assert rows["0 2 hosts shmpad"]["reduce_ms"] == pytest.approx(
        1e3 * statistics.median([t for r in full for t in r["reduce_s"]])
    )
    assert len(report["machine"]["load_start"].split()) == len(report["machine"]["load_end"].split()) == 3
    assert report["machine"]["cpu"]
