"""The simulator's policies deciding for a real engine: ``PolicyGate``, the core of the gateway.

A gateway holds the waiting lines and lets a request into the engine only when a slot is free, so
the policy, not the engine's queue, decides who enters the batch. ``PolicyGate`` keeps the engine
model's state (fairlib/sim/state.py) and drives it with the events a gateway sees, through the
compiled entry points of fairlib/sim/observed.py: the same ``accept``/``select``/``on_admit``/
``on_iteration`` hooks, the same lines and the same charges as ``simulate``, with each iteration's
duration and emitters observed on the streams instead of computed.

    gate = PolicyGate("vtc", n_tenants=2, slots=16)
    rid, ok = gate.arrive(tenant=0, prompt_tokens=387, t_ms=0.0)       # at arrival: accept or reject
    for rid in gate.admit(t_ms=0.0):                                    # who enters the free slots
        ...dispatch rid upstream...
    gate.observe([rid], [1], [False], dt_ms=12.0, t_ms=12.0)           # a decode step on the streams
    gate.withdraw(rid, t_ms)                                           # cancelled / failed / timed out
    gate.set_replicas(1, t_ms)                                         # a pool policy: a replica lost

Charges (the engine model's step 5, measured): at admission ``prefill_ms_per_token * prompt`` (the
fitted price; 0 splits prefill time equally over the step instead), per observed step ``per_seq =
max(0, dt - prefill_ms_per_token * P) / n`` to each of its ``n`` emitters. The policy's counters
move exactly as in the simulator for the same sequence of events.

``log``: every call with its inputs and outcome (``record=True``), which ``replay`` feeds to a
fresh gate: the same admissions, rejections and counters (the gateway's replay test).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from fairlib.sim import observed
from fairlib.sim.online import append_request
from fairlib.sim.policies import make_policy
from fairlib.sim import state
from fairlib.sim.state import allocate

__all__ = ["PolicyGate", "UNKNOWN_OUTPUT", "replay", "replay_samples", "sample_rows"]

#: RI[OUTPUT] of a request in flight: the gateway does not know its length until it finishes
UNKNOWN_OUTPUT = 1 << 40


def _check_time(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number of milliseconds, got {v!r}")
    return float(v)


class PolicyGate:
    def __init__(self, policy="fcfs", n_tenants: int = 1, slots: int = 16, prefill_ms_per_token: float = 0.0,
                 n_classes: int = 4, priority_levels=range(-32, 33), capacity: int = 1024, record: bool = False,
                 **policy_params):
        """``slots``: the most requests ever in flight at once (the upstreams' slots together; the
        slots open now are given to each :meth:`admit`). ``prefill_ms_per_token``: the engine's
        fitted prefill price, charged at admission (the residency counter's prefill part)."""
        self.policy = make_policy(policy, **policy_params)
        for name, v, low in (("n_tenants", n_tenants, 1), ("slots", slots, 1), ("n_classes", n_classes, 1)):
            if isinstance(v, bool) or not float(v).is_integer() or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
        self.n_tenants, self.slots, self.n_classes = int(n_tenants), int(slots), int(n_classes)
        pm = prefill_ms_per_token
        if isinstance(pm, bool) or not isinstance(pm, (int, float)) or not math.isfinite(pm) or pm < 0:
            raise ValueError(f"prefill_ms_per_token must be a finite number >= 0, got {pm!r}")
        self.prefill_ms_per_token = float(pm)
        self.priority_levels = np.unique(np.asarray(list(priority_levels), np.int64))
        n_lines = self.policy.online_lines(self.n_tenants, self.n_classes)
        self.S = allocate(capacity, self.n_tenants, n_lines, self.slots)
        self.pf, self.pi = self.policy.state(self.n_tenants)
        # E as the engine loop reads it: no iteration cost (measured), the fitted prefill price,
        # E[3] set to the open slots at each admission, no prefill or KV limit (the engine's own)
        self.E = np.array([0.0, 0.0, self.prefill_ms_per_token, float(self.slots), np.inf, np.inf, 0.0, 0.0])
        self._saved = np.zeros(self.n_tenants, np.int64)
        self.record = bool(record)
        self.log: list = []
        self.spec = {"policy": self.policy.name, "params": dict(policy_params), "n_tenants": self.n_tenants,
                     "slots": self.slots, "prefill_ms_per_token": self.prefill_ms_per_token,
                     "n_classes": self.n_classes, "priority_levels": [int(x) for x in self.priority_levels]}

    # --- events ---------------------------------------------------------------------------------
    def arrive(self, tenant: int, prompt_tokens: int, t_ms: float, est_output_tokens: Optional[int] = None,
               klass: int = 0, priority: int = 0, arrival_ms: Optional[float] = None) -> tuple:
        """A request is handed to the policy at ``t_ms`` (its arrival ``arrival_ms``, default the
        same: a gateway delivers at once; an engine loop at its next iteration): ``(id,
        accepted)``; a rejected one (the policy's admission control, e.g. rpm_quota) never runs."""
        t = _check_time("t_ms", t_ms)
        a = t if arrival_ms is None else _check_time("arrival_ms", arrival_ms)
        if a > t:
            raise ValueError(f"arrival_ms ({a}) must not lie after t_ms ({t})")
        est = int(est_output_tokens) if est_output_tokens is not None else UNKNOWN_OUTPUT
        self.S, rid = append_request(self.S, self.policy, self.n_tenants, self.n_classes, self.priority_levels,
                                     tenant, prompt_tokens, UNKNOWN_OUTPUT, a, est, klass, priority)
        observed.arrive(self.S, self.E, self.policy.pid, self.pf, self.pi, t)
        ok = bool(self.S.RI[state.STATUS, rid] != state.REJECTED)
        if self.record:
            self.log.append(["arrive", t, int(tenant), int(prompt_tokens),
                             None if est_output_tokens is None else int(est_output_tokens), int(klass), int(priority),
                             rid, ok, a])
        return rid, ok

    def admit(self, t_ms: float, open_slots: Optional[int] = None) -> list:
        """The requests that enter now, in the policy's order, while fewer than ``open_slots``
        (default ``slots``) are in flight."""
        t = _check_time("t_ms", t_ms)
        cap = self.slots if open_slots is None else int(open_slots)
        if cap < 0:
            raise ValueError(f"open_slots must be >= 0, got {open_slots!r}")
        self.E[3] = float(min(cap, self.slots))
        before = int(self.S.si[state.N_RUNNING])
        k = observed.admit(self.S, self.E, self.policy.pid, self.pf, self.pi, t)
        ids = [int(x) for x in self.S.BT[state.RUN_IDS, before:before + k]]
        if self.record and (ids or getattr(self.policy, "clocked", False)):
            self.log.append(["admit", t, cap, ids])    # a clocked policy's select moves its state
        return ids

    def set_replicas(self, replicas: int, t_ms: float) -> None:
        """The pool's capacity becomes ``replicas`` replicas at ``t_ms`` (a policy with
        ``apply_replicas``, token_pool; others ignore it, and only log it): its debts are brought
        to ``t_ms`` at the old capacity first."""
        t = _check_time("t_ms", t_ms)
        if self.record:          # every policy's log: when capacity changed is part of the run
            self.log.append(["replicas", t, int(replicas)])
        fn = getattr(self.policy, "apply_replicas", None)
        if fn is None:
            return
        observed.clock(self.S, self.policy.pid, self.pf, self.pi, t)
        fn(self.pf, replicas)

    def observe(self, ids: Sequence[int], tokens: Sequence[int], finished: Sequence[bool], dt_ms: float,
                t_ms: float, check: bool = True) -> float:
        """One decode step seen on the streams: ``ids`` emitted ``tokens`` (>= 1 each) in ``dt_ms``
        ending at ``t_ms``; ``finished``: whose stream ended with it. Returns ``per_seq`` (ms).
        ``check=False`` skips validating the step's shape (a caller whose steps are well formed by
        construction, the gateway's step tracker; its tests run it with the check on); ids not in
        flight are refused either way."""
        if check:
            t = _check_time("t_ms", t_ms)
            dt = _check_time("dt_ms", dt_ms)
            if dt < 0:
                raise ValueError(f"dt_ms must be >= 0, got {dt_ms!r}")
            a = np.asarray(ids, np.int64)
            k = np.asarray(tokens, np.int64)
            f = np.asarray(finished, np.int64)
            if not (a.shape == k.shape == f.shape) or a.ndim != 1:
                raise ValueError("observe: ids, tokens and finished must be 1-D and of one length")
            if a.size and (k.min() < 1 or (a.size > 1 and np.unique(a).size != a.size)):
                raise ValueError("observe: every emitter brings >= 1 token and appears once")
        else:
            t, dt = float(t_ms), float(dt_ms)
            a, k, f = np.array(ids, np.int64), np.array(tokens, np.int64), np.array(finished, np.int64)
        per_seq = float(observed.observe(self.S, self.E, self.policy.pid, self.pf, self.pi, a, k, f,
                                         int(a.size), dt, t, self._saved))
        if per_seq < 0:
            running = set(self.running_ids())
            raise ValueError(f"observe: ids not in flight: {sorted(set(a.tolist()) - running)}")
        if self.record:
            self.log.append(["step", t, dt, a.tolist(), k.tolist(), [bool(x) for x in f]])
        return per_seq

    def withdraw(self, rid: int, t_ms: float) -> str:
        """A request leaves outside a step: ``"waiting"`` / ``"in_flight"`` (where it was) or
        ``"gone"`` (it had already finished, been rejected or withdrawn)."""
        t = _check_time("t_ms", t_ms)
        if not 0 <= rid < self.n_requests:
            raise ValueError(f"withdraw: no request {rid!r}")
        where = {1: "waiting", 2: "in_flight"}.get(int(observed.withdraw(self.S, self.policy.pid, self.pf, self.pi, int(rid), t)), "gone")
        if self.record and where != "gone":
            self.log.append(["withdraw", t, int(rid)])
        return where

    # --- state ----------------------------------------------------------------------------------
    @property
    def n_requests(self) -> int:
        return int(self.S.si[state.N_REQ])

    @property
    def in_flight(self) -> int:
        return int(self.S.si[state.N_RUNNING])

    @property
    def waiting(self) -> int:
        return int(self.S.heap_n.sum())

    def running_ids(self) -> list:
        return [int(x) for x in self.S.BT[state.RUN_IDS, :self.S.si[state.N_RUNNING]]]

    def waiting_of(self) -> np.ndarray:
        """Requests waiting, per tenant."""
        n = self.n_requests
        RI = self.S.RI
        w = RI[state.STATUS, :n] == state.WAITING
        return np.bincount(RI[state.TENANT, :n][w], minlength=self.n_tenants)

    def counters(self) -> Optional[np.ndarray]:
        """The policy's per-tenant counters (None for a policy without)."""
        return self.policy.counters(self.pf, self.n_tenants)

    def tenant_state(self) -> dict:
        """Per tenant (arrays): machine / prefill / decode ms charged, tokens, admitted, finished,
        rejected, in flight, waiting; the policy's counters when it keeps them."""
        S = self.S
        out = {"machine_ms": S.TF[state.T_MACHINE].copy(), "prefill_ms": S.TF[state.T_PREFILL].copy(),
               "decode_ms": S.TF[state.T_DECODE].copy(), "output_tokens": S.TI[state.T_TOKENS].copy(),
               "admitted": S.TI[state.T_ADMITTED].copy(), "finished": S.TI[state.T_FINISHED].copy(),
               "rejected": S.TI[state.T_REJECTED].copy(), "in_flight": S.TI[state.T_RUNNING].copy(),
               "waiting": self.waiting_of()}
        c = self.counters()
        if c is not None:
            out["counter"] = c
        return out

    def request(self, rid: int) -> dict:
        RF, RI = self.S.RF, self.S.RI
        return {"tenant": int(RI[state.TENANT, rid]), "status": int(RI[state.STATUS, rid]),
                "prompt_tokens": int(RI[state.PROMPT, rid]),
                "generated": int(RI[state.GENERATED, rid]), "admitted_ms": float(RF[state.ADMITTED, rid]),
                "first_token_ms": float(RF[state.FIRST, rid]), "charged_ms": float(RF[state.CHARGED, rid])}

    def set_slots(self, per_replica: int, t_ms: float) -> None:
        """Each replica takes ``per_replica`` requests from ``t_ms`` on (the gateway's in-flight
        credit moved: fairlib/sim/credit.py): a policy with ``apply_slots`` (token_pool: its
        ``replica_slots``) follows; the others ignore it (the open slots come with each admit)."""
        t = _check_time("t_ms", t_ms)
        n = int(per_replica)
        if n < 1:
            raise ValueError(f"per_replica must be an integer >= 1, got {per_replica!r}")
        if self.record:
            self.log.append(["slots", t, n])
        fn = getattr(self.policy, "apply_slots", None)
        if fn is not None:
            fn(self.pf, n)

    def retry_after_s(self, tenant: int, t_ms: float) -> Optional[float]:
        """When a request of ``tenant`` rejected at ``t_ms`` could be accepted (the policy's own
        answer; None if it has none)."""
        fn = getattr(self.policy, "retry_after_ms", None)
        if fn is None:
            return None
        ms = fn(self.pf, self.pi, self.n_tenants, int(tenant), float(t_ms))
        return None if ms is None else max(0.0, ms) / 1e3


def _gate_of(spec: dict) -> PolicyGate:
    s = dict(spec)
    return PolicyGate(s["policy"], n_tenants=s["n_tenants"], slots=s["slots"],
                      prefill_ms_per_token=s["prefill_ms_per_token"], n_classes=s["n_classes"],
                      priority_levels=s["priority_levels"], record=True, **s["params"])


def _feed(gate: PolicyGate, i: int, ev) -> None:
    kind = ev[0]
    if kind == "arrive":
        _, t, tenant, prompt, est, klass, prio, rid, ok, a = ev
        got = gate.arrive(tenant, prompt, t, est, klass, prio, arrival_ms=a)
        if got != (rid, ok):
            raise ValueError(f"replay: event {i} ({kind}) gave {got}, the log says {(rid, ok)}")
    elif kind == "admit":
        _, t, cap, ids = ev
        admitted = gate.admit(t, cap)
        if admitted != list(ids):
            raise ValueError(f"replay: event {i} (admit at {t} ms) admitted {admitted}, the log says {list(ids)}")
    elif kind == "step":
        _, t, dt, ids, toks, fin = ev
        gate.observe(ids, toks, fin, dt, t)
    elif kind == "withdraw":
        gate.withdraw(ev[2], ev[1])
    elif kind == "replicas":
        gate.set_replicas(ev[2], ev[1])
    elif kind == "slots":
        gate.set_slots(ev[2], ev[1])
    else:
        raise ValueError(f"replay: event {i} has an unknown kind {kind!r}")


def replay(spec: dict, log: Sequence) -> PolicyGate:
    """A fresh gate (``spec``: a gate's ``spec``) fed ``log``'s events; ``ValueError`` naming the
    first event whose outcome differs from the one recorded (id, acceptance, admitted ids)."""
    gate = _gate_of(spec)
    for i, ev in enumerate(log):
        _feed(gate, i, ev)
    return gate


def sample_rows(gate: PolicyGate, t_ms: float, rejected, replicas: int) -> list:
    """One row per tenant of the gate's state at ``t_ms``: machine ms charged, output tokens,
    waiting, in flight, ``rejected`` (the caller's count), ``replicas``; a pool policy's
    ``reserved_ms`` and ``debt_ms`` brought to ``t_ms`` (its ``pool_state``)."""
    ts = gate.tenant_state()
    n = gate.n_tenants
    fn = getattr(gate.policy, "pool_state", None)
    ps = fn(gate.pf, n, t_ms, ts["waiting"]) if fn is not None else None
    rows = []
    for j in range(n):
        row = {"t_ms": t_ms, "tenant": j, "machine_ms": float(ts["machine_ms"][j]),
               "output_tokens": int(ts["output_tokens"][j]), "waiting": int(ts["waiting"][j]),
               "in_flight": int(ts["in_flight"][j]), "rejected": int(rejected[j]), "replicas": int(replicas)}
        if ps is not None:
            row.update(reserved_ms=float(ps["reserved_ms"][j]), debt_ms=float(ps["debt_ms"][j]))
        rows.append(row)
    return rows


def replay_samples(spec: dict, log: Sequence, sample_ms: float, start_ms: float = 0.0,
                   end_ms: Optional[float] = None, replicas: Optional[int] = None):
    """A recorded log replayed (as :func:`replay`, checked event by event) and sampled every
    ``sample_ms`` from ``start_ms`` to ``end_ms`` (default: the last event): the rows of
    :func:`sample_rows`, the state before each sample instant's events (as
    ``fairlib.sim.cluster.simulate_gateway`` samples), with the requests rejected so far and the
    replicas taking requests (``replicas``, default the spec's ``replicas`` parameter or 1; then
    each ``replicas`` event). Returns ``(gate, samples)``. A gateway logs a decode step when it
    closes, stamped when it began, so a live log's samples are its state to within one step."""
    for name, v in (("sample_ms", sample_ms), ("start_ms", start_ms), ("end_ms", 0.0 if end_ms is None else end_ms)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                or (name == "sample_ms" and v == 0):
            raise ValueError(f"{name} must be a finite number {'> 0' if name == 'sample_ms' else '>= 0'}, got {v!r}")
    gate = _gate_of(spec)
    rejected = np.zeros(gate.n_tenants, np.int64)
    replicas = int(replicas if replicas is not None else dict(spec["params"]).get("replicas", 1))
    end = float(end_ms) if end_ms is not None else (float(log[-1][1]) if len(log) else float(start_ms))
    rows: list = []
    k = 0                                   # sample k at start + k sample_ms (no accumulated error)

    def at(j):
        return float(start_ms) + j * float(sample_ms)
    end += 1e-9 * float(sample_ms)          # an instant at the end, whatever its last bit
    for i, ev in enumerate(log):
        while at(k) <= min(float(ev[1]), end):
            rows += sample_rows(gate, at(k), rejected, replicas)
            k += 1
        _feed(gate, i, ev)
        if ev[0] == "arrive" and not ev[8]:
            rejected[ev[2]] += 1
        elif ev[0] == "replicas":
            replicas = int(ev[2])
    while at(k) <= end:
        rows += sample_rows(gate, at(k), rejected, replicas)
        k += 1
    return gate, pd.DataFrame(rows)
