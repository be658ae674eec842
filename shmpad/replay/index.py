"""The compiled index of a replay table: which slots hold items, in which order, with
which priorities, and the rate limiter's counters. Every kernel here runs with the
table's lock held (``lock.py``), so the arrays are read and written plainly; the lock's
acquire and release order them between processes.

Per slot (``cap`` of each)::

    state     FREE, WRITING (reserved by an inserter that copies its data outside the
              lock) or READY (visible to samplers)
    key       seq * cap + slot (seq counts inserts from 1): unique for the table's life,
              and its slot is key % cap
    prio      the priority; times: how often it was sampled
    prev/nxt  the READY slots in insertion order, a doubly linked list (Fifo, Lifo)

Trees over the slots (P = the power of two >= cap, node n's children 2n and 2n+1,
leaf of slot i at P + i), each rewritten from its children on every change, so that
no rounding error accumulates::

    count_t   1 for a READY slot          uniform choice, by prefix search
    sum_t     prio ** exponent             prioritized choice, by prefix search
    min_t     prio (+inf when not READY)   MinHeap
    max_t     prio (-inf when not READY)   MaxHeap

``free`` is a stack of FREE slots; ``inflight`` holds (slot, pid) of every WRITING slot,
so that the slots of an inserter that died can be found and freed (``writers``).

The tuple ``t`` every kernel takes is ``Table._index``:
(ctl, state, owner, key, times, prio, prev, nxt, free, inflight, count_t, sum_t, min_t, max_t).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shmpad.replay.selectors import FIFO, LIFO, MIN_HEAP, PRIORITIZED, UNIFORM
from shmpad.shm.arrays import place

# control words (int64, indices into ctl); lines 0-2 are the lock and the events (lock.py)
LOCK = 0
LOCK_EV = 8
EV_CHANGED = 16
SIZE = 24
INSERTS = 25
SAMPLES = 26
DELETES = 27
PENDING = 28
NEXT_SEQ = 29
HEAD = 30
TAIL = 31
FREE_TOP = 32
CLOSED = 33
RECOVERED = 34
LEFT = 35  # with max_times_sampled m: samples the items can still give, sum of m - times
CTL_WORDS = 40

FREE, WRITING, READY = 0, 1, 2
MAX_INFLIGHT = 256
"""how many inserts may be copying their data into one table at once"""

# reserve()'s answers other than a slot
RATE_LIMITED = -1
NO_SLOT = -2


def offsets(fields: list, max_size: int) -> dict[str, int]:
    """Byte offsets of a table's arrays in its segment's data area (``table.py`` draws them),
    each on its own cache lines; ``p2`` and ``total`` (the bytes needed) too."""
    p2 = 1 << max(0, (max_size - 1).bit_length())
    blocks = [("ctl", CTL_WORDS * 8)]
    blocks += [(name, max_size * 8) for name in ("state", "owner", "key", "times", "prio", "prev", "nxt", "free")]
    blocks.append(("inflight", MAX_INFLIGHT * 2 * 8))
    blocks += [(name, 2 * p2 * 8) for name in ("count_t", "sum_t", "min_t", "max_t")]
    blocks += [
        ("field:" + name, max_size * int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
        for name, dtype, shape in fields
    ]
    placed, total = place(blocks)
    return {**placed, "p2": p2, "total": total}


@njit(nogil=True, cache=True)
def _set_leaf(tree, p2, i, value, op):
    """Set leaf ``i`` and rewrite its ancestors: op 0 sum, 1 min, 2 max."""
    n = p2 + i
    tree[n] = value
    n >>= 1
    while n >= 1:
        a = tree[2 * n]
        b = tree[2 * n + 1]
        if op == 0:
            tree[n] = a + b
        elif op == 1:
            tree[n] = a if a <= b else b
        else:
            tree[n] = a if a >= b else b
        n >>= 1


@njit(nogil=True, cache=True)
def _prefix_find(tree, p2, u):
    """The leaf where the running sum of leaves passes ``u`` (0 <= u < tree[1])."""
    n = 1
    while n < p2:
        left = tree[2 * n]
        if u < left:
            n = 2 * n
        else:
            u -= left
            n = 2 * n + 1
    i = n - p2
    while tree[p2 + i] <= 0.0 and i > 0:  # u at the very top, rounded past the last weight
        i -= 1
    return i


@njit(nogil=True, cache=True)
def _extreme_find(tree, p2):
    """The leaf holding the root's value (the min or max), leftmost among ties."""
    n = 1
    while n < p2:
        n = 2 * n if tree[2 * n] == tree[n] else 2 * n + 1
    return n - p2


