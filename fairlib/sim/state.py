"""The simulator's state: nine plain arrays, shared by the compiled loop and the Python layer
(book/engine-model.md). Requests are columns ``0..n-1`` in table order.

Per-field arrays are packed into a few 2-D arrays (row = field) because every array a numba
function takes out of a tuple costs two atomic reference-count updates: the loop unpacks these
nine once per run, not hundreds of times per iteration.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

# request status codes
UNDELIVERED, WAITING, RUNNING, FINISHED, REJECTED, HELD = 0, 1, 2, 3, 4, 5

# RF rows (float64 per request)
ARRIVAL, KEY, ADMITTED, FIRST, FINISH, CHARGED = range(6)
# RI rows (int64 per request)
TENANT, PROMPT, OUTPUT, EST, KLASS, LINE, STATUS, GENERATED, PREEMPT, ENTERED, PRE_TOK = range(11)
# TF rows (float64 per tenant)
T_MACHINE, T_PREFILL, T_DECODE = range(3)
# TI rows (int64 per tenant)
T_TOKENS, T_ADMITTED, T_FINISHED, T_REJECTED, T_RUNNING = range(5)
# BT rows (int64 per batch slot)
RUN_IDS, LAST_IDS, HELD_IDS = range(3)
# sf (float scalars)
T_NOW, BUSY_MS = range(2)
# si (int scalars)
N_REQ, NEXT_ARRIVAL, N_RUNNING, ITERATIONS, DECODE_TOKENS, N_HELD, LAST_B = range(7)


class State(NamedTuple):
    RF: np.ndarray       # f8[6, capacity]: arrival, key (order in its line), admitted, first token, finish, charged
    RI: np.ndarray       # i8[11, capacity]: tenant, prompt, output, est, klass, line, status, generated,
    #                      preemptions, entered (iteration of the latest entry), prefill tokens this iteration
    TF: np.ndarray       # f8[3, n_tenants]: machine, prefill, decode ms
    TI: np.ndarray       # i8[5, n_tenants]: tokens, admitted, finished, rejected, running
    BT: np.ndarray       # i8[3, max_batch]: running ids, ids that ran in the latest iteration, preempted now
    heap: np.ndarray     # i8[n_lines, capacity]: one binary heap of waiting requests per line
    heap_n: np.ndarray   # i8[n_lines]
    sf: np.ndarray       # f8[2]: now, busy
    si: np.ndarray       # i8[7]: see the indices above


def allocate(capacity: int, n_tenants: int, n_lines: int, max_batch: int) -> State:
    """Empty state for up to `capacity` requests."""
    cap = max(int(capacity), 1)
    RF = np.zeros((6, cap))
    RF[[ADMITTED, FIRST, FINISH]] = np.nan
    return State(RF, np.zeros((11, cap), np.int64), np.zeros((3, n_tenants)), np.zeros((5, n_tenants), np.int64),
                 np.zeros((3, max_batch), np.int64), np.zeros((n_lines, cap), np.int64),
                 np.zeros(n_lines, np.int64), np.zeros(2), np.zeros(7, np.int64))


def grow(state: State, capacity: int) -> State:
    """A copy of `state` with room for `capacity` requests (online use); contents kept."""
    old = state.RF.shape[1]
    if capacity <= old:
        return state
    new = allocate(capacity, state.TF.shape[1], state.heap.shape[0], state.BT.shape[1])
    new.RF[:, :old] = state.RF
    new.RI[:, :old] = state.RI
    new.heap[:, :old] = state.heap
    for name in ("TF", "TI", "BT", "heap_n", "sf", "si"):
        getattr(new, name)[...] = getattr(state, name)
    return new
