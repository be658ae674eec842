"""One epoch's torch.distributed process group (``shmpad.net.torchgroup.TorchGroup``),
its members in threads of this process: it sums, ``close()`` wakes a caller blocked in
gloo at once, and a result that a member gave up is kept by nobody."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from helpers import kill_and_reap, start_session, track_pid, wait_until

from shmpad.errors import Abandoned
from shmpad.net.mesh import Mesh
from shmpad.net.torchgroup import TorchGroup

TOKEN = "torchgroup-test"


@pytest.fixture
def groups():
    """``make(n)``: n gloo groups of one epoch, rank order; all closed at the end."""
    meshes: list[Mesh] = []
    made: list[TorchGroup] = []

    def make(n: int) -> list[TorchGroup]:
        meshes.extend(Mesh(token=TOKEN) for _ in range(n))
        addresses = [m.address for m in meshes[-n:]]
        out: list = [None] * n

        def form(rank: int) -> None:
            ring = meshes[-n + rank].ring("b/1", addresses, rank, timeout=20)
            out[rank] = TorchGroup(ring, "gloo", "127.0.0.1", timeout=20)

        run_all([lambda r=r: form(r) for r in range(n)])
        made.extend(out)
        return out

    yield make
    for g in made:
        g.close()
    for m in meshes:
        m.close()


def run_all(bodies, timeout: float = 30) -> list:
    """Run each body in a thread; their results, or the first exception raised."""
    results: list = [None] * len(bodies)

    def run(i: int) -> None:
        try:
            results[i] = bodies[i]()
        except BaseException as e:  # handed to the test's thread
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a member did not finish"
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def test_the_members_sum_into_their_arrays(groups):
    members = groups(3)
    arrays = [np.full(100_003, r + 1, np.float32) for r in range(3)]
    run_all([lambda g=g, a=a: g.allreduce(a) for g, a in zip(members, arrays)])
    for a in arrays:
        assert np.all(a == 6)


def test_closing_wakes_a_blocked_caller_and_no_member_keeps_the_given_up_result(groups):
    a, b = groups(2)
    mine = np.ones(1000, np.float32)
    raised: list = []

    def blocked() -> None:
        try:
            a.allreduce(mine)  # b is not there yet: gloo waits for it
        except Abandoned as e:
            raised.append(e)

    thread = threading.Thread(target=blocked)
    thread.start()
    assert wait_until(lambda: a._work is not None, 60), "a never started its allreduce"
    a.close("the group changed")
    thread.join(5)
    assert not thread.is_alive(), "close() did not wake the caller blocked in gloo"
    assert raised and "the group changed" in str(raised[0])
    assert np.all(mine == 1), "the abandoned reduction wrote into the caller's array"
    theirs = np.full(1000, 2, np.float32)
    with pytest.raises(Abandoned):  # gloo completes it with a's data, but the commit on the ring fails
        b.allreduce(theirs)
    assert np.all(theirs == 2), "b kept a result that a gave up"


def test_tensors_and_the_groups_own_buffer_are_reduced_in_place(groups):
    """The path NCCL takes on a GPU, on the CPU: tensors on the group's device are summed in
    place, the group's own buffer without a copy in or out; anything else is refused by name."""
    import torch

    a, b = groups(2)
    tensors = [torch.full((1001,), 1.5), torch.full((1001,), 2.0)]
    run_all([lambda g=g, t=t: g.allreduce(t) for g, t in zip((a, b), tensors)])
    assert all(torch.all(t == 3.5) for t in tensors)
    own = [g.buffer(17) for g in (a, b)]
    assert own[0] is a.buffer(17)  # one buffer per size, reused
    for i, t in enumerate(own):
        t.fill_(i + 1)
    run_all([lambda g=g, t=t: g.allreduce(t) for g, t in zip((a, b), own)])
    assert all(torch.all(t == 3) for t in own)
    for bad, what in (
        (torch.zeros(4, dtype=torch.float64), "torch.float64"),
        (torch.zeros(2, 2), r"\(2, 2\)"),
        (torch.zeros(8)[::2], "Tensor"),
        ([0.0, 1.0], "list"),
    ):
        with pytest.raises(TypeError, match=r"reduces 1-D contiguous float32 tensors on that device.*got .*" + what):
            a.allreduce(bad)


def test_a_member_that_exits_with_an_abandoned_operation_in_flight_exits_cleanly():
    """A member leaves while its closed group's operation is still in flight (held by a
    reaper), and its peer goes away a moment later: the operation then fails on gloo's
    thread while the leaver's interpreter is exiting. The leaver exits 0, not SIGABRT
    (``terminate called after throwing an instance of 'gloo::IoException'``)."""
    script = os.path.join(os.path.dirname(__file__), "helpers", "torchgroup_member.py")
    members = []
    try:
        for rank in range(2):
            proc = start_session(
                [sys.executable, script, str(rank)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            track_pid(proc.pid)
            members.append(proc)
        leaver, peer = members
        addresses = [p.stdout.readline().strip() for p in members]
        assert all(addresses), f"a member did not start: {addresses}"
        for proc, other in ((leaver, addresses[1]), (peer, addresses[0])):
            proc.stdin.write(other + "\n")
            proc.stdin.flush()
        assert leaver.stdout.readline().strip() == "closed", leaver.stderr.read()
        peer.stdin.write("go\n")  # the leaver is exiting now: its in-flight operation is about to fail
        peer.stdin.flush()
        assert peer.wait(60) == 0, peer.stderr.read()
        code = leaver.wait(60)
        assert code == 0, f"the leaver exited {code}:\n{leaver.stderr.read()}"
    finally:
        for proc in members:
            kill_and_reap(proc)
