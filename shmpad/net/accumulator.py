"""Gradient averaging across hosts, with moolib's Accumulator semantics.

Every peer trains its own copy of the model on its own data. After each backward
pass it hands its gradients to ``reduce_gradients(batch_size)``; the peers of the
group sum them over TCP (``shmpad.net.allreduce``), or through the epoch's
torch.distributed process group (``shmpad.net.torchgroup``: ``backend="gloo"``,
``"nccl"``), together with how many samples and contributions they stand for. Once the summed batch size reaches the virtual
batch size, every member that completes the reduction holds the same averaged gradient
(sum / contributions, the same bits) and takes the same optimiser step, so members that
take the same steps and compute alike (the same torch build and device kind) hold the
same weights without the weights being sent again. What the group guarantees beyond
that is what the state sync gives: after every sync, every member holds the leader's
weights, version and lineage; a step some members took and the group did not keep is
discarded there and counted (below).

Membership comes from the broker (``shmpad.net.group``). When it changes, the ring
in flight is closed, so a reduction it carried is abandoned on every peer and its
gradients dropped (a process group of that epoch is closed the same way), and the
next call forms a ring of the new members, and their process group if any. A new ring
starts with a state sync: the peer with the highest model version (then the lowest
rank) broadcasts its parameters, buffers, optimiser and scheduler state and model
version, and everyone loads them. A joining peer thus receives the current model
before it contributes, and a peer whose last reduction was abandoned mid-way
(while others completed it) is brought level too.

A step can still be taken by some peers and not by others. A reduction ends on each
member when its last piece arrives; if the group changes at that moment, a member whose
last piece came keeps the step while the others abandon it (no protocol makes the last
message certain); and a peer alone in a ring steps alone. If such a peer is in the next
ring, its version is the highest and the sync gives everyone its step. If the broker
dropped it (it was silent past the timeout), the others may take that version again
without it. When they meet again, the sync keeps the leader's step (the higher version,
then the lower rank); the leader looks up every other member's version and lineage in
its history of the group's last ``HISTORY`` steps, and a member whose step is not there
is told so: it counts in ``discarded`` every version it holds on another lineage than the
group's history (the steps it loses, as far back as that history reaches), logs a
warning, then loads the group's state. ``lineage`` names the steps that led to a version
(each step mixes in its ring's epoch): peers at the same ``version`` and ``lineage`` took
the same steps, and hold the same weights where they compute alike (``check_every``).
Between a fork and the next sync the members do not hold the same weights.

What else steers a step rides along: ``reduce_gradients(batch_size, extra)`` averages a
few values with the gradients (an APPO minibatch's KL), and ``reduce_values`` sums a
member's statistics with the group's over the shmpad ring (a batch's input moments), so
that every member steers its steps by the group's. A reduction of either kind that the
group abandons is abandoned the same way.

Stale gradients are never averaged in. A peer that hung (SIGSTOP, a stuck call) and
was dropped wakes up holding gradients of weights the group has left behind. Whatever
reduction it tries on its old ring is abandoned: the others closed that ring, and
rings never share connections. Gradients it computed before the sync that brings it
level (a loop that calls ``backward()`` before ``ready()``, or one that was between
the two when it stopped) are refused: when a sync replaces this peer's weights, the
gradient tensors it holds are noted with their autograd version counters, and a
``reduce_gradients`` that still finds one of them untouched takes part in the
reduction without contributing (``skip_gradients``) and counts it in ``refused``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import struct
import threading
import time
from typing import Any

import numpy as np
import torch

from shmpad.errors import Abandoned
from shmpad.net.allreduce import PeerRing
from shmpad.net.envcluster import ENV_URL, from_env
from shmpad.net.group import GroupClient, Membership
from shmpad.net.mesh import Mesh
from shmpad.net.model_state import digest, dump_state, load_state
from shmpad.net.torchgroup import TorchGroup, check_backend, choose
from shmpad.net.wire import parse_address

__all__ = ["Accumulator"]

log = logging.getLogger("shmpad.net")

_COUNT = struct.Struct("<Q")
HISTORY = 1024
"""how many of its latest steps' lineages a peer remembers, to tell a member that took a
step the group did not keep from one that is only behind"""

RETRY_S = 5.0
"""how long a peer whose ring failed waits for a new member list before it rejoins
the broker to force one"""


class Accumulator:
    """Averages gradients of ``model`` across the peers of ``group`` at ``broker``
    (``"host:port"``, or ``"env://"``: a torchrun-style fixed cluster whose rank 0
    serves the broker, see ``shmpad.net.envcluster``).

    ``optimizer`` and ``scheduler`` (optional) are part of the state a joining peer
    receives. ``virtual_batch_size`` (0: every reduction) is the summed batch size a
    step needs. ``min_size``: the first ring waits for that many members (a group
    that later shrinks goes on). ``op_timeout``: how long one reduction may wait for
    the slowest member before it is abandoned. ``check_every`` (0: never): every that
    many steps the peers compare digests of their weights, and resync from the leader
    if they differ (steps are bit-identical only if every peer computes them the same
    way: the same torch build and device kind). The mesh listens on ``host:port`` for
    the other peers (loopback by default: give this host's address when the peers
    are on other hosts).

    ``backend`` picks what moves the gradients (``shmpad.net.torchgroup``): ``"shmpad"``
    the shmpad ring; ``"gloo"`` or ``"nccl"`` a torch.distributed process group formed
    for each member list, whose timeout is ``op_timeout``; ``"auto"`` NCCL when every
    peer's parameters are on CUDA, else the shmpad ring for groups of fewer than
    ``torchgroup.AUTO_GLOO_FROM`` peers and gloo for larger ones. Every peer of a group
    asks for the same backend, or ``"auto"``. The state sync and the digest checks
    always go over the shmpad ring.

    Use::

        acc = Accumulator(model, optimizer, broker="10.0.0.1:4431", group="pong")
        while training:
            if not acc.ready(timeout=1.0):   # forms the ring and syncs state after a change
                continue
            loss.backward()
            if acc.reduce_gradients(batch_size):   # .grad now holds the group's average
                optimizer.step()
            optimizer.zero_grad()
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        *,
        broker: str,
        group: str = "default",
        name: str | None = None,
        virtual_batch_size: int = 0,
        host: str = "127.0.0.1",
        port: int = 0,
        token: bytes | str | None = None,
        op_timeout: float = 60.0,
        min_size: int = 1,
        check_every: int = 100,
        backend: str = "shmpad",
    ):
        _check_count("check_every", check_every, 0)
        _check_count("min_size", min_size, 1)
        _check_count("virtual_batch_size", virtual_batch_size, 0)
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.virtual_batch_size = virtual_batch_size
        self.op_timeout = op_timeout
        self.min_size = min_size
        self.check_every = check_every
        self.diverged = 0
        """checks that found the peers' weights different (each was repaired by a resync)"""
        self._checked = 0  # the version whose weights were last compared (or synced)
        self._started = False  # a ring of at least min_size members has formed once
        if host in ("0.0.0.0", "::", ""):
            raise ValueError(
                f"host {host!r} is where the other peers connect to this one, so it must be an address they "
                f"can reach (this host's own), not a wildcard"
            )
        self._served = None  # the broker this process serves: rank 0 of an env:// cluster
        cluster = None
        if broker == ENV_URL:
            cluster = from_env()
            broker, name = cluster.broker, name or f"rank{cluster.rank}"
            min_size = self.min_size = max(min_size, cluster.world_size)
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.params = [p for p in model.parameters() if p.requires_grad]
        self._cuda = bool(self.params) and all(p.is_cuda for p in self.params)
        check_backend(backend, self._cuda)
        self.backend = backend
        """the data plane asked for (``plane`` says which one the current epoch uses)"""
        self._host = host
        sizes = [p.numel() for p in self.params]
        self._offsets = np.cumsum([0, *sizes])
        n = int(self._offsets[-1])
        self._flat = np.zeros(n + 2, dtype=np.float32)  # gradients, then any extra values, batch size and contributions
        # what the reductions of this virtual batch added up to, where the data plane reduces (NCCL: the GPU)
        self._sum = torch.zeros(n, dtype=torch.float32)
        self._sum_batch = 0.0
        self._sum_count = 0.0
        self.version = 0
        """optimiser steps the group has taken (the same on every peer once synced)"""
        self.lineage = 0
        """which steps led to ``version``: each step mixes in its ring's epoch. Two peers at the
        same ``version`` and ``lineage`` took the same steps; the same ``version`` with another
        ``lineage`` is a step that one peer took and the group did not (see the module docstring)"""
        self.discarded = 0
        """steps this peer held that the group did not keep: each sync that replaces them adds
        how many versions this peer held on another lineage than the group's (within the
        leader's last ``HISTORY`` steps)"""
        self._history: dict[int, int] = {0: 0}  # version -> lineage of the group's last HISTORY steps
        self.abandoned = 0
        """reductions abandoned because the group changed or a peer went away"""
        self.refused = 0
        """contributions refused as stale: gradients computed on weights that a state sync then replaced"""
        self._stale: list[tuple[torch.nn.Parameter, torch.Tensor, int]] | None = None  # see _note_stale
        self._lock = threading.Lock()
        self._latest: Membership | None = None
        self._ring: PeerRing | None = None  # the epoch's shmpad ring: state sync, digests, and gradients
        self._plane: PeerRing | TorchGroup | None = None  # what reduces the gradients: the ring or a process group
        self._failed: tuple[Any, float] | None = None  # (membership key, when) of the last ring that failed
        self._broker, self._group_name, self._token = broker, group, token
        self._closed = False
        self._forming: str | None = None  # key of the ring being formed
        self._mesh = Mesh(host, port, token)
        try:
            if cluster is not None and cluster.serves_broker:
                from shmpad.net.broker import HEARTBEAT_S, SETTLE_S, TIMEOUT_S, Broker

                self._served = Broker(
                    *parse_address(broker), token=token, heartbeat_s=HEARTBEAT_S, timeout_s=TIMEOUT_S, settle_s=SETTLE_S
                )
            self._group = GroupClient(broker, group, self.name, self._mesh.address, token)
        except BaseException:
            self._mesh.close()
            if self._served is not None:
                self._served.close()
            raise
        self._group.add_listener(self._on_membership)
        self._group.start()

    # -- membership ------------------------------------------------------------------

    def _on_membership(self, membership: Membership) -> None:
        with self._lock:
            self._latest = membership
            ring, plane = self._ring, self._plane
            forming = self._forming
        if ring is not None and ring.key != _key(membership):
            if plane is not None and plane is not ring:
                plane.close()  # the process group: its reduction in flight raises Abandoned here and on the others
            ring.close()  # a reduction in flight on the old ring raises Abandoned on every peer
        if forming is not None and forming != _key(membership):
            self._mesh.abandon(forming, f"epoch {membership.epoch} replaced it")  # its members will not all come

    @property
    def connected(self) -> bool:
        """Connected to the broker (the ring may still be forming)."""
        return self._group.connected

    @property
    def size(self) -> int:
        """Members of the current ring (0 before the first is formed)."""
        ring = self._ring
        return ring.size if ring is not None else 0

    @property
    def ring_key(self) -> str | None:
        """``broker_id/epoch`` of the current ring (None when there is none)."""
        ring = self._ring
        return ring.key if ring is not None else None

    @property
    def plane(self) -> str | None:
        """The data plane of the current epoch: ``"shmpad"``, ``"gloo"`` or ``"nccl"``
        (None when there is none)."""
        plane = self._plane
        return None if plane is None else plane.backend if isinstance(plane, TorchGroup) else "shmpad"

    def ready(self, timeout: float | None = None) -> bool:
        """True once this peer is in a ring of the group's latest members with the
        group's state; forms the ring and syncs the state after a change. False if
        that could not happen within ``timeout`` (None: wait for it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._closed:
            with self._lock:
                membership = self._latest
                ring = self._ring
            if membership is not None and ring is not None and ring.key == _key(membership):
                return True
            starting = membership is not None and not self._started and len(membership.members) < self.min_size
            if membership is not None and self.name in membership.names and not starting:
                if self._failed is None or self._failed[0] != membership.key:
                    if self._form(membership):
                        return True
                elif time.monotonic() - self._failed[1] >= RETRY_S:
                    self._rejoin(membership)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            wait = RETRY_S if remaining is None else min(remaining, RETRY_S)
            self._group.wait_membership(membership.key if membership else None, timeout=wait)
        return False

    def _form(self, membership: Membership) -> bool:
        with self._lock:
            old, self._ring = self._ring, None
            old_plane, self._plane = self._plane, None
            if self._latest is not membership or self._closed:
                return False
            self._forming = _key(membership)
        if old_plane is not None:
            old_plane.close()
        if old is not None:
            old.close()
        addresses = [m.address for m in membership.members]
        try:
            ring = self._mesh.ring(_key(membership), addresses, membership.rank(self.name), timeout=self.op_timeout)
        except (Abandoned, ValueError) as e:  # ValueError: a member announced an address that is none
            log.info("%s: could not form the ring of epoch %s: %s", self.name, membership.epoch, e)
            self._failed = (membership.key, time.monotonic())
            return False
        finally:
            with self._lock:
                self._forming = None
        with self._lock:
            self._ring = ring
            stale = self._latest is not membership or self._closed
        if stale:
            self._drop_ring()
            return False
        try:
            plane = self._form_plane(ring)
            with self._lock:
                self._plane = plane
                stale = self._latest is not membership or self._closed
            if stale:  # the listener closed the ring but could not see this plane yet
                raise Abandoned(f"epoch {membership.epoch} was replaced while its data plane formed")
            self._sync(ring)
        except Abandoned as e:
            log.info("%s: data plane or state sync of epoch %s abandoned: %s", self.name, membership.epoch, e)
            self._drop_ring()
            return False
        except BaseException:  # the members disagree on the backend (ValueError), or worse
            self._drop_ring()
            raise
        self._failed = None
        self._started = True
        self._clear_sum()
        log.info(
            "%s: in a group of %d (epoch %s, data plane %s), at version %d",
            self.name,
            ring.size,
            membership.epoch,
            self.plane,
            self.version,
        )
        return True

    def _form_plane(self, ring: PeerRing) -> PeerRing | TorchGroup:
        """The ring itself, or the epoch's torch.distributed process group, as the
        members agree (``shmpad.net.torchgroup.choose``)."""
        backend = choose(ring, self.backend, self._cuda, self.params[0].device if self._cuda else None)
        if backend == "shmpad":
            return ring
        device = self.params[0].device if backend == "nccl" else None
        return TorchGroup(ring, backend, self._host, self.op_timeout, device)

    def _drop_ring(self) -> None:
        """After a failure: the ring's epoch is not to be formed again. A newer member
        list is usually on its way (a peer died or joined); if none comes within
        ``RETRY_S``, ``ready()`` rejoins the broker to force one."""
        with self._lock:
            ring, self._ring = self._ring, None
            plane, self._plane = self._plane, None
        if plane is not None and plane is not ring:
            plane.close()
        if ring is None:
            return
        ring.close()
        with self._lock:
            latest = self._latest
        if latest is not None and _key(latest) == ring.key:
            self._failed = (latest.key, time.monotonic())

    def _rejoin(self, membership: Membership) -> None:
        """Leave and join again: every member then gets a new epoch, so the peers agree
        on the next ring to form without having to talk to each other."""
        log.info("%s: the ring of epoch %s failed and no new member list came; rejoining", self.name, membership.epoch)
        self._failed = (membership.key, time.monotonic())
        with self._lock:
            old = self._group
        old.close()
        with self._lock:  # close() from another thread meanwhile: no new member must appear
            if self._closed:
                return
            self._group = GroupClient(self._broker, self._group_name, self.name, self._mesh.address, self._token)
            self._group.add_listener(self._on_membership)
            self._group.start()

    # -- state ----------------------------------------------------------------------

    def _sync(self, ring: PeerRing) -> None:
        """Every member loads the state of the leader (the highest version, then the lowest
        rank) and takes its history. The leader also says, for each member, whether that
        member's step is one its history lacks (``discarded``)."""
        known = np.zeros(2 * ring.size, dtype=np.int64)  # each rank's version, then lineage
        known[ring.rank], known[ring.size + ring.rank] = self.version, self.lineage
        ring.allreduce(known)
        versions, lineages = known[: ring.size].tolist(), known[ring.size :].tolist()
        leader = max(range(ring.size), key=lambda r: (versions[r], -r))
        payload = None
        if ring.rank == leader:
            forked = bytes(self._forked(v, lineage) for v, lineage in zip(versions, lineages))
            history = np.array(list(self._history.items()), dtype="<i8")
            payload = forked + _COUNT.pack(len(history)) + history.tobytes() + self.state_bytes()
        data = ring.broadcast_bytes(payload, leader)
        if ring.rank != leader:
            (n,) = _COUNT.unpack_from(data, ring.size)
            start = ring.size + _COUNT.size
            pairs = np.frombuffer(data, dtype="<i8", count=2 * n, offset=start).reshape(n, 2).tolist()
            history = {version: lineage for version, lineage in pairs}
            if data[ring.rank]:
                # every version this peer holds on another lineage than the group's: the steps it loses
                lost = sum(1 for v, lineage in self._history.items() if history.get(v, lineage) != lineage)
                self.discarded += lost
                log.warning(
                    "%s: the group did not keep the %d step(s) up to version %d that this peer holds (it went on "
                    "from other steps, in a ring without this peer); taking the group's version %d",
                    self.name,
                    lost,
                    self.version,
                    versions[leader],
                )
            held = [(p, p.grad, p.grad._version) for p in self.params if p.grad is not None]
            before = self._digest() if held else None
            self.load_state_bytes(data[start + 16 * n :])
            self.lineage = lineages[leader]
            self._history = history
            if held and self._digest() != before:
                self._stale = held  # gradients of the weights just replaced: refused if reduced as they are
        self._checked = self.version

    def _forked(self, version: int, lineage: int) -> bool:
        """Whether a member at ``version`` with ``lineage`` took a step this peer's history
        lacks (False where the history does not reach back that far)."""
        known = self._history.get(version)
        return version > 0 and known is not None and known != lineage

    def _check(self, ring: PeerRing) -> None:
        """Compare the peers' weights (one 8-byte digest each); resync if they differ.
        Every peer checks at the same reduction: the first of each ``check_every``-th
        version, which all of them reach together."""
        digests = np.zeros(ring.size, dtype=np.int64)
        digests[ring.rank] = self._digest()
        ring.allreduce(digests)
        self._checked = self.version
        if len(set(digests.tolist())) > 1:
            self.diverged += 1
            log.warning(
                "%s: the group's weights differ at version %d (digests by rank: %s); resyncing from the leader",
                self.name,
                self.version,
                [f"{d & 0xFFFFFFFFFFFFFFFF:016x}" for d in digests.tolist()],
            )
            self._sync(ring)

    def _digest(self) -> int:
        return digest(self.model)

    def state_bytes(self) -> bytes:
        """The model (parameters and buffers), optimiser and scheduler state and version."""
        return dump_state(self.version, self.model, self.optimizer, self.scheduler)

    def load_state_bytes(self, data: bytes) -> None:
        """Load what ``state_bytes`` gave (a checkpoint, say): the version comes with it;
        ``lineage`` stays as it was, and the history of steps starts here."""
        self.version = load_state(data, self.model, self.optimizer, self.scheduler)
        self._history = {self.version: self.lineage}  # what led to the loaded state is not known here

    # -- gradients ------------------------------------------------------------------

    def reduce_gradients(self, batch_size: int, extra: torch.Tensor | None = None) -> bool:
        """Sum this peer's gradients (of ``batch_size`` samples) with the group's.
        Gradients that a state sync made stale are refused (see ``refused``): the
        peer then takes part without contributing.

        True when the virtual batch is complete: every parameter's ``.grad`` then
        holds the group's average (the same bits on every member that completed this
        reduction), and the caller takes
        its optimiser step. False when more is needed, or when the reduction was
        abandoned (the group changed: the gradients are dropped, ``ready()`` forms
        the next ring).

        ``extra``: a few float32 values that steer the step (an APPO minibatch's KL), reduced in
        the same operation: once the reduction completes, ``extra`` holds, in place, their mean
        over the members that contributed to this reduction (zeros where none did), the same
        bits on every member; abandoned, it is left as it was. Every member passes as many
        values to the same reduction."""
        _check_count("batch_size", batch_size, 0)
        values = _extra_values(extra)
        flat = self._staging(len(values))
        if self._refuse_stale():
            return self.skip_gradients(extra)
        for p, a, b in zip(self.params, self._offsets[:-1], self._offsets[1:]):
            if p.grad is None:
                flat[a:b].zero_()
            else:
                flat[a:b].copy_(p.grad.detach().reshape(-1))
        n = int(self._offsets[-1])
        flat[n:-2].copy_(values)
        flat[-2] = batch_size
        flat[-1] = 1.0 if batch_size > 0 else 0.0
        return self._reduce(flat, extra)

    def _refuse_stale(self) -> bool:
        """True (and counted in ``refused``) if a gradient this peer holds is one that a
        state sync made stale and nothing has written since."""
        held, self._stale = self._stale, None
        # the autograd version counter moves with every in-place write (backward accumulating,
        # zero_grad without set_to_none, copy_); a new tensor (set_to_none, assigning .grad) is another object
        if held is None or not any(p.grad is g and g._version == v for p, g, v in held):
            return False
        self.refused += 1
        log.info(
            "%s: refused gradients computed before a sync replaced the weights (version %d)", self.name, self.version
        )
        return True

    def skip_gradients(self, extra: torch.Tensor | None = None) -> bool:
        """Take part in the group's reduction without contributing (zero gradients and
        ``extra`` values, not counted in the average; ``extra`` then receives the
        contributors' mean). Returns what ``reduce_gradients`` would."""
        flat = self._staging(len(_extra_values(extra)))
        flat.zero_()
        return self._reduce(flat, extra)

    def reduce_values(self, values: np.ndarray) -> bool:
        """Replace ``values`` (a 1-D numpy array of float32, float64, int32 or int64) by their
        sum over the members of the group, in place: statistics that steer the steps (a batch's
        input moments, say), which every member must hold alike. They go over the shmpad ring
        whatever the data plane (float64 there too), the same bits on every member. Every
        member reduces the same number of values at the same point of its sequence of
        reductions. True once summed; False where the reduction was abandoned because the group
        changed (as for ``reduce_gradients``: counted in ``abandoned``, ``ready()`` forms the
        next ring) or the accumulator is closed."""
        if not isinstance(values, np.ndarray):
            raise TypeError(f"values must be a numpy array, got {type(values).__name__}")
        with self._lock:
            ring = self._ring
        if ring is None and self._closed:
            return False
        if ring is None:
            raise RuntimeError("reduce_values() before the group is ready: call ready() first")
        try:
            ring.allreduce(values)
        except Abandoned as e:
            self._abandon(e)
            return False
        return True

    def _staging(self, extra: int = 0) -> torch.Tensor:
        """Where to gather the gradients (then ``extra`` values, the batch size and the
        contribution): the process group's own buffer on its device (which saves two copies,
        and for NCCL keeps them on the GPU), else ours on the host. Should the plane change
        before ``_reduce``, that reduction copies from it or is abandoned; either way nothing
        is torn."""
        size = int(self._offsets[-1]) + extra + 2
        plane = self._plane
        if isinstance(plane, TorchGroup):
            return plane.buffer(size)
        if len(self._flat) != size:
            self._flat = np.zeros(size, dtype=np.float32)
        return torch.from_numpy(self._flat)

    def _reduce(self, flat: torch.Tensor, extra: torch.Tensor | None = None) -> bool:
        with self._lock:
            ring, plane = self._ring, self._plane
        if ring is None and self._closed:
            return False
        if ring is None or plane is None:
            raise RuntimeError("reduce_gradients() before the group is ready: call ready() first")
        try:
            if self.check_every and self.version % self.check_every == 0 and self.version != self._checked:
                self._check(ring)
            plane.allreduce(flat if isinstance(plane, TorchGroup) else flat.numpy())
        except Abandoned as e:
            self._abandon(e)
            return False
        n = len(self._sum)
        if self._sum.device != flat.device:
            self._sum = torch.zeros(n, dtype=torch.float32, device=flat.device)  # a new plane: the sum was cleared
        self._sum += flat[:n]
        batch, count = flat[-2:].tolist()  # from a GPU: one small copy, after the reduction it waits for anyway
        if extra is not None:
            extra.copy_((flat[n:-2] / max(count, 1.0)).reshape(extra.shape))
        self._sum_batch += batch
        self._sum_count += count
        if self._sum_count == 0 or self._sum_batch < self.virtual_batch_size:
            return False
        mean = self._sum / self._sum_count  # float32, the same bits on every peer
        for p, a, b in zip(self.params, self._offsets[:-1], self._offsets[1:]):
            g = mean[a:b].view_as(p).to(p.device, p.dtype)
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)
        self._advance(ring.key)
        self._clear_sum()
        return True

    def _abandon(self, error: Abandoned) -> None:
        """After a reduction the group abandoned: the ring goes, and with it this virtual
        batch's sum and this peer's gradients."""
        self.abandoned += 1
        log.info("%s: reduction abandoned: %s", self.name, error)
        self._drop_ring()
        self._clear_sum()
        for p in self.params:
            p.grad = None

    def _advance(self, ring_key: str) -> None:
        """Count a step taken in the epoch of ``ring_key``: the version, its lineage, the history."""
        self.version += 1
        self.lineage = _next_lineage(self.lineage, ring_key)
        self._history[self.version] = self.lineage
        if len(self._history) > HISTORY:
            del self._history[next(iter(self._history))]

    def _clear_sum(self) -> None:
        self._sum.zero_()
        self._sum_batch = 0.0
        self._sum_count = 0.0

    def close(self) -> None:
        """Leave the group and close every connection. Safe from any thread: a
        reduction in flight is abandoned and ``ready()`` returns False from then on."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            ring, self._ring = self._ring, None
            plane, self._plane = self._plane, None
            group = self._group
        if plane is not None and plane is not ring:
            plane.close()
        if ring is not None:
            ring.close()
        self._mesh.close()  # also abandons a ring still forming
        group.close()
        if self._served is not None:
            self._served.close()

    def __enter__(self) -> Accumulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _next_lineage(lineage: int, ring_key: str) -> int:
    """The lineage after a step taken in the epoch of ``ring_key`` (a signed 64-bit int,
    so that it travels in an int64 allreduce)."""
    digest = hashlib.blake2b(lineage.to_bytes(8, "little", signed=True) + ring_key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def _extra_values(extra: torch.Tensor | None) -> torch.Tensor:
    """``reduce_gradients``' extra values as one flat float tensor (none: empty)."""
    if extra is None:
        return torch.zeros(0)
    if not isinstance(extra, torch.Tensor) or not extra.is_floating_point():
        what = f"a {extra.dtype} tensor" if isinstance(extra, torch.Tensor) else type(extra).__name__
        raise TypeError(f"extra must be a floating-point tensor, got {what}")
    return extra.detach().reshape(-1)


def _key(membership: Membership) -> str:
    broker_id, epoch = membership.key
    return f"{broker_id}/{epoch}"


def _check_count(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
