"""`simulate`: run a request table through the engine model under a policy.

    res = fairlib.simulate(requests, engine=fairlib.Engine(), policy="vtc", horizon_ms=120_000)
    res.requests   # the input columns + rejected, admitted_ms, first_token_ms, finish_ms,
                   #   generated, charged_ms, preemptions
    res.tenants    # machine_ms, prefill_ms, decode_ms, decode_tokens, requests_admitted,
                   #   requests_finished, requests_rejected, share
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from fairlib.sim import loop
from fairlib.sim.engine import Engine
from fairlib.sim.policies import Policy, make_policy
from fairlib.sim.state import (
    ADMITTED,
    ARRIVAL,
    BUSY_MS,
    CHARGED,
    DECODE_TOKENS,
    EST,
    FINISH,
    FIRST,
    GENERATED,
    ITERATIONS,
    KEY,
    KLASS,
    LINE,
    N_REQ,
    OUTPUT,
    PREEMPT,
    PROMPT,
    REJECTED,
    STATUS,
    T_ADMITTED,
    T_DECODE,
    T_FINISHED,
    T_MACHINE,
    T_NOW,
    T_PREFILL,
    T_REJECTED,
    T_TOKENS,
    TENANT,
    State,
    allocate,
)

__all__ = ["simulate", "SimResult", "validate_requests", "REQUIRED_COLUMNS", "OPTIONAL_COLUMNS"]

REQUIRED_COLUMNS = ("arrival_ms", "tenant", "prompt_tokens", "output_tokens")
OPTIONAL_COLUMNS = ("est_output_tokens", "klass", "priority")
_INT_COLUMNS = ("tenant", "prompt_tokens", "output_tokens", "est_output_tokens", "klass", "priority")


def _int_column(df, name) -> np.ndarray:
    col = df[name]
    values = col.to_numpy()
    if values.dtype.kind not in "iuf" or (values.dtype.kind == "f" and np.isnan(values).any()):
        bad = "NaN" if values.dtype.kind == "f" else str(values.dtype)
        raise ValueError(f"requests: column {name!r} must hold integers, found {bad}")
    if values.dtype.kind == "f" and not np.all(values == np.round(values)):
        raise ValueError(f"requests: column {name!r} must hold integers, found fractional values")
    return values.astype(np.int64)


def validate_requests(requests, n_tenants: Optional[int] = None) -> tuple[pd.DataFrame, int]:
    """Check a request table against the engine model's input contract; returns (table, n_tenants)."""
    if isinstance(requests, dict):
        requests = pd.DataFrame(requests)
    if not isinstance(requests, pd.DataFrame):
        raise ValueError(f"requests must be a pandas DataFrame (or a dict of columns), got {type(requests).__name__}")
    missing = [c for c in REQUIRED_COLUMNS if c not in requests.columns]
    if missing:
        raise ValueError(f"requests: missing column(s) {missing}; required: {list(REQUIRED_COLUMNS)}")
    df = requests.reset_index(drop=True)
    arrival = pd.to_numeric(df["arrival_ms"], errors="coerce").to_numpy(dtype=float)
    if not np.all(np.isfinite(arrival)):
        raise ValueError("requests: column 'arrival_ms' must be finite numbers (found NaN or inf)")
    if len(arrival) and arrival.min() < 0:
        raise ValueError("requests: column 'arrival_ms' must be >= 0")
    if np.any(np.diff(arrival) < 0):
        i = int(np.argmax(np.diff(arrival) < 0))
        raise ValueError(f"requests: column 'arrival_ms' must be sorted ascending (row {i + 1} arrives before row {i})")
    out = {"arrival_ms": arrival}
    for name in _INT_COLUMNS:
        if name in df.columns:
            out[name] = _int_column(df, name)
    for name in ("prompt_tokens", "output_tokens") + (("est_output_tokens",) if "est_output_tokens" in out else ()):
        if len(out[name]) and out[name].min() < 1:
            raise ValueError(f"requests: column {name!r} must be integers >= 1 (found {out[name].min()})")
    tenant = out["tenant"]
    seen = int(tenant.max()) + 1 if len(tenant) else 1
    if n_tenants is None:
        n_tenants = seen
    if isinstance(n_tenants, bool) or not float(n_tenants).is_integer() or n_tenants < 1:
        raise ValueError(f"n_tenants must be an integer >= 1, got {n_tenants!r}")
    n_tenants = int(n_tenants)
    if len(tenant) and (tenant.min() < 0 or tenant.max() >= n_tenants):
        raise ValueError(f"requests: column 'tenant' must lie in 0..{n_tenants - 1}, "
                         f"found {tenant.min()}..{tenant.max()}")
    columns = {c: (out[c] if c in out else df[c].to_numpy()) for c in df.columns}
    return pd.DataFrame(columns, copy=False), n_tenants


