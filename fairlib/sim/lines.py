"""Waiting lines: one binary min-heap of request ids per line, ordered by (key, id).

A line keeps arrival order when key[r] = r, and any other order (shortest estimate first) when
the policy sets key. Re-inserting a preempted request puts it back in its original place.
(The comparison is written out in place: a helper taking the key array would cost two atomic
reference-count updates per comparison.)"""

from . import jit
from .state import KEY


@jit.inline
def push(heap, heap_n, RF, line, r):
    i = heap_n[line]
    heap_n[line] = i + 1
    kr = RF[KEY, r]
    while i > 0:
        parent = (i - 1) >> 1
        p = heap[line, parent]
        kp = RF[KEY, p]
        if kr < kp or (kr == kp and r < p):
            heap[line, i] = p
            i = parent
        else:
            break
    heap[line, i] = r


@jit.inline
def pop(heap, heap_n, RF, line):
    top = heap[line, 0]
    n = heap_n[line] - 1
    heap_n[line] = n
    if n == 0:
        return top
    last = heap[line, n]
    klast = RF[KEY, last]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        hc = heap[line, c]
        kc = RF[KEY, hc]
        if c + 1 < n:
            h2 = heap[line, c + 1]
            k2 = RF[KEY, h2]
            if k2 < kc or (k2 == kc and h2 < hc):
                c, hc, kc = c + 1, h2, k2
        if kc < klast or (kc == klast and hc < last):
            heap[line, i] = hc
            i = c
        else:
            break
    heap[line, i] = last
    return top
