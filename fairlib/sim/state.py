"""The simulator's state: nine plain arrays, shared by the compiled loop and the Python layer
(book/engine-model.md). Requests are columns ``0..n-1`` in table order.

Per-field arrays are packed into a few 2-D arrays (row = field) because every array a numba
function takes out of a tuple costs two atomic reference-count updates: the loop unpacks these
nine once per run, not hundreds of times per iteration.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

# request status codes (WITHDRAWN: left before finishing, outside the engine model: a gateway's
# request whose client went away, whose upstream failed or that timed out waiting; fairlib/sim/observed.py)
UNDELIVERED, WAITING, RUNNING, FINISHED, REJECTED, HELD, WITHDRAWN = 0, 1, 2, 3, 4, 5, 6

# RF rows (float64 per request); AUX is the policy's own per-request number
ARRIVAL, KEY, ADMITTED, FIRST, FINISH, CHARGED, AUX = range(7)
# RI rows (int64 per request)
TENANT, PROMPT, OUTPUT, EST, KLASS, LINE, STATUS, GENERATED, PREEMPT, ENTERED, PRE_TOK = range(11)
# TF rows (float64 per tenant)
T_MACHINE, T_PREFILL, T_DECODE = range(3)
# TI rows (int64 per tenant)
T_TOKENS, T_ADMITTED, T_FINISHED, T_REJECTED, T_RUNNING = range(5)
# BT rows (int64 per batch slot)
RUN_IDS, LAST_IDS, HELD_IDS = range(3)
# sf (float scalars); FILL_START: when a free static-batch worker took its first waiting request (-1: none)
T_NOW, BUSY_MS, FILL_START = range(3)
# si (int scalars)
N_REQ, NEXT_ARRIVAL, N_RUNNING, ITERATIONS, DECODE_TOKENS, N_HELD, LAST_B = range(7)


class State(NamedTuple):
    RF: np.ndarray       # f8[7, capacity]: arrival, key (order in its line), admitted, first token, finish, charged,
    #                      aux (a number the policy keeps per request)
    RI: np.ndarray       # i8[11, capacity]: tenant, prompt, output, est, klass, line, status, generated,
    #                      preemptions, entered (iteration of the latest entry), prefill tokens of the latest admission
    TF: np.ndarray       # f8[3, n_tenants]: machine, prefill, decode ms
    TI: np.ndarray       # i8[5, n_tenants]: tokens, admitted, finished, rejected, running
    BT: np.ndarray       # i8[3, max_batch]: running ids, ids that ran in the latest iteration, preempted now
    heap: np.ndarray     # i8[n_lines + sum of line capacities]: heap[l] is the offset of line l's segment,
    #                      which holds a binary heap of its waiting requests (fairlib/sim/lines.py)
    heap_n: np.ndarray   # i8[n_lines]: requests waiting in each line
    sf: np.ndarray       # f8[3]: now, busy, fill start (static batches)
    si: np.ndarray       # i8[7]: see the indices above


def allocate(capacity: int, n_tenants: int, n_lines: int, max_batch: int, line_sizes=None) -> State:
    """Empty state for up to `capacity` requests; line l has room for line_sizes[l] requests
    (default `capacity` each: requests arriving one by one may go to any line)."""
    cap = max(int(capacity), 1)
    sizes = np.full(n_lines, cap, np.int64) if line_sizes is None else np.asarray(line_sizes, np.int64)
    RF = np.zeros((7, cap))
    RF[[ADMITTED, FIRST, FINISH]] = np.nan
    heap = np.zeros(n_lines + int(sizes.sum()), np.int64)
    heap[:n_lines] = n_lines + np.concatenate([[0], np.cumsum(sizes)[:-1]]) if n_lines else []
    return State(RF, np.zeros((11, cap), np.int64), np.zeros((3, n_tenants)), np.zeros((5, n_tenants), np.int64),
                 np.zeros((3, max_batch), np.int64), heap, np.zeros(n_lines, np.int64), np.array([0.0, 0.0, -1.0]),
                 np.zeros(7, np.int64))


def grow(state: State, capacity: int) -> State:
    """A copy of `state` with room for `capacity` requests in every line (online use); contents kept."""
    old = state.RF.shape[1]
    if capacity <= old:
        return state
    n_lines = state.heap_n.shape[0]
    new = allocate(capacity, state.TF.shape[1], n_lines, state.BT.shape[1])
    new.RF[:, :old] = state.RF
    new.RI[:, :old] = state.RI
    for line in range(n_lines):
        k = state.heap_n[line]
        new.heap[new.heap[line]:new.heap[line] + k] = state.heap[state.heap[line]:state.heap[line] + k]
    for name in ("TF", "TI", "BT", "heap_n", "sf", "si"):
        getattr(new, name)[...] = getattr(state, name)
    return new
