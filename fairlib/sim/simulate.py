"""`simulate`: run a request table through the engine model under a policy.

    res = fairlib.simulate(requests, engine=fairlib.Engine(), policy="vtc", horizon_ms=120_000)
    res.requests   # the input columns + rejected, admitted_ms, first_token_ms, finish_ms,
                   #   generated, charged_ms, preemptions
    res.tenants    # machine_ms, prefill_ms, decode_ms, decode_tokens, requests_admitted,
                   #   requests_finished, requests_rejected, share
"""
from __future__ import annotations

import math
from functools import cached_property
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from fairlib.sim import loop
from fairlib.sim.engine import Engine
from fairlib.sim.policies import Policy, make_policy
from fairlib.sim import state
from fairlib.sim.state import State, allocate

__all__ = ["prepare", "simulate", "SimResult", "validate_requests", "request_columns", "REQUIRED_COLUMNS", "OPTIONAL_COLUMNS"]

REQUIRED_COLUMNS = ("arrival_ms", "tenant", "prompt_tokens", "output_tokens")
OPTIONAL_COLUMNS = ("est_output_tokens", "klass", "priority")
#: most tenants one simulation tells apart (per-tenant state is allocated for every id up to the largest)
MAX_TENANTS = 1 << 16
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


def _arrival_column(col) -> np.ndarray:
    """arrival_ms as float64 (a copy); non-numeric values become NaN (rejected by the caller)."""
    if isinstance(col.dtype, np.dtype) and col.dtype.kind in "iuf":
        return col.to_numpy().astype(np.float64)
    return pd.to_numeric(col, errors="coerce").to_numpy(dtype=float, copy=True)


def request_columns(requests, n_tenants: Optional[int] = None) -> tuple[dict, int]:
    """Check a request table against the engine model's input contract; returns (columns,
    n_tenants): the table's columns in order, as numpy arrays of their own (arrival_ms float64,
    the integer columns int64, any other column as given)."""
    if isinstance(requests, dict):
        requests = pd.DataFrame(requests)
    if not isinstance(requests, pd.DataFrame):
        raise ValueError(f"requests must be a pandas DataFrame (or a dict of columns), got {type(requests).__name__}")
    names = list(requests.columns)
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise ValueError(f"requests: missing column(s) {missing}; required: {list(REQUIRED_COLUMNS)}")
    if len(set(names)) < len(names):
        twice = sorted({str(c) for c in names if names.count(c) > 1})
        raise ValueError(f"requests: column names must be unique; repeated: {twice}")
    arrival = _arrival_column(requests["arrival_ms"])
    if not np.isfinite(arrival).all():
        raise ValueError("requests: column 'arrival_ms' must be finite numbers (found NaN or inf)")
    if len(arrival) and arrival.min() < 0:
        raise ValueError("requests: column 'arrival_ms' must be >= 0")
    earlier = arrival[1:] < arrival[:-1]
    if earlier.any():
        i = int(np.argmax(earlier))
        raise ValueError(f"requests: column 'arrival_ms' must be sorted ascending (row {i + 1} arrives before row {i})")
    out = {"arrival_ms": arrival}
    for name in _INT_COLUMNS:
        if name in names:
            out[name] = _int_column(requests, name)
    for name in ("prompt_tokens", "output_tokens") + (("est_output_tokens",) if "est_output_tokens" in out else ()):
        if len(out[name]) and out[name].min() < 1:
            raise ValueError(f"requests: column {name!r} must be integers >= 1 (found {out[name].min()})")
    tenant = out["tenant"]
    if len(tenant) and (tenant.min() < 0 or tenant.max() >= MAX_TENANTS):
        raise ValueError(f"requests: column 'tenant' must lie in 0..{MAX_TENANTS - 1} (MAX_TENANTS, one state "
                         f"slot per id up to the largest), found {tenant.min()}..{tenant.max()}")
    seen = int(tenant.max()) + 1 if len(tenant) else 1
    if n_tenants is None:
        n_tenants = seen
    if isinstance(n_tenants, bool) or not isinstance(n_tenants, (int, float, np.integer, np.floating)) \
            or not math.isfinite(n_tenants) or not float(n_tenants).is_integer() or not 1 <= n_tenants <= MAX_TENANTS:
        raise ValueError(f"n_tenants must be an integer in 1..{MAX_TENANTS} (MAX_TENANTS), got {n_tenants!r}")
    n_tenants = int(n_tenants)
    if len(tenant) and (tenant.min() < 0 or tenant.max() >= n_tenants):
        raise ValueError(f"requests: column 'tenant' must lie in 0..{n_tenants - 1}, "
                         f"found {tenant.min()}..{tenant.max()}")
    columns = {c: (out[c] if c in out else requests[c].to_numpy(copy=True)) for c in names}
    return columns, n_tenants


