"""The fairness gateway in front of simulated replicas: ``PolicyGate`` decides (the gateway's own
core, fairlib/sim/gate.py), ``OnlineEngine`` replicas serve (the engine model, FCFS inside each).

    res = simulate_gateway(requests, Engine(), replicas=2, policy="token_pool", policy_params=p,
                           events=[(120_000, 1, "down"), (240_000, 1, "up")], sample_ms=1000)
    res.requests   # arrival_ms, tenant, ..., rejected, retry_after_ms, dispatched_ms, replica,
                   #   first_token_ms, finish_ms, generated
    res.samples    # t_ms, tenant, machine_ms, waiting, in_flight, rejected, reserved_ms, debt_ms, replicas

What the gateway sees of a replica is what a real one shows: each iteration's emitters, finishes
and duration (``PolicyGate.observe``), the slots it holds. A request goes to the healthy replica
with the most free slots (ties: the first), as fairlib/gateway/core.py dispatches. A replica
``down`` takes no new request; those in it run to their end (a drained node); ``up`` takes requests
again. A pool policy is told the count that takes requests at once (``PolicyGate.set_replicas``).
A sample at ``t`` shows the state before that instant's events.

Event order at one instant: iteration ends (replica order), then replica events, then arrivals
(table order); the gateway fills the open slots after each; once every event of the instant is
in, each idle replica with requests starts its iteration with all of them (as the engine model
delivers every arrival up to an iteration's start).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from fairlib.sim import loop
from fairlib.sim.engine import Engine
from fairlib.sim.gate import PolicyGate, sample_rows
from fairlib.sim.online import OnlineEngine
from fairlib.sim.simulate import request_columns
from fairlib.sim.state import CHARGED

__all__ = ["simulate_gateway", "GatewayRun"]

_ITER, _EVENT, _ARRIVAL = 0, 1, 2


@dataclass
class GatewayRun:
    requests: pd.DataFrame
    samples: pd.DataFrame
    gate: PolicyGate
    end_ms: float


def _events(events, replicas: int):
    out = []
    for i, ev in enumerate(events or ()):
        try:
            t, k, what = ev
        except (TypeError, ValueError):
            raise ValueError(f"events[{i}] must be (t_ms, replica, 'down' | 'up'), got {ev!r}") from None
        if what not in ("down", "up"):
            raise ValueError(f"events[{i}]: the action must be 'down' or 'up', got {what!r}")
        if isinstance(k, bool) or not float(k).is_integer() or not 0 <= k < replicas:
            raise ValueError(f"events[{i}]: replica must lie in 0..{replicas - 1}, got {k!r}")
        if not (isinstance(t, (int, float)) and math.isfinite(t) and t >= 0):
            raise ValueError(f"events[{i}]: t_ms must be a finite number >= 0, got {t!r}")
        out.append((float(t), int(k), what))
    return out


def simulate_gateway(requests, engine: Optional[Engine] = None, replicas: int = 1, policy="fcfs",
                     policy_params: Optional[dict] = None, events: Sequence = (), horizon_ms: Optional[float] = None,
                     n_tenants: Optional[int] = None, sample_ms: Optional[float] = 1000.0,
                     record: bool = False, limiter=None) -> GatewayRun:
    """Run ``requests`` (arrival_ms, tenant, prompt_tokens, output_tokens; est_output_tokens, klass,
    priority optional) through a gateway with ``policy`` in front of ``replicas`` replicas of
    ``engine`` (module docstring). ``horizon_ms``: stop there (None: when everything has ended).
    ``record``: the gate keeps its event log (``res.gate.log``, what a live gateway serves at
    ``/admin/events``). ``limiter``: a rate limit in front of the gate
    (``fairlib.sim.limiters.CountAfterResponse``): an arrival it refuses never reaches the gate
    (rejected, its Retry-After the limiter's); every finish is reported to it."""
    engine = Engine() if engine is None else engine
    if engine.batching != "continuous":
        raise ValueError("simulate_gateway: the replicas must batch continuously (engine.batching='continuous')")
    if engine.max_prefill_tokens is not None or engine.kv_capacity_tokens is not None:
        raise ValueError("simulate_gateway: the replicas' engine must have no max_prefill_tokens and no "
                         "kv_capacity_tokens (the gateway sees no engine-side refusal or preemption)")
    if sample_ms is not None and not (isinstance(sample_ms, (int, float)) and math.isfinite(sample_ms)
                                      and sample_ms > 0):
        raise ValueError(f"sample_ms must be a number > 0 (or None: no samples), got {sample_ms!r}")
    if isinstance(replicas, bool) or not float(replicas).is_integer() or replicas < 1:
        raise ValueError(f"replicas must be an integer >= 1, got {replicas!r}")
    replicas = int(replicas)
    cols, n_t = request_columns(requests, n_tenants)
    n = len(cols["arrival_ms"])
    est = cols.get("est_output_tokens", cols["output_tokens"])
    klass = cols.get("klass", np.zeros(n, np.int64))
    prio = cols.get("priority", np.zeros(n, np.int64))
    n_classes = int(klass.max()) + 1 if n else 1
    horizon = math.inf if horizon_ms is None else float(horizon_ms)
    gate = PolicyGate(policy, n_tenants=n_t, slots=engine.max_batch * replicas,
                      prefill_ms_per_token=engine.prefill_ms_per_token, n_classes=max(n_classes, 4),
                      capacity=max(n, 1), record=record, **(policy_params or {}))
    missing = [c for c in gate.policy.needs if c not in cols and not (c == "priority" and "klass" in cols)]
    if missing:
        raise ValueError(f"policy {gate.policy.name!r} needs the requests column(s) {missing}")
    reps = [OnlineEngine(engine, "fcfs", n_tenants=n_t, capacity=64) for _ in range(replicas)]
    healthy = [True] * replicas
    busy = [False] * replicas
    inflight = [0] * replicas
    back = [dict() for _ in range(replicas)]       # replica's request id -> gate id
    rejected = np.zeros(n, bool)
    retry = np.full(n, np.nan)
    dispatched = np.full(n, np.nan)
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    generated = np.zeros(n, np.int64)
    where = np.full(n, -1, np.int64)
    gid = np.full(n, -1, np.int64)                  # table row -> gate id
    row_of = {}

    to_start: set = set()          # replicas to start once every event of this instant is in
    q: list = []
    for i, (t, k, what) in enumerate(_events(events, replicas)):
        heapq.heappush(q, (t, _EVENT, i, (k, what)))
    for i in range(n):
        heapq.heappush(q, (float(cols["arrival_ms"][i]), _ARRIVAL, i, None))

    def start(k: int, t: float) -> None:
        eng = reps[k]
        eng.advance(t)
        it = eng.step()
        if it.code == loop.RAN:
            busy[k] = True
            heapq.heappush(q, (it.end_ms, _ITER, k, it))
        else:
            busy[k] = False

    def pump(t: float) -> None:
        open_slots = sum(engine.max_batch if healthy[k] else inflight[k] for k in range(replicas))
        for rid in gate.admit(t, open_slots):
            best = -1
            for k in range(replicas):
                if healthy[k] and inflight[k] < engine.max_batch and (best < 0 or inflight[k] < inflight[best]):
                    best = k
            if best < 0:                # cannot happen: open_slots counts only what can be taken
                gate.withdraw(rid, t)
                continue
            i = row_of[rid]
            e_rid = reps[best].submit(int(cols["tenant"][i]), int(cols["prompt_tokens"][i]),
                                      int(cols["output_tokens"][i]), t)
            back[best][e_rid] = rid
            inflight[best] += 1
            dispatched[i], where[i] = t, best
            to_start.add(best)

    sample_rows_: list = []
    next_sample = 0.0 if sample_ms else math.inf
    rej_count = np.zeros(n_t, np.int64)

    def sample(t_s: float) -> None:
        sample_rows_.extend(sample_rows(gate, t_s, rej_count, sum(healthy)))

    end = 0.0
    while q:
        t, kind, idx, data = q[0]
        if t > horizon:
            break
        heapq.heappop(q)
        while next_sample <= t:
            sample(next_sample)
            next_sample += sample_ms
        end = t
        if kind == _ITER:
            k, it = idx, data
            busy[k] = False
            ids = [back[k][int(r)] for r in it.ran]
            fin = set(int(r) for r in it.finished)
            gate.observe(ids, [1] * len(ids), [int(r) in fin for r in it.ran], it.end_ms - it.start_ms, it.end_ms)
            for r in it.first:
                first[row_of[back[k][int(r)]]] = it.end_ms
            for r in it.ran:
                generated[row_of[back[k][int(r)]]] += 1
            for r in fin:
                i_f = row_of[back[k].pop(r)]
                finish[i_f] = it.end_ms
                if limiter is not None:
                    limiter.finished(int(cols["tenant"][i_f]), int(cols["prompt_tokens"][i_f]),
                                     int(generated[i_f]), it.end_ms)
            inflight[k] -= len(fin)
            to_start.add(k)
            pump(t)
        elif kind == _EVENT:
            k, what = data
            healthy[k] = what == "up"
            gate.set_replicas(sum(healthy), t)
            pump(t)
        else:
            i = idx
            tn = int(cols["tenant"][i])
            if limiter is not None and not limiter.allow(tn, t):     # refused in front of the gate
                rejected[i] = True
                rej_count[tn] += 1
                retry[i] = limiter.retry_after_ms(tn, t)
            else:
                rid, ok = gate.arrive(tn, int(cols["prompt_tokens"][i]), t, int(est[i]), int(klass[i]), int(prio[i]))
                gid[i] = rid
                row_of[rid] = i
                if not ok:
                    rejected[i] = True
                    rej_count[tn] += 1
                    ra = gate.retry_after_s(tn, t)
                    retry[i] = np.nan if ra is None else ra * 1e3
                else:
                    pump(t)
        if not q or q[0][0] > t:
            for k in sorted(to_start):
                if not busy[k] and reps[k].has_work():
                    start(k, t)
            to_start.clear()
    if sample_ms and math.isfinite(horizon):
        while next_sample <= horizon:
            sample(next_sample)
            next_sample += sample_ms
    out = pd.DataFrame({c: cols[c] for c in cols})
    out = out.assign(rejected=rejected, retry_after_ms=retry, dispatched_ms=dispatched, replica=where,
                     first_token_ms=first, finish_ms=finish, generated=generated)
    out["charged_ms"] = [float(gate.S.RF[CHARGED, r]) if r >= 0 else 0.0 for r in gid]
    return GatewayRun(out, pd.DataFrame(sample_rows_), gate, end)
