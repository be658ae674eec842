"""bench.rpc's client: the timing loops that run in the client process, one call at a
time (``time_sync``) or with calls in flight (``time_in_flight``), each checking every
reply and reporting a ``Sample`` (median and p99 round trip, calls/s).
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter_ns
from typing import NamedTuple

import numpy as np

from bench.rpc.contract import (
    Caller,
    Plan,
    Subject,
    payloads,
)


class Sample(NamedTuple):
    """One measurement, as the client saw it."""

    median_us: float
    p99_us: float
    calls_per_s: float
    calls: int


class WrongReply(Exception):
    pass


def _summary(latencies_ns: list[int], elapsed_ns: int) -> Sample:
    lat = np.asarray(latencies_ns, dtype=np.int64)
    median, p99 = np.percentile(lat, [50, 99]) / 1e3
    return Sample(float(median), float(p99), len(lat) / (elapsed_ns / 1e9), len(lat))


def time_sync(caller: Caller, plan: Plan) -> Sample:
    msgs = payloads()
    mask = len(msgs) - 1
    call, clock = caller.call, perf_counter_ns

    def run(ended: Ended, latencies: list[int]) -> int:
        append = latencies.append
        i = 0
        start = t1 = clock()
        while not ended(i, t1):
            p = msgs[i & mask]
            t0 = clock()
            r = call(p)
            t1 = clock()
            if r != p:
                raise WrongReply(f"call {i}: sent {p[:8].hex()}..., got {bytes(r)[:8].hex()}...")
            append(t1 - t0)
            i += 1
        return t1 - start

    return _timed(run, plan)


def time_in_flight(caller: Caller, plan: Plan) -> Sample:
    msgs = payloads()
    mask = len(msgs) - 1
    submit, next_reply, clock = caller.submit, caller.next_reply, perf_counter_ns

    def run(ended: Ended, latencies: list[int]) -> int:
        append = latencies.append
        outstanding: dict[bytes, int] = {}  # payload -> submit time; the payload names the call
        start = clock()
        for i in range(plan.depth):
            p = msgs[i & mask]
            outstanding[p] = clock()
            submit(p)
        i = plan.depth
        done = 0
        t = start
        while outstanding:
            r = next_reply()
            t = clock()
            t0 = outstanding.pop(bytes(r), None)
            if t0 is None:
                raise WrongReply(f"reply {done}: {bytes(r)[:8].hex()}... answers no call in flight")
            append(t - t0)
            done += 1
            if not ended(i, t):
                p = msgs[i & mask]
                i += 1
                outstanding[p] = clock()
                submit(p)
        return t - start

    return _timed(run, plan)


# ended(calls submitted so far, perf_counter_ns()) -> submit no more
Ended = Callable[[int, int], bool]


def _timed(run: Callable[[Ended, list[int]], int], plan: Plan) -> Sample:
    """Warm up, then time: ``run(ended, latencies)`` makes calls until ``ended`` says
    so, appends each one's round trip in ns and returns the time from the first
    submit to the last reply."""
    least, seconds = (5, 0.0) if plan.calls else (20, plan.warmup_seconds)
    run(lambda n, now: n >= 1, [])  # the first call may wait for the server and compile
    start = perf_counter_ns()
    run(lambda n, now: n >= least and now - start >= seconds * 1e9, [])
    latencies: list[int] = []
    start = perf_counter_ns()
    if plan.calls:
        elapsed = run(lambda n, now: n >= plan.calls, latencies)
    else:
        elapsed = run(lambda n, now: now - start >= plan.seconds * 1e9, latencies)
    return _summary(latencies, elapsed)


def run_client(subject: Subject, plan: Plan) -> Sample:
    caller = subject.connect()
    try:
        return time_sync(caller, plan) if plan.depth == 1 else time_in_flight(caller, plan)
    finally:
        caller.close()