def validate_requests(requests, n_tenants: Optional[int] = None) -> tuple[pd.DataFrame, int]:
    """As :func:`request_columns`, the columns as a DataFrame; returns (table, n_tenants)."""
    columns, n_tenants = request_columns(requests, n_tenants)
    return pd.DataFrame(columns, copy=False), n_tenants


def _array(table, name, dtype=None) -> np.ndarray:
    """Column `name` of a DataFrame or of a dict of arrays, as a numpy array."""
    col = table[name]
    return col.to_numpy(dtype) if isinstance(col, pd.Series) else np.asarray(col, dtype)


class RequestArrays:
    """A validated request table (a DataFrame, or the dict of arrays `request_columns` gives) as
    the arrays the engine state is filled from; one per table, reused for every policy run on it
    (fairlib/sweep.py runs several policies per table)."""

    def __init__(self, df, n_tenants: int):
        self.arrival = _array(df, "arrival_ms", np.float64)
        self.n = n = len(self.arrival)
        self.n_tenants = n_tenants
        self.columns = set(df.columns if isinstance(df, pd.DataFrame) else df)
        self.rows = np.arange(n)
        self.tenant = _array(df, "tenant", np.int64)
        self.prompt = _array(df, "prompt_tokens", np.int64)
        self.output = _array(df, "output_tokens", np.int64)
        self.klass = _array(df, "klass", np.int64) if "klass" in df else np.zeros(n, np.int64)
        self.priority = _array(df, "priority", np.int64) if "priority" in df else None
        self.est = _array(df, "est_output_tokens", np.int64) if "est_output_tokens" in df else np.zeros(n, np.int64)

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
        S.RF[state.ARRIVAL, :n] = self.arrival
        S.RF[state.KEY, :n] = key
        S.RI[state.TENANT, :n] = self.tenant
        S.RI[state.PROMPT, :n] = self.prompt
        S.RI[state.OUTPUT, :n] = self.output
        S.RI[state.EST, :n] = self.est
        S.RI[state.KLASS, :n] = self.klass
        S.RI[state.LINE, :n] = line
        S.si[state.N_REQ] = n
        pf, pi = policy.state(self.n_tenants, n)
        return S, pf, pi


def build_state(df: pd.DataFrame, n_tenants: int, engine: Engine, policy: Policy, capacity=None):
    """Engine state and policy state arrays for a validated table."""
    return RequestArrays(df, n_tenants).state(engine, policy, capacity)


class SimResult:
    """What one simulated run produced (see book/engine-model.md, Outputs); made by :func:`simulate`.

    ``requests`` and ``tenants`` are DataFrames; given as dicts of column arrays (as ``simulate``
    gives them), each is made a DataFrame on its first read and kept: a run whose tables are never
    read does no pandas work. ``shares`` is ``tenants["share"]`` (machine time / total) and
    ``max_min`` its ``max / min`` (``inf`` when a tenant got nothing).

    Parameters
    ----------
    requests : pandas.DataFrame or dict of numpy.ndarray
        One row per request: the input columns + ``rejected`` (bool), ``admitted_ms``,
        ``first_token_ms``, ``finish_ms`` (ms, NaN when it never happened), ``generated``
        (tokens), ``charged_ms`` (machine ms charged to it), ``preemptions``.
    tenants : pandas.DataFrame or dict of numpy.ndarray
        One row per tenant (index ``tenant``): ``name``, ``machine_ms``, ``prefill_ms``,
        ``decode_ms``, ``decode_tokens``, ``requests_admitted``, ``requests_finished``,
        ``requests_rejected``, ``share``.
    run : dict
        ``busy_ms``, ``iterations``, ``decode_tokens``, ``end_ms`` (the clock at the end) and
        ``horizon_ms``.
    engine : Engine
        The cost model it ran on.
    policy : Policy
        The policy object it ran under.
    counters : numpy.ndarray, optional
        The per-tenant counters the policy keeps (``Policy.counters``; None if it keeps none).
    tenant_names : sequence of str, optional
        The tenants' names, in id order (default: none given, ``[]``).
    """

    def __init__(self, requests, tenants, run: dict, engine: Engine, policy: Policy,
                 counters: Optional[np.ndarray] = None, tenant_names: Optional[Sequence[str]] = None):
        self._tables = {"requests": requests, "tenants": tenants}
        self.run = run
        self.engine = engine
        self.policy = policy
        self.counters = counters
        self.tenant_names = [] if tenant_names is None else tenant_names

    def __repr__(self) -> str:
        return f"SimResult(policy={self.policy!r}, engine={self.engine!r}, run={self.run!r})"

    @cached_property
    def requests(self) -> pd.DataFrame:
        """One row per request: the input columns + rejected, admitted_ms, first_token_ms,
        finish_ms, generated, charged_ms, preemptions."""
        cols = self._tables["requests"]
        return cols if isinstance(cols, pd.DataFrame) else pd.DataFrame(cols, copy=False)

    @cached_property
    def tenants(self) -> pd.DataFrame:
        """One row per tenant (index `tenant`): name, machine_ms, prefill_ms, decode_ms,
        decode_tokens, requests_admitted, requests_finished, requests_rejected, share."""
        cols = self._tables["tenants"]
        if isinstance(cols, pd.DataFrame):
            return cols
        ten = pd.DataFrame(cols)
        ten.index.name = "tenant"
        return ten

    @property
    def shares(self) -> pd.Series:
        return self.tenants["share"]

    @property
    def max_min(self) -> float:
        s = self.tenants["share"].to_numpy()
        return float(s.max() / s.min()) if s.min() > 0 else math.inf


