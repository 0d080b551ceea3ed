"""What every policy is in the Python layer: validated parameters, how requests are split into
waiting lines, and the arrays its compiled hooks keep their state in.

A policy's compiled hooks (in its own module) all start with ``V = (pf, pi, RF, RI, TI, BT, heap,
heap_n)``: ``pf``/``pi`` are the policy's float/int state arrays, the rest the engine state
(fairlib/sim/state.py: request fields, tenant counts, batch slots, waiting lines):

- ``accept(*V, r, t) -> bool``: at arrival, before ``r`` joins its line (admission control).
- ``select(*V, t) -> line``: the line whose head is admitted next, or -1 for none.
- ``on_admit(*V, r, line, prefill_tokens, E)``: ``r`` was admitted.
- ``on_iteration(*V, B, per_seq, E)``: ``BT[LAST_IDS, :B]`` ran (each one's prefill this iteration:
  ``RI[PRE_TOK]`` holds the prefill tokens of each request's latest admission); those with
  ``RI[GENERATED] >= RI[OUTPUT]`` finished in it (a policy books finishes here: vtc_predict.py).
Hooks a policy does not need are simply absent (fairlib/sim/policies/dispatch.py).
"""
from __future__ import annotations

import numpy as np

__all__ = ["Policy", "check_int", "check_number"]


def check_int(policy: str, name: str, value, low: int = 1) -> int:
    if isinstance(value, bool) or not np.isscalar(value) or not float(value).is_integer() or value < low:
        raise ValueError(f"policy {policy!r}: parameter {name!r} must be an integer >= {low}, got {value!r}")
    return int(value)


def check_number(policy: str, name: str, value, low: float = 0.0, strict: bool = False) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) and np.isfinite(value)
    if not ok or value < low or (strict and value == low):
        rel = ">" if strict else ">="
        raise ValueError(f"policy {policy!r}: parameter {name!r} must be a finite number {rel} {low}, got {value!r}")
    return float(value)


class Policy:
    """Base class: one FIFO line, no state. Subclasses set ``name``, ``pid`` and override."""

    name = "base"
    pid = -1
    params: dict = {}          # name -> default (None = required)
    needs: tuple = ()          # optional request columns the policy reads
    clocked: bool = False      # its accept/select change its state with the clock (token_pool)

    def __init__(self, **params):
        unknown = set(params) - set(self.params)
        if unknown:
            allowed = ", ".join(sorted(self.params)) or "none"
            raise ValueError(f"policy {self.name!r}: unknown parameter(s) {sorted(unknown)}; allowed: {allowed}")
        values = {**self.params, **params}
        missing = [k for k, v in values.items() if v is None and k in self.required]
        if missing:
            raise ValueError(f"policy {self.name!r}: parameter(s) {missing} required")
        self.values = self.validate(values)

    required: tuple = ()

    def validate(self, values: dict) -> dict:
        return values

    def lines(self, rows, tenant, klass, priority, est, n_tenants, n_classes=None, priority_levels=None):
        """(line, key, n_lines): the waiting line of each request and its order inside it.
        `n_classes` and `priority_levels` (a sorted int64 array) are given when requests arrive one
        by one (fairlib/sim/online.py): the classes and priorities that engine accepts. A policy
        keeps nothing of them: one object serves any number of runs."""
        return np.zeros(len(rows), np.int64), np.asarray(rows, np.float64), 1

    def online_lines(self, n_tenants: int, n_classes: int) -> int:
        """How many lines the policy keeps when requests arrive one by one (fairlib/sim/online.py)."""
        return 1

    def state(self, n_tenants: int, n_requests=None):
        """(pf, pi): the float and int arrays the compiled hooks keep their state in, for a run of
        `n_requests` requests (None: requests arrive one by one, fairlib/sim/online.py)."""
        return np.zeros(1), np.zeros(1, np.int64)

    #: the unit of :meth:`counters`: "tokens" (weighted service tokens: vtc, lcf) or "ms" (machine time)
    counter_unit = None

    def counters(self, pf, n_tenants):
        """Per-tenant counters the policy keeps (None if it keeps none), in :attr:`counter_unit`."""
        return None

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.values.items())
        return f"{self.name}({args})"
