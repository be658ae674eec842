"""The accumulator's data plane over torch.distributed: one process group per group epoch.

The broker still decides who is in the group. For each new member list the peers
first form the epoch's shmpad ring (``Mesh.ring``: authenticated by the group token);
``choose()`` then agrees on the data plane over it, and ``TorchGroup(ring, ...)``
makes that epoch's ``torch.distributed`` process group::

    rank 0 (the leader)                           every other member
    TCPStore on a socket bound to the mesh host
    ticket {host, port, prefix} ---- ring.broadcast_bytes (authenticated) ----> ticket
    ProcessGroupGloo/NCCL(PrefixStore(prefix, store), rank, size, timeout)   (the same, as a client)
    ring.allreduce (a barrier): every member is connected; from here the store is idle

Forming the group waits for the members' keys in the store for up to the group's
timeout, and c10d looks up the name of every address it connects to: where the DNS
server cannot be reached, each lookup waits out the resolver's timeout (glibc's
``RES_OPTIONS="timeout:1 attempts:1"`` shortens it).

No global state: the group is a ``ProcessGroupGloo``/``ProcessGroupNCCL`` object of
its own, never ``init_process_group``, so a process may hold several accumulators and
a group change never restarts a process. A change closes the epoch's group
(``close()``) and the next ``ready()`` forms the next one.

Security. ``TCPStore`` authenticates nothing. It listens only on the address the mesh
already uses (not every interface), only while the epoch's group lives, and every key
this group writes sits under a prefix of 128 random bits that only the ring's members
learn, over their authenticated connections. What remains: anyone who can reach that
address can connect to the store, list its keys (``list_keys`` reveals the prefix)
and, in the moment the group forms, overwrite a member's gloo address (the group then
fails to form, or worse, talks to the intruder); anyone can keep the store busy. Gloo's
own connections are not authenticated at all (the shmpad ring's are, at their
handshake; its byte frames then carry no tag either), and nothing is encrypted. So
the gloo and NCCL planes trust the network more than the shmpad ring does: run them
where only the group's hosts reach the peers' addresses.

Why a dead or departed member never hangs the others. Gloo's ``abort()`` and
``shutdown()`` do not wake a blocked operation, and a group with an operation in
flight cannot be destroyed before that operation ends. So the caller never blocks in
gloo: it polls the operation (``is_completed``, at most ``POLL_MAX_S`` apart) while
waiting on an event that ``close()`` sets; the group's timeout bounds a member that
stays silent. A member that dies closes its sockets, and so does a member that destroys
its idle group: the others' operations then fail at once. A group closed with its
operation still in flight is handed to a reaper thread that polls it the same way and
drops the group when the operation ended (by its timeout at the latest), which closes
its sockets in turn.

Why no Python runs on gloo's threads. A done-callback on the operation's future, or a
thread blocked in ``Work.wait()``, needs the interpreter when the operation ends; if the
process is exiting by then (a member that leaves while an abandoned operation is still in
flight, whose peer goes away a moment later), that thread is torn down mid-exception and
the process aborts (``terminate called after throwing an instance of 'gloo::IoException'``;
``tests/test_net_torchgroup.py`` keeps the scenario). Polling from Python leaves gloo's
threads to themselves; and once the process exits, only its main thread calls into torch
from here (``_no_more_calls``): a reaper still holding a group leaves it to the exit.

Why a peer never keeps a result another member did not get. A member that gave up an
operation locally (its group changed) cannot take back what its gloo threads send, so
the others might still complete it. Each allreduce is therefore followed by a
one-element allreduce on the epoch's shmpad ring, to which a member contributes only once
its gloo operation ended and which it closes as soon as it gives up: a result counts only
once every member holds it. It costs one small ring round per reduction. The commit's own
last message can still reach one member and not another as the group changes, so one
member may keep a step the others abandon: the accumulator's module docstring says how the
group then stays on one history (``Accumulator.lineage``, ``discarded``).
"""

from __future__ import annotations

