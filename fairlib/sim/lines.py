"""Waiting lines: one binary min-heap of request ids per line, ordered by (key, id).

A line keeps arrival order when key[r] = r, and any other order (shortest estimate first) when
the policy sets key. Re-inserting a preempted request puts it back in its original place."""
import numba as nb

from .state import KEY


@nb.njit(cache=True, inline="always")
def _before(RF, a, b):
    return RF[KEY, a] < RF[KEY, b] or (RF[KEY, a] == RF[KEY, b] and a < b)


@nb.njit(cache=True, inline="always")
def push(heap, heap_n, RF, line, r):
    i = heap_n[line]
    heap_n[line] = i + 1
    while i > 0:
        parent = (i - 1) >> 1
        p = heap[line, parent]
        if _before(RF, r, p):
            heap[line, i] = p
            i = parent
        else:
            break
    heap[line, i] = r


@nb.njit(cache=True, inline="always")
def pop(heap, heap_n, RF, line):
    top = heap[line, 0]
    n = heap_n[line] - 1
    heap_n[line] = n
    if n == 0:
        return top
    last = heap[line, n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _before(RF, heap[line, c + 1], heap[line, c]):
            c += 1
        if _before(RF, heap[line, c], last):
            heap[line, i] = heap[line, c]
            i = c
        else:
            break
    heap[line, i] = last
    return top