class RequestArrays:
    """A validated request table as the arrays the engine state is filled from; one per table,
    reused for every policy run on it (fairlib/sweep.py runs several policies per table)."""

    def __init__(self, df: pd.DataFrame, n_tenants: int):
        self.n = n = len(df)
        self.n_tenants = n_tenants
        self.columns = set(df.columns)
        self.rows = np.arange(n)
        self.arrival = df["arrival_ms"].to_numpy(np.float64)
        self.tenant = df["tenant"].to_numpy(np.int64)
        self.prompt = df["prompt_tokens"].to_numpy(np.int64)
        self.output = df["output_tokens"].to_numpy(np.int64)
        self.klass = df["klass"].to_numpy(np.int64) if "klass" in df else np.zeros(n, np.int64)
        self.priority = df["priority"].to_numpy(np.int64) if "priority" in df else None
        self.est = df["est_output_tokens"].to_numpy(np.int64) if "est_output_tokens" in df else np.zeros(n, np.int64)

    def state(self, engine: Engine, policy: Policy, capacity=None):
        """Engine state and policy state arrays (S, pf, pi) for a run of `policy` on this table."""
        for col in policy.needs:
            if col not in self.columns and not (col == "priority" and "klass" in self.columns):
                raise ValueError(f"policy {policy.name!r} needs the requests column {col!r}")
        n = self.n
        line, key, n_lines = policy.lines(self.rows, self.tenant, self.klass, self.priority, self.est,
                                          self.n_tenants)
        sizes = None if capacity else np.bincount(line, minlength=n_lines)
        S = allocate(max(n, capacity or 0), self.n_tenants, n_lines, engine.max_batch, sizes)
        S.RF[ARRIVAL, :n] = self.arrival
        S.RF[KEY, :n] = key
        S.RI[TENANT, :n] = self.tenant
        S.RI[PROMPT, :n] = self.prompt
        S.RI[OUTPUT, :n] = self.output
        S.RI[EST, :n] = self.est
        S.RI[KLASS, :n] = self.klass
        S.RI[LINE, :n] = line
        S.si[N_REQ] = n
        pf, pi = policy.state(self.n_tenants, n)
        return S, pf, pi


def build_state(df: pd.DataFrame, n_tenants: int, engine: Engine, policy: Policy, capacity=None):
    """Engine state and policy state arrays for a validated table."""
    return RequestArrays(df, n_tenants).state(engine, policy, capacity)


@dataclass
class SimResult:
    """What one simulated run produced (see book/engine-model.md, Outputs)."""

    requests: pd.DataFrame
    tenants: pd.DataFrame
    run: dict
    engine: Engine
    policy: Policy
    counters: Optional[np.ndarray] = None
    tenant_names: Sequence[str] = field(default_factory=list)

    @property
    def shares(self) -> pd.Series:
        return self.tenants["share"]

    @property
    def max_min(self) -> float:
        s = self.tenants["share"].to_numpy()
        return float(s.max() / s.min()) if s.min() > 0 else math.inf


def collect(df: pd.DataFrame, S: State, n: int, engine: Engine, policy: Policy, pf, horizon_ms,
            tenant_names=None) -> SimResult:
    """Turn the final state into result tables."""
    columns = {c: df[c].to_numpy()[:n].copy() for c in df.columns}
    columns.update({
        "rejected": S.RI[STATUS, :n] == REJECTED, "admitted_ms": S.RF[ADMITTED, :n].copy(),
        "first_token_ms": S.RF[FIRST, :n].copy(), "finish_ms": S.RF[FINISH, :n].copy(),
        "generated": S.RI[GENERATED, :n].copy(), "charged_ms": S.RF[CHARGED, :n].copy(),
        "preemptions": S.RI[PREEMPT, :n].copy()})
    req = pd.DataFrame(columns, copy=False)
    n_t = S.TF.shape[1]
    names = list(tenant_names) if tenant_names is not None else [str(i) for i in range(n_t)]
    machine = S.TF[T_MACHINE].copy()
    total = machine.sum()
    ten = pd.DataFrame({
        "name": names,
        "machine_ms": machine, "prefill_ms": S.TF[T_PREFILL].copy(), "decode_ms": S.TF[T_DECODE].copy(),
        "decode_tokens": S.TI[T_TOKENS].copy(), "requests_admitted": S.TI[T_ADMITTED].copy(),
        "requests_finished": S.TI[T_FINISHED].copy(), "requests_rejected": S.TI[T_REJECTED].copy(),
        "share": machine / total if total > 0 else np.full(n_t, np.nan),
    })
    ten.index.name = "tenant"
    run = {"busy_ms": float(S.sf[BUSY_MS]), "iterations": int(S.si[ITERATIONS]),
           "decode_tokens": int(S.si[DECODE_TOKENS]), "end_ms": float(S.sf[T_NOW]), "horizon_ms": horizon_ms}
    return SimResult(req, ten, run, engine, policy, policy.counters(pf, n_t), names)


def simulate(requests, engine: Optional[Engine] = None, policy="fcfs", horizon_ms: Optional[float] = None,
             n_tenants: Optional[int] = None, tenant_names=None, **policy_params) -> SimResult:
    """Run `requests` through the engine model under `policy` until `horizon_ms` (None: until done).

    requests: DataFrame with arrival_ms, tenant, prompt_tokens, output_tokens
    (optional est_output_tokens, klass, priority), sorted by arrival.
    policy: a name from fairlib.sim.policies.POLICIES (parameters as keywords) or a Policy object.
    """
    engine = Engine() if engine is None else engine
    if not isinstance(engine, Engine):
        raise ValueError(f"engine must be a fairlib.Engine, got {type(engine).__name__}")
    pol = make_policy(policy, **policy_params)
    if horizon_ms is None:
        horizon_ms = math.inf
    if not isinstance(horizon_ms, (int, float, np.integer, np.floating)) or math.isnan(horizon_ms) or horizon_ms <= 0:
        raise ValueError(f"horizon_ms must be a number > 0 (or None for no horizon), got {horizon_ms!r}")
    if tenant_names is not None and n_tenants is None:
        n_tenants = len(tenant_names)
    df, n_tenants = validate_requests(requests, n_tenants)
    if tenant_names is not None and len(tenant_names) != n_tenants:
        raise ValueError(f"tenant_names has {len(tenant_names)} names for {n_tenants} tenants")
    S, pf, pi = build_state(df, n_tenants, engine, pol)
    loop.run(S, engine.kernel_params(), pol.pid, pf, pi, float(horizon_ms))
    return collect(df, S, len(df), engine, pol, pf, float(horizon_ms), tenant_names)
