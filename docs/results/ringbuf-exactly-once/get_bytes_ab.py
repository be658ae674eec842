"""The consumer's cost alone, three versions of SPSCRing.get_bytes side by side in one process.
Runs on a checkout of commit 2acabdb (it uses SPSCRing's private state of then):

    git archive 2acabdb | tar -x -C CHECKOUT && cd CHECKOUT
    PYTHONPATH=$PWD python docs/results/ringbuf-exactly-once/get_bytes_ab.py

- main: main 9231560's get_bytes (copied below), which frees a run only at its end;
- first: commit e78c70a's (copied below), a DELIVERED store per message handed out;
- now: this checkout's SPSCRing.get_bytes.

Each of 400 iterations fills each version's ring (1024 slots of 64 B) with put_many and
times draining it with get_bytes (the read-ahead takes runs of 256), the versions one
after the other; printed: the median ns per get_bytes over iterations 20.., and the
median over iterations of each version's time / main's in the same iteration. Last, the
producer's side for scale: ns per put(64 bytes) into such a ring, median of 200 fills.
"""

import statistics
import time

import numpy as np

from shmpad.ringbuf import SPSCRing
from shmpad.ringbuf import ring as _ring
from shmpad.ringbuf.control import DELIVERED, READ


class Main(SPSCRing):
    def get_bytes(self, timeout=None):
        i = self._cache_next
        lens = self._cache_lens
        if i >= len(lens):
            if self._held:
                return super().get_bytes(timeout)
            r = self._refill(self._ctl, self._read_ahead, _ring._pid)
            if r < 0:
                r = self._retry(r, self._refill_once, True, timeout, "get_bytes", None)
            k = r & 0xFFFFFFFF
            self._cache_slot = r >> 32
            first = self._slot_words + self._cache_slot
            self._cache_lens = lens = self._ctl[first : first + k].tolist()
            i = 0
        self._cache_next = i + 1
        off = self._slots_abs + (self._cache_slot + i) * self._stride
        data = self._mm[off : off + lens[i]]
        if i + 1 == len(lens):
            self._cache_lens = []
            self._release(self._ctl, 0, 0)
        return data


class First(SPSCRing):
    def get_bytes(self, timeout=None):
        i = self._cache_next
        lens = self._cache_lens
        if i >= len(lens):
            if self._held:
                return super().get_bytes(timeout)
            r = self._refill(self._ctl, self._read_ahead, _ring._pid)
            if r < 0:
                r = self._retry(r, self._refill_once, True, timeout, "get_bytes", None)
            k = r & 0xFFFFFFFF
            self._cache_slot = r >> 32
            first = self._slot_words + self._cache_slot
            self._cache_lens = lens = self._ctl[first : first + k].tolist()
            self._cache_pos = int(self._ctl[READ]) - k
            i = 0
        self._cache_next = i + 1
        off = self._slots_abs + (self._cache_slot + i) * self._stride
        data = self._mm[off : off + lens[i]]
        if i + 1 == len(lens):
            self._cache_lens = []
            self._release(self._ctl, 0, 0)
        else:
            self._words[DELIVERED] = self._cache_pos + i + 1
        return data


versions = {"main": Main, "first": First, "now": SPSCRing}
rings = {name: cls(SPSCRing.create(1024, 64)._seg) for name, cls in versions.items()}
rows = np.zeros((1024, 64), np.uint8)
times = {name: [] for name in versions}
for _ in range(400):
    for name, ring in rings.items():
        get = ring.get_bytes
        ring.put_many(rows)
        t = time.perf_counter_ns()
        for _ in range(1024):
            get()
        times[name].append((time.perf_counter_ns() - t) / 1024)
put_times = []
ring = rings["now"]
message = bytes(64)
for _ in range(200):
    t = time.perf_counter_ns()
    for _ in range(1024):
        ring.put(message)
    put_times.append((time.perf_counter_ns() - t) / 1024)
    ring.get_many(1024)
    ring.release()
for ring in rings.values():
    ring.close()
for name, t in times.items():
    ratio = statistics.median(a / b for a, b in zip(t[20:], times["main"][20:]))
    print(f"{name:6s} {statistics.median(t[20:]):6.1f} ns/get_bytes  {ratio:.3f}x main's time")
print(f"put    {statistics.median(put_times[20:]):6.1f} ns/put (the producer's side, for scale)")
