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
from fairlib.sim import state

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
    klass = cols.get("klass", np.zeros(n, np.int64))
    n_classes = int(klass.max()) + 1 if n else 1
    horizon = math.inf if horizon_ms is None else float(horizon_ms)
    gate = PolicyGate(policy, n_tenants=n_t, slots=engine.max_batch * replicas,
                      prefill_ms_per_token=engine.prefill_ms_per_token, n_classes=max(n_classes, 4),
                      capacity=max(n, 1), record=record, **(policy_params or {}))
    missing = [c for c in gate.policy.needs if c not in cols and not (c == "priority" and "klass" in cols)]
    if missing:
        raise ValueError(f"policy {gate.policy.name!r} needs the requests column(s) {missing}")
    c = _Cluster(cols, n_t, engine, replicas, gate, limiter)
    q = c.q
    for i, (t, k, what) in enumerate(_events(events, replicas)):
        heapq.heappush(q, (t, _EVENT, i, (k, what)))
    for i in range(n):
        heapq.heappush(q, (float(cols["arrival_ms"][i]), _ARRIVAL, i, None))
    samples: list = []
    next_sample = 0.0 if sample_ms else math.inf
    step_ms = float(sample_ms or math.inf)
    end = 0.0
    while q:
        t, kind, idx, data = q[0]
        if t > horizon:
            break
        heapq.heappop(q)
        while next_sample <= t:
            samples.extend(sample_rows(gate, next_sample, c.rej_count, sum(c.healthy)))
            next_sample += step_ms
        end = t
        if kind == _ITER:
            c.on_iteration(idx, data, t)
        elif kind == _EVENT:
            k, what = data
            c.on_event(k, what, t)
        else:
            c.on_arrival(idx, t)
        if not q or q[0][0] > t:
            c.start_idle(t)
    if sample_ms and math.isfinite(horizon):
        while next_sample <= horizon:
            samples.extend(sample_rows(gate, next_sample, c.rej_count, sum(c.healthy)))
            next_sample += sample_ms
    return GatewayRun(c.table(), pd.DataFrame(samples), gate, end)


