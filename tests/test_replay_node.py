"""lp.ReplayNode: tables made at launch, reached from other nodes through a ReplayClient
under every launch type; checkpoints on demand, periodic and at stop, loaded by the next
program; bad tables and calls refused by name."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

import shmpad as lp
from shmpad import replay as rp

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("shm_leak_check")]

ALL_TYPES = ["local_mt", "local_mp", "test_mt", "test_mp"]
SPEC = {"obs": (np.float32, (2,)), "id": (np.int64, ())}


def tables():
    return [
        rp.Table("uniform", SPEC, 100, rp.Uniform(), rp.Fifo(), rp.MinSize(1)),
        rp.Table("prioritized", SPEC, 100, rp.Prioritized(1.0), rp.Fifo(), rp.MinSize(1)),
    ]


def item(i):
    return {"obs": np.full(2, i, np.float32), "id": i}


def inserter(replay, first):
    for i in range(first, first + 10):
        keys = replay.insert(item(i), priority={"uniform": 1.0, "prioritized": 1.0 + i})
        assert set(keys) == {"uniform", "prioritized"}


def learner(replay, out):
    batch = replay.sample("prioritized", 64, timeout=60)
    replay.update_priorities("prioritized", batch.keys, np.zeros(64))
    info = replay.info()
    Path(out).write_text(
        json.dumps(
            {
                "whole": bool(np.all(batch.data["obs"][:, 0] == batch.data["id"])),
                "sizes": {n: i.size for n, i in info.items()},
                "zeroed": sorted(set(batch.data["id"].tolist())),
                "after": sorted(set(replay.sample("prioritized", 200, timeout=60).data["id"].tolist())),
            }
        )
    )
    lp.stop()


@pytest.fixture
def run():
    managers = []

    def start(program, launch_type):
        manager = lp.launch(program, launch_type=launch_type)
        managers.append(manager)
        return manager

    yield start
    for manager in managers:
        manager.stop_and_wait()


@pytest.mark.parametrize("launch_type", ALL_TYPES)
def test_nodes_insert_sample_and_update_priorities_through_the_node(launch_type, run, tmp_path):
    program = lp.Program("replay")
    replay = program.add_node(lp.ReplayNode(tables), "replay")
    with program.group("inserters"):
        inserters = [program.add_node(lp.PyNode(inserter, replay, 100 * k)) for k in range(2)]
    program.add_node(lp.PyNode(learner, replay, str(tmp_path / "out")), "learner")
    manager = run(program, launch_type)
    manager.wait()
    got = json.loads((tmp_path / "out").read_text())
    assert got["whole"]
    assert len(inserters) == 2
    # the learner sampled after at least one insert; the others may have come later
    assert 1 <= got["sizes"]["prioritized"] <= 20 and 1 <= got["sizes"]["uniform"] <= 20
    assert not set(got["after"]) & set(got["zeroed"]) or len(got["zeroed"]) == got["sizes"]["prioritized"]


def fill_and_checkpoint(replay, out):
    for i in range(5):
        replay.insert(item(i), priority=2.0, table="uniform")
    Path(out).write_text(replay.checkpoint())
    lp.stop()


def report_sizes(replay, out):
    info = replay.info()
    Path(out).write_text(json.dumps({n: [i.size, i.inserts] for n, i in info.items()}))
    lp.stop()


@pytest.mark.parametrize("launch_type", ["local_mt", "local_mp"])
def test_a_checkpoint_is_loaded_by_the_next_program(launch_type, run, tmp_path):
    ckpt = tmp_path / "ckpt"
    program = lp.Program("first")
    replay = program.add_node(lp.ReplayNode(tables, checkpoint_dir=ckpt), "replay")
    program.add_node(lp.PyNode(fill_and_checkpoint, replay, str(tmp_path / "dir")), "filler")
    run(program, launch_type).wait()
    assert (tmp_path / "dir").read_text() == str(ckpt)
    program = lp.Program("second")
    replay = program.add_node(lp.ReplayNode(tables, checkpoint_dir=ckpt), "replay")
    program.add_node(lp.PyNode(report_sizes, replay, str(tmp_path / "sizes")), "reporter")
    run(program, launch_type).wait()
    assert json.loads((tmp_path / "sizes").read_text()) == {"uniform": [5, 5], "prioritized": [0, 0]}


def fill(replay):
    for i in range(7):
        replay.insert(item(i), table="prioritized")
    lp.stop()


@pytest.mark.parametrize("launch_type", ["local_mt", "local_mp"])
def test_a_periodically_checkpointing_node_checkpoints_when_the_program_stops(launch_type, run, tmp_path):
    program = lp.Program("periodic")
    replay = program.add_node(lp.ReplayNode(tables, checkpoint_dir=tmp_path, checkpoint_minutes=60), "replay")
    program.add_node(lp.PyNode(fill, replay), "filler")
    run(program, launch_type).wait()
    with np.load(tmp_path / "prioritized.npz") as z:
        assert z["field:id"].tolist() == list(range(7))


def seeded_table():
    return [rp.Table("t", SPEC, 100, rp.Uniform(), rp.Fifo(), rp.MinSize(1), seed=7)]


def fill_then_release(replay, drawers):
    for i in range(10):
        replay.insert(item(i))
    for d in drawers:
        d.go()


class Drawer:
    """Draws 50 samples once the filler has inserted all it inserts."""

    def __init__(self, replay, out):
        self._replay, self._out = replay, out
        self._go = threading.Event()

    def go(self):
        self._go.set()

    def run(self):
        assert self._go.wait(60)
        Path(self._out).write_text(json.dumps(self._replay.sample("t", 50, timeout=60).data["id"].tolist()))


def draws(run, launch_type, tmp_path, names):
    program = lp.Program("seeded")
    replay = program.add_node(lp.ReplayNode(seeded_table), "replay")
    drawers = [program.add_node(lp.CourierNode(Drawer, replay, str(tmp_path / name)), name) for name in names]
    program.add_node(lp.PyNode(fill_then_release, replay, drawers), "filler")
    run(program, launch_type).wait()
    return {name: json.loads((tmp_path / name).read_text()) for name in names}


@pytest.mark.parametrize("launch_type", ["local_mt", "local_mp"])
def test_a_seeded_tables_clients_draw_a_stream_per_node_the_same_every_run(launch_type, run, tmp_path):
    first = draws(run, launch_type, tmp_path, ["learner", "evaluator"])
    assert first["learner"] != first["evaluator"]  # two nodes, two streams (one process or two)
    assert draws(run, launch_type, tmp_path, ["learner", "evaluator"]) == first  # and the same next run


def test_bad_nodes_and_calls_are_refused(run):
    with pytest.raises(ValueError, match="checkpoint_minutes needs a checkpoint_dir"):
        lp.ReplayNode(tables, checkpoint_minutes=1)
    with pytest.raises(TypeError, match="tables_fn must be a callable"):
        lp.ReplayNode([])
    program = lp.Program("bad")
    program.add_node(lp.ReplayNode(lambda: ["not a table"]), "replay")
    with pytest.raises(
        TypeError, match=r"tables_fn must return a non-empty list of shmpad.replay.Table, got list of \['str'\]"
    ):
        lp.launch(program, launch_type="local_mt")
    program = lp.Program("twice")
    program.add_node(lp.ReplayNode(lambda: tables() + [rp.Table("uniform", SPEC, 4)]), "replay")
    with pytest.raises(ValueError, match="need distinct names, got \\['uniform', 'prioritized', 'uniform'\\]"):
        lp.launch(program, launch_type="local_mt")


def test_a_client_names_unknown_tables_and_wants_one(run):
    node = lp.ReplayNode(tables)
    program = lp.Program("client")
    handle = program.add_node(node, "replay")
    program.add_node(lp.PyNode(lp.wait_for_stop), "keeps-it-running")
    manager = run(program, "local_mt")
    client = handle.dereference()
    try:
        with pytest.raises(
            ValueError, match=r"unknown replay table 'nope': the tables are \['prioritized', 'uniform'\]"
        ):
            client.sample("nope", 1)
        with pytest.raises(ValueError, match="name one \\(table=...\\)"):
            client.insert(item(0))
        with pytest.raises(ValueError, match="no checkpoint_dir"):
            client.checkpoint()
        assert client.insert(item(0), table="uniform")["uniform"] >= 0
    finally:
        client.close()
        manager.stop_and_wait()
