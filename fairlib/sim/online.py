"""The engine model run one iteration at a time, with requests submitted as they arrive.

This is the same compiled `step` that `simulate` drives (fairlib/sim/loop.py); a real-time
server (fairlib serve) calls it, sleeps until the iteration's end, then emits the tokens.

    eng = OnlineEngine(Engine(), "vtc", n_tenants=2)
    rid = eng.submit(tenant=0, prompt_tokens=100, output_tokens=20, arrival_ms=0.0)
    it = eng.step()       # Iteration(code, start_ms, end_ms, ran, first, finished, rejected)
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import numpy as np

from fairlib.sim import loop
from fairlib.sim.engine import Engine
from fairlib.sim.policies import make_policy
from fairlib.sim import state
from fairlib.sim.state import allocate, grow

__all__ = ["OnlineEngine", "Iteration", "append_request"]


class Iteration(NamedTuple):
    """What one `step` did: `code` is loop.RAN, loop.IDLE_JUMP or loop.ENDED; `ran` emitted one
    token each at `end_ms`; `first` got their first token, `finished` their last; `rejected`
    were turned away at delivery."""
    code: int
    start_ms: float
    end_ms: float
    ran: np.ndarray
    first: np.ndarray
    finished: np.ndarray
    rejected: np.ndarray


class OnlineEngine:
    def __init__(self, engine: Optional[Engine] = None, policy="fcfs", n_tenants: int = 1, n_classes: int = 4,
                 priority_levels=range(-32, 33), capacity: int = 1024, **policy_params):
        """`n_classes`, `priority_levels`: the classes (0..n_classes-1) and priorities submissions may
        use; the policies that read them (aging, priority) refuse others. The policy object is not
        changed: it can serve `simulate` and other engines as well."""
        self.engine = Engine() if engine is None else engine
        self.policy = make_policy(policy, **policy_params)
        if isinstance(n_tenants, bool) or not float(n_tenants).is_integer() or n_tenants < 1:
            raise ValueError(f"n_tenants must be an integer >= 1, got {n_tenants!r}")
        self.n_tenants = int(n_tenants)
        if isinstance(n_classes, bool) or not float(n_classes).is_integer() or n_classes < 1:
            raise ValueError(f"n_classes must be an integer >= 1, got {n_classes!r}")
        self.n_classes = int(n_classes)
        self.priority_levels = np.unique(np.asarray(list(priority_levels), np.int64))
        if not len(self.priority_levels):
            raise ValueError("priority_levels must name at least one priority")
        n_lines = self.policy.online_lines(self.n_tenants, self.n_classes)
        self.S = allocate(capacity, self.n_tenants, n_lines, self.engine.max_batch)
        self.pf, self.pi = self.policy.state(self.n_tenants)
        self.E = self.engine.kernel_params()

    @property
    def now_ms(self) -> float:
        return float(self.S.sf[state.T_NOW])

    @property
    def n_requests(self) -> int:
        return int(self.S.si[state.N_REQ])

    @property
    def running(self) -> int:
        return int(self.S.si[state.N_RUNNING])

    def has_work(self) -> bool:
        """Something runs or waits, or an arrival is not yet delivered."""
        si = self.S.si
        return self.running > 0 or si[state.NEXT_ARRIVAL] < si[state.N_REQ] or bool(self.S.heap_n.sum() > 0)

    def submit(self, tenant: int, prompt_tokens: int, output_tokens: int, arrival_ms: Optional[float] = None,
               est_output_tokens: Optional[int] = None, klass: int = 0, priority: int = 0) -> int:
        """Add one request; returns its id. Arrival defaults to the clock and never goes backwards."""
        self.S, rid = append_request(self.S, self.policy, self.n_tenants, self.n_classes, self.priority_levels,
                                     tenant, prompt_tokens, output_tokens,
                                     self.now_ms if arrival_ms is None else arrival_ms,
                                     est_output_tokens, klass, priority)
        return rid

    def advance(self, t_ms: float) -> None:
        """Move an idle engine's clock forward to `t_ms` (the wall clock of a real-time server)."""
        if self.running == 0 and t_ms > self.now_ms:
            self.S.sf[state.T_NOW] = t_ms

    def step(self) -> Iteration:
        """One iteration of the engine model at the current clock."""
        start = self.now_ms
        delivered_from = int(self.S.si[state.NEXT_ARRIVAL])
        code = loop.step_once(self.S, self.E, self.policy.pid, self.pf, self.pi)
        RI, RF = self.S.RI, self.S.RF
        upto = int(self.S.si[state.NEXT_ARRIVAL])
        new = np.arange(delivered_from, upto)
        rejected = new[RI[state.STATUS, new] == state.REJECTED]
        if code != loop.RAN:
            empty = np.zeros(0, np.int64)
            return Iteration(code, start, self.now_ms, empty, empty, empty, rejected)
        ran = self.S.BT[state.LAST_IDS, :self.S.si[state.LAST_B]].copy()
        end = self.now_ms
        first = ran[RI[state.GENERATED, ran] == 1]
        finished = ran[RF[state.FINISH, ran] == end]
        return Iteration(code, start, end, ran, first, finished, rejected)

    def request(self, rid: int) -> dict:
        """One request's state and outcome so far."""
        RF, RI = self.S.RF, self.S.RI
        return {"tenant": int(RI[state.TENANT, rid]), "status": int(RI[state.STATUS, rid]),
                "generated": int(RI[state.GENERATED, rid]),
                "admitted_ms": float(RF[state.ADMITTED, rid]), "first_token_ms": float(RF[state.FIRST, rid]),
                "finish_ms": float(RF[state.FINISH, rid]), "charged_ms": float(RF[state.CHARGED, rid]),
                "preemptions": int(RI[state.PREEMPT, rid])}


def append_request(S, policy, n_tenants: int, n_classes: int, priority_levels, tenant, prompt_tokens, output_tokens,
                   arrival_ms, est_output_tokens=None, klass: int = 0, priority: int = 0):
    """``(state, id)``: one request appended to ``S`` (grown when full) with its line and its key
    in that line from ``policy.lines``; arrival never goes backwards. The checks name the field."""
    for name, v in (("prompt_tokens", prompt_tokens), ("output_tokens", output_tokens)):
        if isinstance(v, bool) or not float(v).is_integer() or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if isinstance(tenant, bool) or not float(tenant).is_integer() or not 0 <= tenant < n_tenants:
        raise ValueError(f"tenant must lie in 0..{n_tenants - 1}, got {tenant!r}")
    n = int(S.si[state.N_REQ])
    last = S.RF[state.ARRIVAL, n - 1] if n else 0.0
    a = float(arrival_ms)
    if math.isnan(a):
        raise ValueError("arrival_ms must be a number, got NaN")
    a = max(a, last)
    est = int(output_tokens if est_output_tokens is None else est_output_tokens)
    line, key, _ = policy.lines(np.array([n]), np.array([tenant]), np.array([klass]), np.array([priority]),
                                np.array([est]), n_tenants, n_classes, priority_levels)
    if n >= S.RF.shape[1]:
        S = grow(S, 2 * S.RF.shape[1])
    RF, RI = S.RF, S.RI
    RF[state.ARRIVAL, n], RF[state.KEY, n] = a, key[0]
    RI[state.TENANT, n], RI[state.PROMPT, n], RI[state.OUTPUT, n] = tenant, prompt_tokens, output_tokens
    RI[state.EST, n], RI[state.KLASS, n], RI[state.LINE, n] = est, klass, line[0]
    S.si[state.N_REQ] = n + 1
    return S, n