class _Cluster:
    """:func:`simulate_gateway`'s state: the gate, the replicas (health, iteration running, requests
    held, their ids), the event queue and each request's row of the result."""

    def __init__(self, cols: dict, n_t: int, engine: Engine, replicas: int, gate: PolicyGate, limiter):
        n = len(cols["arrival_ms"])
        self.cols, self.engine, self.gate, self.limiter = cols, engine, gate, limiter
        self.est = cols.get("est_output_tokens", cols["output_tokens"])
        self.klass = cols.get("klass", np.zeros(n, np.int64))
        self.prio = cols.get("priority", np.zeros(n, np.int64))
        self.reps = [OnlineEngine(engine, "fcfs", n_tenants=n_t, capacity=64) for _ in range(replicas)]
        self.healthy = [True] * replicas
        self.busy = [False] * replicas
        self.inflight = [0] * replicas
        self.back: list = [dict() for _ in range(replicas)]   # replica's request id -> gate id
        self.rejected = np.zeros(n, bool)
        self.retry = np.full(n, np.nan)
        self.dispatched = np.full(n, np.nan)
        self.first = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.generated = np.zeros(n, np.int64)
        self.where = np.full(n, -1, np.int64)
        self.gid = np.full(n, -1, np.int64)                  # table row -> gate id
        self.row_of: dict = {}
        self.to_start: set = set()          # replicas to start once every event of this instant is in
        self.q: list = []
        self.rej_count = np.zeros(n_t, np.int64)

    def start(self, k: int, t: float) -> None:
        """Replica ``k`` starts an iteration at ``t`` (its end queued) when it has work."""
        eng = self.reps[k]
        eng.advance(t)
        it = eng.step()
        if it.code == loop.RAN:
            self.busy[k] = True
            heapq.heappush(self.q, (it.end_ms, _ITER, k, it))
        else:
            self.busy[k] = False

    def start_idle(self, t: float) -> None:
        """Once every event of instant ``t`` is in: each idle replica with requests starts."""
        for k in sorted(self.to_start):
            if not self.busy[k] and self.reps[k].has_work():
                self.start(k, t)
        self.to_start.clear()

    def pump(self, t: float) -> None:
        """The gate fills the open slots; each admitted request goes to the healthy replica holding
        the fewest (ties: the first)."""
        engine, reps, inflight, healthy = self.engine, self.reps, self.inflight, self.healthy
        open_slots = sum(engine.max_batch if healthy[k] else inflight[k] for k in range(len(reps)))
        for rid in self.gate.admit(t, open_slots):
            best = -1
            for k in range(len(reps)):
                if healthy[k] and inflight[k] < engine.max_batch and (best < 0 or inflight[k] < inflight[best]):
                    best = k
            if best < 0:                # cannot happen: open_slots counts only what can be taken
                self.gate.withdraw(rid, t)
                continue
            i = self.row_of[rid]
            e_rid = reps[best].submit(int(self.cols["tenant"][i]), int(self.cols["prompt_tokens"][i]),
                                      int(self.cols["output_tokens"][i]), t)
            self.back[best][e_rid] = rid
            inflight[best] += 1
            self.dispatched[i], self.where[i] = t, best
            self.to_start.add(best)

    def on_iteration(self, k: int, it, t: float) -> None:
        """Replica ``k``'s iteration ``it`` ended: the gate observes it, first tokens, tokens and
        finishes are recorded (each finish reported to the limiter)."""
        back, row_of, cols = self.back[k], self.row_of, self.cols
        self.busy[k] = False
        ids = [back[int(r)] for r in it.ran]
        fin = set(int(r) for r in it.finished)
        self.gate.observe(ids, [1] * len(ids), [int(r) in fin for r in it.ran], it.end_ms - it.start_ms, it.end_ms)
        for r in it.first:
            self.first[row_of[back[int(r)]]] = it.end_ms
        for r in it.ran:
            self.generated[row_of[back[int(r)]]] += 1
        for r in fin:
            i_f = row_of[back.pop(r)]
            self.finish[i_f] = it.end_ms
            if self.limiter is not None:
                self.limiter.finished(int(cols["tenant"][i_f]), int(cols["prompt_tokens"][i_f]),
                                      int(self.generated[i_f]), it.end_ms)
        self.inflight[k] -= len(fin)
        self.to_start.add(k)
        self.pump(t)

    def on_event(self, k: int, what: str, t: float) -> None:
        """Replica ``k`` goes ``"down"`` (takes no new request) or ``"up"``."""
        self.healthy[k] = what == "up"
        self.gate.set_replicas(sum(self.healthy), t)
        self.pump(t)

    def on_arrival(self, i: int, t: float) -> None:
        """Request ``i`` arrives: refused by the limiter or the gate (its Retry-After kept), or queued."""
        tn = int(self.cols["tenant"][i])
        if self.limiter is not None and not self.limiter.allow(tn, t):     # refused in front of the gate
            self.rejected[i] = True
            self.rej_count[tn] += 1
            self.retry[i] = self.limiter.retry_after_ms(tn, t)
            return
        rid, ok = self.gate.arrive(tn, int(self.cols["prompt_tokens"][i]), t, int(self.est[i]), int(self.klass[i]),
                                   int(self.prio[i]))
        self.gid[i] = rid
        self.row_of[rid] = i
        if not ok:
            self.rejected[i] = True
            self.rej_count[tn] += 1
            ra = self.gate.retry_after_s(tn, t)
            self.retry[i] = np.nan if ra is None else ra * 1e3
        else:
            self.pump(t)

    def table(self) -> pd.DataFrame:
        """The requests with what happened to each, and the machine time the gate charged it."""
        out = pd.DataFrame({c: self.cols[c] for c in self.cols})
        out = out.assign(rejected=self.rejected, retry_after_ms=self.retry, dispatched_ms=self.dispatched,
                         replica=self.where, first_token_ms=self.first, finish_ms=self.finish,
                         generated=self.generated)
        out["charged_ms"] = [float(self.gate.S.RF[state.CHARGED, r]) if r >= 0 else 0.0 for r in self.gid]
        return out