import atexit
import datetime
import hashlib
import json
import logging
import secrets
import socket
import threading
import time

import numpy as np
import torch
import torch.distributed as dist

from shmpad.errors import Abandoned
from shmpad.net.allreduce import PeerRing

__all__ = ["AUTO_GLOO_FROM", "BACKENDS", "TorchGroup", "ask", "check_backend", "choose", "decide", "gpu_key"]


BACKENDS = ("shmpad", "gloo", "nccl", "auto")
AUTO_GLOO_FROM = 4
"""``backend="auto"`` on CPU: the shmpad ring for groups smaller than this, gloo from
this size on: the ring ran ahead of gloo in small groups, and gloo catches up as the group grows.
``python -m bench.allreduce --json`` measures both at 2, 3 and 4 peers; no kept figure yet,
see docs/benchmarks.md"""
log = logging.getLogger("shmpad.net")

GRACE_S = 5.0  # past the group's own timeout, how long a wait lasts before the caller gives up


def check_backend(backend: str, cuda: bool) -> None:
    """``ValueError`` naming ``backend`` if it is not one of ``BACKENDS`` or cannot run here."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if backend in ("gloo", "nccl") and not dist.is_available():
        raise ValueError(f"backend {backend!r} needs torch.distributed, which this torch build lacks")
    if backend == "gloo" and not dist.is_gloo_available():
        raise ValueError("backend 'gloo': this torch build has no gloo")
    if backend == "nccl" and not (cuda and dist.is_nccl_available()):
        raise ValueError(
            "backend 'nccl' needs CUDA parameters and a torch build with NCCL "
            f"(parameters on CUDA: {cuda}, NCCL available: {dist.is_nccl_available()})"
        )


def choose(ring: PeerRing, backend: str, cuda: bool, device: torch.device | None = None) -> str:
    """The data plane of ``ring``'s epoch, the same on every member (``decide`` on every
    member's ``ask`` and ``gpu_key``, gathered by one allreduce over the ring)."""
    asks = np.zeros(2 * ring.size, np.int64)
    nccl = cuda and dist.is_nccl_available()
    asks[ring.rank] = ask(backend, nccl)
    asks[ring.size + ring.rank] = gpu_key(device) if nccl and device is not None else 0
    ring.allreduce(asks)
    return decide(asks[: ring.size].tolist(), ring.key, asks[ring.size :].tolist())


