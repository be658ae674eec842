"""Moving data between the ring, the learner's device and the weight store without
stalling the device.

``BatchStager``: a batch of ring slots ``{field: [B, T+1, ...]}`` is copied once, made
time-major, into one of two host staging buffers ``{field: [T+1, B, ...]}`` (pinned on
CUDA), the slots go back to the ring at once, and the copy to the device is issued on a
side stream into one of two device buffers. The compute stream waits for that copy only
when it needs the batch, so the copy of batch ``k+1`` runs while update ``k`` computes::

    host thread   get_batch(k+1) -> memcpy into staging[(k+1)%2] -> release slots -> issue H2D ...
    copy stream                                          H2D(k+1) after update(k-1) used device[(k+1)%2]
    compute       update(k) ........................................ waits H2D(k+1) -> update(k+1)

A staging buffer is written again only after its last copy to the device finished
(an event), and a device buffer only after the update that read it (another event),
so neither is overwritten while in use. On the CPU the same code runs with plain
(unpinned) buffers and no streams: a staged batch is then one copy of the slots, which
frees them before the update instead of after it, and gives the update contiguous
time-major tensors instead of transposed views of the slots.

``WeightPublisher``: every ``every`` updates (or, given ``seconds``, at the first update
``seconds`` after the last publish) the model goes to the weight store. From
a GPU the parameters are copied into pinned host buffers asynchronously and the store
is written at a later call, once that copy has completed (``event.query()``, never a
wait), so publishing never stalls the device; the actors see weights at most a few
updates older than a synchronous publish would give them.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

from shmpad.weights import WeightStore

__all__ = ["BatchStager", "WeightPublisher"]


class _NoEvent:
    """The CPU's stand-in for a CUDA event: everything is already complete."""

    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


def _event(device: torch.device):
    return torch.cuda.Event() if device.type == "cuda" else _NoEvent()


class BatchStager:
    """Double-buffered ``ring batch -> device`` copies (see the module docstring).

    ``stage(batch)`` copies the host tensors (the ring's views, ``[B, T+1, ...]``) into
    time-major ``[T+1, B, ...]`` buffers and returns the buffer index; after it the
    caller may release the slots. ``to_device(i)`` returns the device tensors of buffer
    ``i`` (ready for the current stream) and ``done(i)`` says the current stream has
    issued all the work that reads them."""

    def __init__(self, device: str | torch.device):
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._host: list[dict[str, torch.Tensor]] = [{}, {}]
        self._dev: list[dict[str, torch.Tensor]] = [{}, {}]
        self._copied = [_event(self.device), _event(self.device)]  # H2D of buffer i complete
        self._used = [_event(self.device), _event(self.device)]  # the update that read device buffer i complete
        self._stream = torch.cuda.Stream(self.device) if self._cuda else None
        self._next = 0
        self.batches = 0

    def stage(self, batch: dict[str, torch.Tensor]) -> int:
        i = self._next
        self._next ^= 1
        host = self._host[i]
        if not host:
            shapes = {k: (v.shape[1], v.shape[0], *v.shape[2:]) for k, v in batch.items()}  # [T+1, B, ...]
            host.update({k: torch.empty(shapes[k], dtype=v.dtype, pin_memory=self._cuda) for k, v in batch.items()})
            if self._cuda:
                self._dev[i] = {k: torch.empty(shapes[k], dtype=v.dtype, device=self.device) for k, v in batch.items()}
        self._copied[i].synchronize()  # the previous copy out of host[i] is done: overwrite it
        for k, v in batch.items():
            host[k].copy_(v.transpose(0, 1))
        self.batches += 1
        return i

    def host(self, i: int) -> dict[str, torch.Tensor]:
        """The staged host copy of buffer ``i``, time-major (for counting on the CPU without a sync)."""
        return self._host[i]

    def to_device(self, i: int) -> dict[str, torch.Tensor]:
        if not self._cuda:
            return self._host[i]
        with torch.cuda.stream(self._stream):
            self._stream.wait_event(self._used[i])  # the update that last read dev[i] is done
            for k, v in self._host[i].items():
                self._dev[i][k].copy_(v, non_blocking=True)
            self._copied[i].record(self._stream)
        torch.cuda.current_stream(self.device).wait_event(self._copied[i])
        return self._dev[i]

    def done(self, i: int) -> None:
        if self._cuda:
            self._used[i].record(torch.cuda.current_stream(self.device))


