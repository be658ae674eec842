"""``assert_identical`` (tests/helpers/net_procs.py), the check the multi-process group tests
rest on, fed peers' printed events written by hand: it passes the group's guarantees (one
state per step, one lineage at the end, every lost version counted in ``discarded``) and
fails each way of breaking them, an uncounted fork first."""

from __future__ import annotations

import pytest
from helpers.net_procs import assert_identical

from shmpad.net.accumulator import _next_lineage


class Printed:
    """What one ``tests/helpers/net_peer.py`` would print, written by hand: ``step(epoch)``
    as if a reduction completed in that epoch's ring, ``load(other, discarded)`` as if a
    sync gave this peer ``other``'s state and counted ``discarded`` more lost steps."""

    def __init__(self, name: str):
        self.name = name
        self.steps: list[dict] = []
        self.trail: list[dict] = []
        self.stderr: list[str] = []
        self.version = self.lineage = self.discarded = 0

    def step(self, epoch: str, state: str | None = None) -> Printed:
        self.version += 1
        self.lineage = _next_lineage(self.lineage, epoch)
        event = {
            "event": "step",
            "version": self.version,
            "lineage": self.lineage,
            "discarded": self.discarded,
            "hash": state or f"{self.version}/{self.lineage}",  # one state per (version, lineage)
            "key": epoch,
            "size": 2,
        }
        self.steps.append(event)
        self.trail.append(event)
        return self

    def steps_in(self, *epochs: str) -> Printed:
        for epoch in epochs:
            self.step(epoch)
        return self

    def load(self, other: Printed, discarded: int = 0) -> Printed:
        self.version, self.lineage = other.version, other.lineage
        self.discarded += discarded
        held = {"event": "held", "version": self.version, "lineage": self.lineage, "discarded": self.discarded}
        self.trail.append(held)
        return self


def forked(discarded: int) -> list[Printed]:
    """a and b take versions 1-2 together; b, dropped, takes 3-4 alone in a ring of its own
    while a takes 3-5; b rejoins, loads a's state (losing its versions 3 and 4, counted as
    ``discarded``), and both take version 6."""
    a, b = Printed("a").steps_in("g/1", "g/1"), Printed("b").steps_in("g/1", "g/1")
    b.steps_in("g/2b", "g/2b")
    a.steps_in("g/2a", "g/2a", "g/2a")
    b.load(a, discarded)
    a.step("g/3")
    b.step("g/3")
    return [a, b]


def test_a_fork_counted_version_for_version_passes():
    assert assert_identical(forked(discarded=2)) == 3  # versions 1, 2 and 6 were taken by both


def test_an_uncounted_fork_fails():
    with pytest.raises(AssertionError, match="b counted 0 discarded steps at version 5 .*replaced 2 versions"):
        assert_identical(forked(discarded=0))


def test_a_fork_counted_as_one_step_fails():
    """A count per sync instead of per version forked is not enough."""
    with pytest.raises(AssertionError, match="b counted 1 discarded steps at version 5 .*replaced 2 versions"):
        assert_identical(forked(discarded=1))


def test_a_sync_that_lost_nothing_must_count_nothing():
    """A peer only behind the group, on its lineage, loses no step when it catches up."""
    a, b = Printed("a").steps_in("g/1", "g/1", "g/1"), Printed("b").steps_in("g/1")
    assert assert_identical([a, b.load(a, discarded=0)]) == 1
    a, b = Printed("a").steps_in("g/1", "g/1", "g/1"), Printed("b").steps_in("g/1")
    with pytest.raises(AssertionError, match="b counted 1 discarded steps at version 3 .*replaced 0 versions"):
        assert_identical([a, b.load(a, discarded=1)])


def test_a_leader_that_stepped_alone_makes_the_others_count_theirs():
    """The case a CI runner met: one learner alone in a ring of one from the start, the
    others in a ring of two, then all in one: the lone one is ahead and leads, and each of
    the two others loses every version it took."""
    lone = Printed("h0").steps_in("g/1", "g/1", "g/1", "g/1")
    pair = [Printed(n).steps_in("g/2", "g/2", "g/2") for n in ("h1", "h2")]
    for p in pair:
        p.load(lone, discarded=3)
    everyone = [lone, *pair]
    for p in everyone:
        p.step("g/3")
    assert assert_identical(everyone) == 4  # the pair's 3 versions, and version 5 taken by all
    pair[1].trail[-2]["discarded"] = pair[1].trail[-1]["discarded"] = 0  # h2 did not count its 3
    with pytest.raises(AssertionError, match="h2 counted 0 discarded steps at version 4"):
        assert_identical(everyone)


def test_a_step_nobody_discarded_fails_where_the_peers_end():
    """b's versions 3-4 were never replaced: the peers end on two lineages."""
    a, b = Printed("a").steps_in("g/1", "g/1", "g/2a", "g/2a"), Printed("b").steps_in("g/1", "g/1", "g/2b")
    with pytest.raises(AssertionError, match=r"do not end on one lineage: \{'b': \(3, "):
        assert_identical([a, b])
    assert assert_identical([a], others=[b]) == 2  # one that was killed need not end with the group


def test_two_states_for_one_step_fail():
    a, b = Printed("a").steps_in("g/1"), Printed("b").steps_in("g/1")
    b.steps[-1]["hash"] = "another state"
    with pytest.raises(AssertionError, match="version 1, lineage .*: peers disagree"):
        assert_identical([a, b])


def test_a_step_from_a_state_nobody_printed_fails():
    a = Printed("a").steps_in("g/1", "g/1")
    del a.steps[0], a.trail[0]
    with pytest.raises(AssertionError, match="a's step to version 2 .* follows no state any peer printed"):
        assert_identical([a])