def collect(df, S: State, n: int, engine: Engine, policy: Policy, pf, horizon_ms, tenant_names=None) -> SimResult:
    """Turn the final state into a result (its tables as column arrays, made DataFrames when read);
    `df` is the validated table, a DataFrame or the dict of arrays `request_columns` gives."""
    if isinstance(df, pd.DataFrame):
        columns = {c: df[c].to_numpy()[:n].copy() for c in df.columns}
    else:   # the arrays request_columns made for this run: the result's own
        columns = {c: a[:n] for c, a in df.items()}
    columns.update({
        "rejected": S.RI[state.STATUS, :n] == state.REJECTED, "admitted_ms": S.RF[state.ADMITTED, :n].copy(),
        "first_token_ms": S.RF[state.FIRST, :n].copy(), "finish_ms": S.RF[state.FINISH, :n].copy(),
        "generated": S.RI[state.GENERATED, :n].copy(), "charged_ms": S.RF[state.CHARGED, :n].copy(),
        "preemptions": S.RI[state.PREEMPT, :n].copy()})
    n_t = S.TF.shape[1]
    names = list(tenant_names) if tenant_names is not None else [str(i) for i in range(n_t)]
    machine = S.TF[state.T_MACHINE].copy()
    total = machine.sum()
    ten = {
        "name": names,
        "machine_ms": machine, "prefill_ms": S.TF[state.T_PREFILL].copy(),
        "decode_ms": S.TF[state.T_DECODE].copy(),
        "decode_tokens": S.TI[state.T_TOKENS].copy(), "requests_admitted": S.TI[state.T_ADMITTED].copy(),
        "requests_finished": S.TI[state.T_FINISHED].copy(),
        "requests_rejected": S.TI[state.T_REJECTED].copy(),
        "share": machine / total if total > 0 else np.full(n_t, np.nan),
    }
    run = {"busy_ms": float(S.sf[state.BUSY_MS]), "iterations": int(S.si[state.ITERATIONS]),
           "decode_tokens": int(S.si[state.DECODE_TOKENS]), "end_ms": float(S.sf[state.T_NOW]),
           "horizon_ms": horizon_ms}
    return SimResult(columns, ten, run, engine, policy, policy.counters(pf, n_t), names)


def prepare(requests, engine: Optional[Engine], policy, horizon_ms: Optional[float], n_tenants: Optional[int],
            tenant_names, policy_params: dict) -> tuple:
    """The checked inputs of one run: ``(engine, policy, horizon_ms, columns, n_tenants)``.

    One function for :func:`simulate` and ``fairlib.records.from_sim.trace_simulation``, so that
    both accept and refuse the same inputs: the engine, the policy (a name and its parameters, or
    a Policy object), the horizon (a number > 0, not a bool; None: ``inf``), the request table
    (:func:`request_columns`), ``tenant_names`` (one per tenant) and the columns the policy needs."""
    engine = Engine() if engine is None else engine
    if not isinstance(engine, Engine):
        raise ValueError(f"engine must be a fairlib.Engine, got {type(engine).__name__}")
    pol = make_policy(policy, **policy_params)
    if horizon_ms is None:
        horizon_ms = math.inf
    if isinstance(horizon_ms, bool) or not isinstance(horizon_ms, (int, float, np.integer, np.floating)) \
            or math.isnan(horizon_ms) or horizon_ms <= 0:
        raise ValueError(f"horizon_ms must be a number > 0 (or None for no horizon), got {horizon_ms!r}")
    if tenant_names is not None and n_tenants is None:
        n_tenants = len(tenant_names)
    columns, n_tenants = request_columns(requests, n_tenants)
    if tenant_names is not None and len(tenant_names) != n_tenants:
        raise ValueError(f"tenant_names has {len(tenant_names)} names for {n_tenants} tenants")
    for col in pol.needs:
        if col not in columns and not (col == "priority" and "klass" in columns):
            raise ValueError(f"policy {pol.name!r} needs the requests column {col!r}")
    return engine, pol, float(horizon_ms), columns, n_tenants


