"""Waiting lines: one binary min-heap of request ids per line, ordered by (key, id).

All lines share one array: heap[line] is the offset of the line's segment, heap_n[line] how many
requests wait in it, heap[heap[line]] its head.

A line keeps arrival order when key[r] = r, and any other order (shortest estimate first) when
the policy sets key. Re-inserting a preempted request puts it back in its original place.
(The comparison is written out in place: a helper taking the key array would cost two atomic
reference-count updates per comparison.)"""

from fairlib.sim import jit
from fairlib.sim.state import KEY


@jit.inline
def head(heap, line):
    """The first request of a non-empty line."""
    return heap[heap[line]]


@jit.inline
def push(heap, heap_n, RF, line, r):
    o = heap[line]
    i = heap_n[line]
    heap_n[line] = i + 1
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
    heap[o + i] = r


@jit.inline
def pop(heap, heap_n, RF, line):
    o = heap[line]
    top = heap[o]
    n = heap_n[line] - 1
    heap_n[line] = n
    if n == 0:
        return top
    last = heap[o + n]
    klast = RF[KEY, last]
    i = 0
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
        if kc < klast or (kc == klast and hc < last):
            heap[o + i] = hc
            i = c
        else:
            break
    heap[o + i] = last
    return top