HISTORY = 4096
"""how many of its newest versions a ``WeightPublisher`` remembers (actors never act with older weights)"""
_NO_VERSION = np.iinfo(np.int64).min


class WeightPublisher:
    """Publishes ``model`` to ``store`` every ``every`` calls, or with ``seconds > 0`` at the
    first call ``seconds`` after the last publish (see the module docstring); ``clock`` is
    ``time.monotonic`` but for tests."""

    def __init__(
        self,
        model: torch.nn.Module,
        store: WeightStore,
        every: int = 1,
        seconds: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"publish_every must be an int >= 1 (updates between publishes), got {every!r}")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0:
            raise ValueError(f"publish_seconds must be a number >= 0 (0: every {every} update(s)), got {seconds!r}")
        self.model = model
        self.store = store
        self.every = every
        self.seconds = float(seconds)
        self._clock = clock
        self._last = clock()
        self.device = next(model.parameters()).device
        self._cuda = self.device.type == "cuda"
        self._calls = 0
        self._host: dict[str, torch.Tensor] | None = None
        self._event = _event(self.device)
        self._pending = False
        self._pending_steps = 0
        self.publishes = 0
        # the learner's update count each of the newest HISTORY versions holds, at version % HISTORY
        self._versions = np.full(HISTORY, _NO_VERSION, np.int64)
        self._steps_at = np.zeros(HISTORY, np.int64)

    def __call__(self, steps: int) -> None:
        """Update number ``steps`` happened: publish if it is the ``every``-th (or ``seconds`` have passed)."""
        self._calls += 1
        if self._pending and self._event.query():
            self._write()
        due = self._clock() - self._last >= self.seconds if self.seconds else self._calls % self.every == 0
        if due:
            self.publish(steps, wait=False)

    def publish(self, steps: int, wait: bool = True) -> None:
        """Publish the weights after ``steps`` updates now: from the CPU at once; from a GPU
        the copy is issued and written when complete (at once with ``wait``, else later)."""
        self._last = self._clock()
        if not self._cuda:
            self._record(self.store.publish(self.model), steps)
            return
        if self._pending:
            if not wait and not self._event.query():
                return  # the previous copy is still in flight: this publish is skipped, the next one catches up
            self._write()
        state = self.model.state_dict()
        if self._host is None:
            self._host = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in state.items()}
        for k, v in state.items():
            self._host[k].copy_(v.detach(), non_blocking=True)
        self._event.record()
        self._pending = True
        self._pending_steps = steps
        if wait:
            self._write()

    def _write(self) -> None:
        self._event.synchronize()
        self._pending = False
        self._record(self.store.publish(self._host), self._pending_steps)

    def _record(self, version: int, steps: int) -> None:
        self.publishes += 1
        self._versions[version % HISTORY] = version
        self._steps_at[version % HISTORY] = steps

    def steps_at(self, version: int) -> int | None:
        """The learner's update count that weight-store ``version`` holds; ``None`` if it
        is not one of the newest ``HISTORY`` versions this publisher wrote."""
        i = version % HISTORY
        return int(self._steps_at[i]) if self._versions[i] == version else None

    def lag(self, versions: torch.Tensor, steps: int) -> float | None:
        """Mean updates between the weights that acted (``versions``, CPU) and ``steps``;
        ``None`` if no version is known (a batch from before this learner published)."""
        v = versions.numpy().reshape(-1)
        i = v % HISTORY
        known = self._versions[i] == v
        n = np.count_nonzero(known)
        return steps - float(self._steps_at[i[known]].sum()) / n if n else None