def simulate(requests, engine: Optional[Engine] = None, policy="fcfs", horizon_ms: Optional[float] = None,
             n_tenants: Optional[int] = None, tenant_names=None, **policy_params) -> SimResult:
    """Run ``requests`` through the engine model under ``policy`` until ``horizon_ms``.

    Each iteration with ``B`` running sequences and ``P`` prompt tokens prefilled lasts
    ``dt = iter_base_ms + iter_slope_ms * B + prefill_ms_per_token * P`` (:class:`Engine`); the
    policy picks whom to admit when a batch slot frees; a tenant's ``share`` is its machine time
    over the total.

    Parameters
    ----------
    requests : pandas.DataFrame or dict of array-like
        One row per request, sorted by ``arrival_ms`` (ms, >= 0): ``tenant`` (int in
        ``0..n_tenants-1``), ``prompt_tokens`` and ``output_tokens`` (ints >= 1); optional
        ``est_output_tokens`` (int >= 1), ``klass`` and ``priority`` (ints) for the policies that
        read them. Other columns are carried through to ``SimResult.requests``.
    engine : Engine, optional
        The replica's cost model; ``None`` is ``Engine()`` (seed 000's).
    policy : str or Policy, default "fcfs"
        A name in ``fairlib.sim.policies.POLICIES`` (its parameters as ``**policy_params``) or a
        policy object (then no ``**policy_params``).
    horizon_ms : float, optional
        Simulated time (ms, > 0) at which the run stops; ``None`` runs until every request is
        done (requests in flight at the horizon stay unfinished: NaN ``finish_ms``).
    n_tenants : int, optional
        Number of tenants, 1 to ``MAX_TENANTS`` (65536); default ``len(tenant_names)``, else the
        largest ``tenant`` id + 1.
    tenant_names : sequence of str, optional
        One name per tenant (``SimResult.tenants["name"]``); default ``"0"``, ``"1"``, ...
    **policy_params
        The policy's parameters (``make_policy``), e.g. ``weights=[2, 1]`` for ``"vtc"``.

    Returns
    -------
    SimResult
        ``requests``: the input columns + ``rejected``, ``admitted_ms``, ``first_token_ms``,
        ``finish_ms``, ``generated``, ``charged_ms``, ``preemptions``; ``tenants``: ``name``,
        ``machine_ms``, ``prefill_ms``, ``decode_ms``, ``decode_tokens``, ``requests_admitted``,
        ``requests_finished``, ``requests_rejected``, ``share``; ``run``: ``busy_ms``,
        ``iterations``, ``decode_tokens``, ``end_ms``, ``horizon_ms``.

    Raises
    ------
    ValueError
        For a bad input, naming it: a missing or malformed column, unsorted arrivals, a tenant id
        out of range, an unknown policy or parameter, a column the policy needs, ``horizon_ms``
        not > 0, ``tenant_names`` of the wrong length, an ``engine`` that is not an Engine.

    Examples
    --------
    >>> import pandas as pd, fairlib
    >>> req = pd.DataFrame({"arrival_ms": [0.0, 0.0], "tenant": [0, 1],
    ...                     "prompt_tokens": [10, 10], "output_tokens": [4, 4]})
    >>> res = fairlib.simulate(req, fairlib.Engine(max_batch=1), "fcfs")
    >>> res.tenants["requests_finished"].tolist()
    [1, 1]
    """
    engine, pol, horizon_ms, columns, n_tenants = prepare(requests, engine, policy, horizon_ms, n_tenants,
                                                          tenant_names, policy_params)
    table = RequestArrays(columns, n_tenants)
    S, pf, pi = table.state(engine, pol)
    loop.run(S, engine.kernel_params(), pol.pid, pf, pi, horizon_ms)
    return collect(columns, S, table.n, engine, pol, pf, horizon_ms, tenant_names)