def gpu_key(device: torch.device) -> int:
    """A positive 63-bit number naming the GPU ``device`` is, the same in every process
    that uses it (from its UUID): NCCL refuses a group with two members on one GPU."""
    props = torch.cuda.get_device_properties(device)
    name = getattr(props, "uuid", None)
    if name is None:  # an older torch: the bus address, unique on one host
        name = (socket.gethostname(), getattr(props, "pci_domain_id", 0), getattr(props, "pci_bus_id", device.index))
    digest = hashlib.blake2b(str(name).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1 or 1


def ask(backend: str, nccl: bool) -> int:
    """A member's ask as one number: the backend it asked for, and whether it could run
    NCCL (its parameters are on CUDA and its torch has NCCL)."""
    return 1 + BACKENDS.index(backend) * 2 + bool(nccl)


def decide(asks: list[int], key: str, gpus: list[int] | None = None) -> str:
    """The backend the members asked for (``"auto"`` defers to the others), or when all
    asked for ``"auto"``: NCCL if every member can run it, else the shmpad ring below
    ``AUTO_GLOO_FROM`` members and gloo from there on. A member cannot run NCCL if its
    parameters are not on CUDA, its torch has no NCCL, or another member's are on the
    same GPU (``gpus``: each member's ``gpu_key``, 0 for none). ``ValueError`` if two
    members asked for different backends, or one for NCCL that another cannot run
    (every member raises it)."""
    asked = [BACKENDS[(a - 1) // 2] for a in asks]
    wanted = set(asked) - {"auto"}
    if len(wanted) > 1:
        said = ", ".join(f"rank {r}: {b!r}" for r, b in enumerate(asked))
        raise ValueError(f"the members of ring {key!r} asked for different backends ({said}); give all the same")
    unable = [r for r, a in enumerate(asks) if not (a - 1) % 2]
    shared = _sharing(gpus or [])
    if wanted == {"nccl"} and unable:
        raise ValueError(
            f"a member of ring {key!r} asked for 'nccl', but rank {unable[0]} cannot run it "
            f"(its parameters are not on CUDA, or its torch has no NCCL)"
        )
    if wanted == {"nccl"} and shared:
        raise ValueError(
            f"a member of ring {key!r} asked for 'nccl', but ranks {shared[0]} and {shared[1]} train on the same GPU, "
            f"which NCCL refuses: give each learner its own GPU (CUDA_VISIBLE_DEVICES), or use backend 'gloo'"
        )
    if wanted:
        return wanted.pop()
    if not unable and not shared:
        return "nccl"
    return "gloo" if len(asks) >= AUTO_GLOO_FROM else "shmpad"


def _sharing(gpus: list[int]) -> tuple[int, int] | None:
    """The first two ranks on the same GPU, if any."""
    seen: dict[int, int] = {}
    for rank, key in enumerate(gpus):
        if key:
            if key in seen:
                return seen[key], rank
            seen[key] = rank
    return None


class TorchGroup:
    """Epoch ``ring.key``'s torch.distributed process group (``backend`` gloo or nccl),
    formed over ``ring`` (see the module docstring); ``host``: this peer's mesh host,
    where the leader's store listens; ``timeout``: the process group's, which bounds
    forming it and every operation. ``device``: where NCCL reduces (CUDA)."""

    def __init__(self, ring: PeerRing, backend: str, host: str, timeout: float, device: torch.device | None = None):
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"a TorchGroup runs 'gloo' or 'nccl', got {backend!r}")
        self.ring = ring
        self.key, self.rank, self.size = ring.key, ring.rank, ring.size
        self.backend = backend
        self.timeout = timeout
        self._device = torch.device("cpu") if device is None else device
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._wake: threading.Event | None = None  # the operation in flight's; close() sets it too
        self._work = None  # the operation in flight (a torch Work), while the caller waits for it
        self._buffers: dict[int, torch.Tensor] = {}
        self._pg = None
        self._store = self._rendezvous(host)  # the leader's store lives as long as the group
        if self._reason is not None:  # closed (the epoch changed) while it formed
            self._retire()
            raise self._abandoned()

    def __repr__(self) -> str:
        state = f", abandoned: {self._reason}" if self._reason else ""
        return f"TorchGroup({self.key!r}, {self.backend}, rank={self.rank}, size={self.size}{state})"

    @property
    def closed(self) -> bool:
        return self._reason is not None

    def _rendezvous(self, host: str):
        timeout = datetime.timedelta(seconds=self.timeout)
        ring = self.ring
        listening = None
        ticket = None
        if ring.rank == 0:
            # TCPStore binds every interface unless handed a socket: bind the mesh's address only
            listening = socket.create_server((host, 0), family=_family(host), backlog=128)
            port = listening.getsockname()[1]
            ticket = json.dumps({"host": host, "port": port, "prefix": secrets.token_hex(16)}).encode()
        try:
            info = json.loads(ring.broadcast_bytes(ticket, 0))
            store = dist.TCPStore(
                info["host"],
                info["port"],
                self.size,
                is_master=ring.rank == 0,
                # how long a member's keys may keep the others waiting; not less: c10d's client
                # looks up names, and where DNS cannot be reached that alone took 10 s (netns test)
                timeout=timeout,
                wait_for_workers=False,
                master_listen_fd=listening.fileno() if listening is not None else None,
            )
        except BaseException as e:
            if listening is not None:
                listening.close()
            if isinstance(e, RuntimeError):  # the leader's store went away (DistStoreError is one)
                raise Abandoned(f"the store of ring {self.key!r} could not be reached: {_first_line(e)}") from None
            raise
        if listening is not None:
            listening.detach()  # the store owns (and closes) the descriptor now
        prefixed = dist.PrefixStore(f"shmpad/{self.key}/{info['prefix']}/", store)
        try:
            if self.backend == "gloo":
                options = dist.ProcessGroupGloo._Options()
                options._timeout = timeout
                options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
                pg = dist.ProcessGroupGloo(prefixed, self.rank, self.size, options)
            else:
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = timeout
                pg = dist.ProcessGroupNCCL(prefixed, self.rank, self.size, options)
        except RuntimeError as e:
            raise Abandoned(f"the {self.backend} group of ring {self.key!r} did not form: {_first_line(e)}") from None
        with self._lock:
            self._pg = pg
        ring.allreduce(np.zeros(1, np.int64))  # every member is connected
        return store

    # -------------------------------------------------------------- operations

    def allreduce(self, data: np.ndarray | torch.Tensor) -> None:
        """Replace ``data`` (1-D float32, the same size on every member) by the sum over
        the group, in place: a numpy array (a group on the CPU) or a tensor on the
        group's device, which for NCCL keeps the gradients on the GPU. The reduction
        runs in the group's own buffer and is copied back once every member committed
        it, unless ``data`` is that buffer (``buffer(n)``). ``Abandoned`` when the
        group was closed, a member went away or stayed silent past the timeout, or the
        commit on the ring failed."""
        tensor = self._as_tensor(data)
        staged = self.buffer(tensor.numel())
        own = tensor.data_ptr() == staged.data_ptr()
        if not own:
            staged.copy_(tensor)
        wake = threading.Event()
        with self._lock:
            if self._reason is not None:
                raise self._abandoned()
            work = self._pg.allreduce([staged])
            self._work, self._wake = work, wake
        if not _wait_for(work, self.timeout + GRACE_S, wake):
            self.close(f"the {self.backend} allreduce took over {self.timeout + GRACE_S} s")
        with self._lock:
            if self._reason is not None:
                raise self._abandoned()  # the work stays with the group for _retire()
            self._work = self._wake = None
        try:
            work.wait()  # on a GPU: later work on this stream waits for the reduction
        except RuntimeError as e:  # a member died: gloo saw its connection close
            self.close(f"the {self.backend} allreduce failed: {_first_line(e)}")
            raise self._abandoned() from None
        self.ring.allreduce(np.zeros(1, np.int64))  # the commit (module docstring)
        if not own:
            tensor.copy_(staged)

    def _as_tensor(self, data: np.ndarray | torch.Tensor) -> torch.Tensor:
        if isinstance(data, np.ndarray) and self._device.type == "cpu":
            data = torch.from_numpy(data)  # shares the array's memory
        if (
            not isinstance(data, torch.Tensor)
            or data.dtype != torch.float32
            or data.dim() != 1
            or not data.is_contiguous()
            or data.device != self._device
        ):
            what = (
                f"{type(data).__name__} {data.dtype} {tuple(data.shape)} on {data.device}"
                if isinstance(data, torch.Tensor)
                else type(data).__name__
            )
            raise TypeError(
                f"a {self.backend} group on {self._device} reduces 1-D contiguous float32 tensors on that device"
                f"{' (or numpy arrays)' if self._device.type == 'cpu' else ''}, got {what}"
            )
        return data

    def buffer(self, n: int) -> torch.Tensor:
        """The group's own buffer of ``n`` float32 on its device: ``allreduce`` of it
        saves copying in and out. Once the group is closed an abandoned operation may
        still write into it, so a caller takes a new one from the next group."""
        buffer = self._buffers.get(n)
        return self._make_buffer(n) if buffer is None else buffer

    def _make_buffer(self, n: int) -> torch.Tensor:
        tensor = torch.zeros(n, dtype=torch.float32, device=self._device)
        with self._lock:
            self._buffers[n] = tensor
        return tensor

    # -------------------------------------------------------------- lifetime

    def close(self, reason: str = "the group was closed") -> None:
        """Abandon the group: an operation waiting in another thread raises ``Abandoned``
        at once, and the other members' promptly. Idempotent; safe from any thread."""
        with self._lock:
            if self._reason is not None:
                return
            self._reason = reason
            wake = self._wake
        if wake is not None:
            wake.set()
        self.ring.close()
        self._retire()

    def _retire(self) -> None:
        """Drop the process group (closing its sockets) now if it is idle, else once its
        operation in flight ends, in a reaper thread: dropping it before would block."""
        with self._lock:
            pg, self._pg = self._pg, None
            work, self._work = self._work, None
            store, self._store = getattr(self, "_store", None), None
            buffers, self._buffers = self._buffers, {}
        if work is None or work.is_completed():
            if pg is not None and self.backend == "nccl":
                _shut_down(pg)
            del pg, work, store, buffers
            return
        holding = [pg, work, store, buffers]

        def reap() -> None:
            # the operation ends by the group's timeout at the latest (it failed, timed out or
            # completed: either way it is over); never Work.wait() here (module docstring)
            _wait_for(holding[1], None, None, longest=REAP_POLL_S)
            with _calls:
                if not _exiting:  # else left to the exit: dropping it now could abort the process
                    holding.clear()

        threading.Thread(target=reap, name=f"shmpad-reap-{self.key}", daemon=True).start()

    def _abandoned(self) -> Abandoned:
        return Abandoned(
            f"{self.backend} group {self.key!r} (rank {self.rank} of {self.size}) was abandoned: {self._reason}"
        )

    def __enter__(self) -> TorchGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


POLL_MIN_S = 20e-6
POLL_MAX_S = 0.5e-3
"""How often a caller looks whether its operation ended: first after ``POLL_MIN_S``, then
25% later each time, at most ``POLL_MAX_S`` apart (an operation is seen to end at most
that late, or a quarter of its time, whichever is less)."""


REAP_POLL_S = 0.05
"""How often a reaper looks whether the operation it holds ended."""


def _wait_for(work, timeout: float | None, wake: threading.Event | None, longest: float = POLL_MAX_S) -> bool:
    """Wait until ``work`` ended (True), ``wake`` is set (True: the caller looks why) or
    ``timeout`` seconds passed (False; None: no limit), polling ``work.is_completed()``
    at most ``longest`` apart:
    no callback and no ``Work.wait()`` runs on gloo's threads (module docstring)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = POLL_MIN_S
    while not _completed(work):
        if wake is not None and wake.is_set():
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        if wake is not None:
            wake.wait(delay)
        else:
            time.sleep(delay)
        delay = min(delay * 1.25, longest)
    return True


_calls = threading.Lock()
_exiting = False


@atexit.register
def _no_more_calls() -> None:
    """From the interpreter's exit on, a thread other than the main one makes no more calls
    into torch from here: one that returned from such a call (each releases the interpreter
    lock) after the exit began would abort the process (the reaper of a group still held then
    is the case in point). Runs before the exit stops the other threads."""
    global _exiting
    with _calls:
        _exiting = True


def _completed(work) -> bool:
    """``work.is_completed()``, unless this process is exiting and this is not its main
    thread: that thread then waits for the exit to stop it (``_no_more_calls``)."""
    with _calls:
        if not _exiting or threading.current_thread() is threading.main_thread():
            return work.is_completed()
    threading.Event().wait()
    return False  # not reached: the exit stops this thread


def _shut_down(pg) -> None:
    """Release an idle NCCL group's communicators now. Dropped without this, each one
    warns at exit that ``destroy_process_group()`` was not called (a group of ours
    is no default group, so that call does not apply)."""
    try:
        pg.shutdown()
    except (AttributeError, RuntimeError) as e:  # an older torch, or a communicator already broken
        log.debug("shutting down the NCCL group failed: %s", _first_line(e))


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__