@njit(nogil=True, cache=True)
def _show(t, slot, exponent):
    """Make READY ``slot`` visible in the trees and the order."""
    ctl, state, owner, key, times, prio, prev, nxt, free, inflight, count_t, sum_t, min_t, max_t = t
    p2 = count_t.shape[0] // 2
    p = prio[slot]
    _set_leaf(count_t, p2, slot, 1.0, 0)
    _set_leaf(sum_t, p2, slot, p**exponent, 0)
    _set_leaf(min_t, p2, slot, p, 1)
    _set_leaf(max_t, p2, slot, p, 2)
    tail = ctl[TAIL]
    prev[slot] = tail
    nxt[slot] = -1
    if tail >= 0:
        nxt[tail] = slot
    else:
        ctl[HEAD] = slot
    ctl[TAIL] = slot


@njit(nogil=True, cache=True)
def _hide(t, slot):
    """Take READY ``slot`` out of the trees and the order; it stays READY."""
    ctl, state, owner, key, times, prio, prev, nxt, free, inflight, count_t, sum_t, min_t, max_t = t
    p2 = count_t.shape[0] // 2
    _set_leaf(count_t, p2, slot, 0.0, 0)
    _set_leaf(sum_t, p2, slot, 0.0, 0)
    _set_leaf(min_t, p2, slot, np.inf, 1)
    _set_leaf(max_t, p2, slot, -np.inf, 2)
    a = prev[slot]
    b = nxt[slot]
    if a >= 0:
        nxt[a] = b
    else:
        ctl[HEAD] = b
    if b >= 0:
        prev[b] = a
    else:
        ctl[TAIL] = a


@njit(nogil=True, cache=True)
def _remove(t, slot, max_times):
    """Delete the item in READY ``slot``; the slot is FREE and on the free stack."""
    ctl, state, owner, key, times, prio, prev, nxt, free, inflight, count_t, sum_t, min_t, max_t = t
    _hide(t, slot)
    state[slot] = FREE
    free[ctl[FREE_TOP]] = slot
    ctl[FREE_TOP] += 1
    ctl[SIZE] -= 1
    ctl[DELETES] += 1
    ctl[LEFT] -= max(0, max_times - times[slot])


@njit(nogil=True, cache=True)
def _select(t, code, u):
    """A READY slot chosen by selector ``code`` (``u`` uniform in [0, 1)), and the
    probability that it was chosen. The table must not be empty."""
    ctl, state, owner, key, times, prio, prev, nxt, free, inflight, count_t, sum_t, min_t, max_t = t
    p2 = count_t.shape[0] // 2
    if code == PRIORITIZED and sum_t[1] > 0.0:
        total = sum_t[1]
        slot = _prefix_find(sum_t, p2, u * total)
        return slot, sum_t[p2 + slot] / total
    if code == UNIFORM or code == PRIORITIZED:
        n = count_t[1]
        return _prefix_find(count_t, p2, np.floor(u * n)), 1.0 / n
    if code == FIFO:
        return ctl[HEAD], 1.0
    if code == LIFO:
        return ctl[TAIL], 1.0
    if code == MIN_HEAP:
        return _extreme_find(min_t, p2), 1.0
    return _extreme_find(max_t, p2), 1.0


