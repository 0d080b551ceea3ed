"""Waiting lines: one binary min-heap of request ids per line, ordered by (key, id).

All lines share one array: heap[line] is the offset of the line's segment, heap_n[line] how many
requests wait in it, heap[heap[line]] its head.

A line keeps arrival order when key[r] = r, and any other order (shortest estimate first) when
the policy sets key. Re-inserting a preempted request puts it back in its original place.
(The comparisons are written out in the two sift helpers, inlined at numba-IR level and compiled
without numba's runtime, so passing the key array costs no reference counting.)"""

from fairlib.sim import jit
from fairlib.sim.state import KEY


@jit.inline
def head(heap, line):
    """The first request of a non-empty line."""
    return heap[heap[line]]


@jit.inline
def _up(heap, o, i, RF, r):
    """Where ``r``, to stand at position ``i`` of the segment at ``o``, ends moving up past every
    larger parent (the parents move down)."""
    kr = RF[KEY, r]
    while i > 0:
        parent = (i - 1) >> 1
        p = heap[o + parent]
        kp = RF[KEY, p]
        if kr < kp or (kr == kp and r < p):
            heap[o + i] = p
            i = parent
        else:
            break
    return i


@jit.inline
def _down(heap, o, i, n, RF, r):
    """Where ``r``, to stand at position ``i`` of a heap of ``n``, ends moving down past every
    smaller child (the children move up)."""
    kr = RF[KEY, r]
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        hc = heap[o + c]
        kc = RF[KEY, hc]
        if c + 1 < n:
            h2 = heap[o + c + 1]
            k2 = RF[KEY, h2]
            if k2 < kc or (k2 == kc and h2 < hc):
                c, hc, kc = c + 1, h2, k2
        if kc < kr or (kc == kr and hc < r):
            heap[o + i] = hc
            i = c
        else:
            break
    return i


@jit.inline
def push(heap, heap_n, RF, line, r):
    o = heap[line]
    i = heap_n[line]
    heap_n[line] = i + 1
    heap[o + _up(heap, o, i, RF, r)] = r


@jit.inline
def pop(heap, heap_n, RF, line):
    o = heap[line]
    top = heap[o]
    n = heap_n[line] - 1
    heap_n[line] = n
    if n == 0:
        return top
    last = heap[o + n]
    heap[o + _down(heap, o, 0, n, RF, last)] = last
    return top


@jit.inline
def remove(heap, heap_n, RF, line, r):
    """Take request ``r`` out of its line wherever it stands (a waiting request withdrawn: its
    client left, it timed out). Returns 1 if it was there, else 0. The line's last entry takes
    its place and moves up or down to keep the heap order."""
    o = heap[line]
    n = heap_n[line]
    i = -1
    for k in range(n):
        if heap[o + k] == r:
            i = k
            break
    if i < 0:
        return 0
    n -= 1
    heap_n[line] = n
    if i == n:
        return 1
    last = heap[o + n]
    i = _up(heap, o, i, RF, last)
    heap[o + _down(heap, o, i, n, RF, last)] = last
    return 1