@njit(nogil=True, cache=True)
def can_insert(ctl, limits):
    """The rate limiter's verdict on one more insert (counting those in flight)."""
    spi, min_size, max_diff = limits[0], limits[1], limits[3]
    size = ctl[SIZE] + ctl[PENDING]
    if size + 1 <= min_size:
        return True
    return (ctl[INSERTS] + ctl[PENDING] + 1) * spi - ctl[SAMPLES] <= max_diff


@njit(nogil=True, cache=True)
def can_sample(ctl, limits, n, max_times):
    """The rate limiter's verdict on a batch of ``n`` samples (which, with
    ``max_times`` > 0, the items must be able to give before they are all deleted)."""
    spi, min_size, min_diff = limits[0], limits[1], limits[2]
    size = ctl[SIZE]
    if size < min_size or size < 1 or (max_times > 0 and ctl[LEFT] < n):
        return False
    return ctl[INSERTS] * spi - ctl[SAMPLES] - n >= min_diff


@njit(nogil=True, cache=True)
def reserve(t, limits, remover, u, pid, max_times):
    """A slot for one insert, marked WRITING by ``pid``; or RATE_LIMITED, or NO_SLOT
    (every slot is being written, or ``inflight`` is full). A full table first evicts
    the item ``remover`` picks."""
    ctl, state, owner, key, times, prio, prev, nxt, free, inflight, count_t, sum_t, min_t, max_t = t
    if not can_insert(ctl, limits):
        return RATE_LIMITED
    entry = -1
    for e in range(MAX_INFLIGHT):
        if inflight[2 * e] < 0:
            entry = e
            break
    if entry < 0:
        return NO_SLOT
    if ctl[FREE_TOP] > 0:
        ctl[FREE_TOP] -= 1
        slot = free[ctl[FREE_TOP]]
    elif ctl[SIZE] > 0:
        slot, _ = _select(t, remover, u)
        _hide(t, slot)
        ctl[SIZE] -= 1
        ctl[DELETES] += 1
        ctl[LEFT] -= max(0, max_times - times[slot])
    else:
        return NO_SLOT
    state[slot] = WRITING
    owner[slot] = pid
    inflight[2 * entry] = slot
    inflight[2 * entry + 1] = pid
    ctl[PENDING] += 1
    return slot


@njit(nogil=True, cache=True)
def _drop_inflight(t, slot):
    inflight = t[9]
    for e in range(MAX_INFLIGHT):
        if inflight[2 * e] == slot:
            inflight[2 * e] = -1
            inflight[2 * e + 1] = 0
            return


@njit(nogil=True, cache=True)
def commit(t, slot, priority, exponent, max_times):
    """Make the item written into WRITING ``slot`` visible; its key."""
    ctl, state, owner, key, times, prio, prev, nxt, free, inflight, count_t, sum_t, min_t, max_t = t
    cap = state.shape[0]
    seq = ctl[NEXT_SEQ]
    ctl[NEXT_SEQ] = seq + 1
    k = seq * cap + slot
    key[slot] = k
    prio[slot] = priority
    times[slot] = 0
    state[slot] = READY
    _show(t, slot, exponent)
    _drop_inflight(t, slot)
    ctl[PENDING] -= 1
    ctl[SIZE] += 1
    ctl[INSERTS] += 1
    ctl[LEFT] += max_times
    return k


@njit(nogil=True, cache=True)
def draw(t, sampler, u, max_times, i, slots, keys, probs, prios, times_out):
    """Choose one item with uniform ``u`` into row ``i`` of the out arrays and count the
    sample (an item sampled its ``max_times``-th time is deleted)."""
    ctl, state, owner, key, times, prio, prev, nxt, free, inflight, count_t, sum_t, min_t, max_t = t
    slot, p = _select(t, sampler, u)
    slots[i] = slot
    keys[i] = key[slot]
    probs[i] = p
    prios[i] = prio[slot]
    times[slot] += 1
    times_out[i] = times[slot]
    ctl[SAMPLES] += 1
    if max_times > 0:
        ctl[LEFT] -= 1
        if times[slot] >= max_times:
            _remove(t, slot, max_times)


@njit(nogil=True, cache=True)
def sample(t, sampler, uniforms, max_times, slots, keys, probs, prios, times_out):
    """Choose ``len(uniforms)`` items one after another (an item sampled its
    ``max_times``-th time is deleted before the next choice); fills the out arrays."""
    for i in range(uniforms.shape[0]):
        draw(t, sampler, uniforms[i], max_times, i, slots, keys, probs, prios, times_out)


@njit(nogil=True, cache=True)
def update_priorities(t, new_keys, new_prios, exponent):
    """Set the priorities of the items still in the table; how many were."""
    ctl, state, owner, key, times, prio, prev, nxt, free, inflight, count_t, sum_t, min_t, max_t = t
    cap = state.shape[0]
    p2 = count_t.shape[0] // 2
    done = 0
    for j in range(new_keys.shape[0]):
        k = new_keys[j]
        if k < 0:
            continue
        slot = k % cap
        if state[slot] != READY or key[slot] != k:
            continue  # deleted since it was sampled: Reverb ignores it too
        p = new_prios[j]
        prio[slot] = p
        _set_leaf(sum_t, p2, slot, p**exponent, 0)
        _set_leaf(min_t, p2, slot, p, 1)
        _set_leaf(max_t, p2, slot, p, 2)
        done += 1
    return done


@njit(nogil=True, cache=True)
def writers(t, out):
    """(slot, pid) of every WRITING slot into ``out``; how many."""
    inflight = t[9]
    n = 0
    for e in range(MAX_INFLIGHT):
        if inflight[2 * e] >= 0:
            out[2 * n] = inflight[2 * e]
            out[2 * n + 1] = inflight[2 * e + 1]
            n += 1
    return n


@njit(nogil=True, cache=True)
def ready_slots(t):
    """The READY slots in insertion (key) order."""
    state, key = t[1], t[3]
    slots = np.nonzero(state == READY)[0]
    return slots[np.argsort(key[slots])]


@njit(nogil=True, cache=True)
def rebuild(t, exponent, dead, max_times):
    """Rewrite everything derived from the per-slot arrays: the trees, the order, the
    free stack and the counts. WRITING slots in ``dead`` (their writers died) become
    FREE. Used after a lock holder died mid-update, and by restore."""
    ctl, state, owner, key, times, prio, prev, nxt, free, inflight, count_t, sum_t, min_t, max_t = t
    cap = state.shape[0]
    for s in dead:
        if state[s] == WRITING:
            state[s] = FREE
            _drop_inflight(t, s)
    count_t[:] = 0.0
    sum_t[:] = 0.0
    min_t[:] = np.inf
    max_t[:] = -np.inf
    ctl[HEAD] = -1
    ctl[TAIL] = -1
    ctl[FREE_TOP] = 0
    pending = 0
    for s in range(cap):
        if state[s] == FREE:
            free[ctl[FREE_TOP]] = s
            ctl[FREE_TOP] += 1
        elif state[s] == WRITING:
            pending += 1
    order = ready_slots(t)
    left = 0
    for s in order:
        _show(t, s, exponent)
        left += max(0, max_times - times[s])
    ctl[LEFT] = left if max_times > 0 else 0
    ctl[SIZE] = order.shape[0]
    ctl[PENDING] = pending
    for e in range(MAX_INFLIGHT):  # an entry whose slot is no longer WRITING is stale
        s = inflight[2 * e]
        if s >= 0 and state[s] != WRITING:
            inflight[2 * e] = -1
            inflight[2 * e + 1] = 0
