"""Fairness indices of per-tenant vectors (and the per-request latency table of a simulation).

The same functions serve simulated and measured runs. Jain's index ``(sum y)^2 / (n sum y^2)``,
max/min, the max-min fair (water-filling) split, and Jain of service over that fair split
(demand-normalised). Latency definitions follow vLLM bench / AIPerf, times in ms:

    queue = admitted_ms - arrival_ms          TTFT = first_token_ms - arrival_ms
    E2E   = finish_ms - arrival_ms            TPOT = (finish_ms - first_token_ms) / (output_tokens - 1)
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional, Sequence, Union

import numpy as np
import pandas as pd

__all__ = ["shares", "max_min_ratio", "jain_index", "latency_table", "bootstrap_ci", "CI",
           "LATENCY_METRICS", "percentile_cis", "water_fill", "demand_normalised_jain"]

#: Latency metrics in :func:`latency_table`, in column order.
LATENCY_METRICS = ("queue", "ttft", "tpot", "e2e")


def _vector(x, name: str = "x") -> np.ndarray:
    a = np.asarray(x.to_numpy() if isinstance(x, (pd.Series, pd.Index)) else x, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D vector, got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"{name} must be finite and >= 0, got {a}")
    return a


def _normalised(x, weights) -> np.ndarray:
    a = _vector(x)
    if weights is None:
        return a
    w = _vector(weights, "weights")
    if w.shape != a.shape or np.any(w <= 0):
        raise ValueError(f"weights must be > 0 and match x (length {a.size}), got {w}")
    return a / w


def shares(x):
    """``x_i / sum(x)``: each tenant's share (sums to 1). NaN everywhere if ``sum(x) == 0``.
    A pandas Series comes back as a Series with the same index."""
    a = _vector(x)
    total = a.sum()
    s = a / total if total > 0 else np.full(a.size, np.nan)
    return pd.Series(s, index=x.index, name=x.name) if isinstance(x, pd.Series) else s


def max_min_ratio(x, weights=None) -> float:
    """``max(y) / min(y)`` with ``y_i = x_i / weights_i`` (``y = x`` without weights): 1 is an even
    split. ``inf`` if some but not all ``y_i`` are 0; NaN if all are 0."""
    y = _normalised(x, weights)
    hi, lo = y.max(), y.min()
    if hi == 0:
        return math.nan
    if lo == 0:
        return math.inf
    with np.errstate(over="ignore"):
        return float(hi / lo)


def jain_index(x, weights=None) -> float:
    """Jain's fairness index ``(sum y)^2 / (n * sum y^2)`` with ``y_i = x_i / weights_i``
    (Jain, Chiu & Hawe 1984). 1 for an even split, ``1/n`` when one tenant has everything;
    NaN if all are 0. Weights normalise by entitlement or demand."""
    y = _normalised(x, weights)
    top = y.max()
    if top == 0:
        return math.nan
    y = [float(v) for v in y / top]  # scale-free; avoids under/overflow of the squares
    # exactly rounded sums (math.fsum): the same bits on every CPU, unlike np.dot (BLAS)
    return math.fsum(y) ** 2 / (len(y) * math.fsum(v * v for v in y))


# --- per-request latency -------------------------------------------------------------------
def _pct_label(q) -> str:
    return f"p{float(q):g}"


def latency_table(requests_df: pd.DataFrame, tenant_names: Optional[Sequence[str]] = None,
                  percentiles: Sequence[float] = (50, 90, 99)) -> pd.DataFrame:
    """Per-tenant latency percentiles (ms) from a result table.

    ``requests_df`` needs ``arrival_ms, tenant, output_tokens, admitted_ms, first_token_ms,
    finish_ms`` and optionally ``rejected``. Per tenant: counts ``requests``, ``rejected``,
    ``finished``, then ``{queue,ttft,tpot,e2e}_p{q}`` (``np.percentile``, linear). Each
    percentile is over the requests where the quantity is defined: rejected requests and NaN
    times are excluded, TPOT needs ``output_tokens > 1``. Unfinished requests are therefore
    missing from E2E (compare ``finished`` with ``requests``). Indexed by tenant (names when
    ``tenant_names`` is given, then every named tenant has a row, NaN if it sent nothing).
    """
    need = ("arrival_ms", "tenant", "output_tokens", "admitted_ms", "first_token_ms", "finish_ms")
    missing = [c for c in need if c not in requests_df.columns]
    if missing:
        raise ValueError(f"latency_table: requests_df lacks columns {missing}")
    qs = [float(q) for q in percentiles]
    if not qs or any(not (0 <= q <= 100) for q in qs):
        raise ValueError(f"latency_table: percentiles must be a non-empty sequence in [0, 100], got {percentiles!r}")
    df = requests_df
    tenant = df["tenant"].to_numpy().astype(np.int64)
    rejected = (df["rejected"].to_numpy().astype(bool) if "rejected" in df.columns
                else np.zeros(len(df), dtype=bool))
    arr, adm, first, fin = (df[c].to_numpy(dtype=np.float64)
                            for c in ("arrival_ms", "admitted_ms", "first_token_ms", "finish_ms"))
    out_tok = df["output_tokens"].to_numpy(dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(out_tok > 1, (fin - first) / (out_tok - 1), np.nan)
    values = {"queue": adm - arr, "ttft": first - arr, "tpot": tpot, "e2e": fin - arr}

    if tenant_names is not None:
        ids = list(range(len(tenant_names)))
        if tenant.size and (tenant.min() < 0 or tenant.max() >= len(ids)):
            raise ValueError(f"latency_table: tenant ids must lie in 0..{len(ids) - 1} for the given tenant_names")
    else:
        ids = sorted(set(tenant.tolist()))
    rows = []
    for i in ids:
        mine = tenant == i
        ok = mine & ~rejected
        row = {"requests": int(mine.sum()), "rejected": int((mine & rejected).sum()),
               "finished": int((ok & ~np.isnan(fin)).sum())}
        for m in LATENCY_METRICS:
            v = values[m][ok]
            v = v[~np.isnan(v)]
            p = np.percentile(v, qs) if v.size else np.full(len(qs), np.nan)
            for q, pv in zip(qs, p):
                row[f"{m}_{_pct_label(q)}"] = float(pv)
        rows.append(row)
    index = pd.Index(list(tenant_names) if tenant_names is not None else ids, name="tenant")
    return pd.DataFrame(rows, index=index)


# --- bootstrap -----------------------------------------------------------------------------
class CI(NamedTuple):
    """A point estimate and its confidence interval."""

    estimate: float
    low: float
    high: float


def bootstrap_ci(values, stat: Union[Callable[[np.ndarray], float], None] = None, q: float = 50,
                 n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> CI:
    """Percentile-bootstrap confidence interval of ``stat(values)`` (default: the ``q``-th
    percentile). NaNs are dropped; ``n_boot`` resamples with replacement from
    ``default_rng(seed)``; the interval is the ``(1 - level)/2`` and ``(1 + level)/2`` quantiles
    of the resampled statistic. Deterministic for a given seed. Empty input gives NaNs."""
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[~np.isnan(v)]
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 1:
        raise ValueError(f"bootstrap_ci: n_boot must be an integer >= 1, got {n_boot!r}")
    if not (isinstance(level, (int, float)) and 0 < level < 1):
        raise ValueError(f"bootstrap_ci: level must be in (0, 1), got {level!r}")
    if stat is None:
        if not (0 <= q <= 100):
            raise ValueError(f"bootstrap_ci: q must be in [0, 100], got {q!r}")
        fn = lambda a: np.percentile(a, q, axis=-1)  # noqa: E731
        vectorised = True
    elif callable(stat):
        fn, vectorised = stat, False
    else:
        raise ValueError(f"bootstrap_ci: stat must be None (percentile q) or a callable, got {stat!r}")
    if v.size == 0:
        return CI(math.nan, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    rows = max(1, min(n_boot, 4_000_000 // v.size))  # bound memory: rows x n indices per block
    boot = []
    for start in range(0, n_boot, rows):
        idx = rng.integers(0, v.size, size=(min(rows, n_boot - start), v.size))
        sample = v[idx]
        boot.append(fn(sample) if vectorised else np.array([fn(s) for s in sample], dtype=np.float64))
    boot = np.concatenate(boot)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(boot, [alpha, 1.0 - alpha])
    return CI(float(fn(v)), float(lo), float(hi))


# --- added for fairlib.analysis (issue 4) --------------------------------------------------------
def percentile_cis(values, qs: Sequence[float] = (50, 90, 99), n_boot: int = 1000, seed: int = 0,
                   level: float = 0.95) -> pd.DataFrame:
    """Several percentiles of ``values`` with percentile-bootstrap intervals from ONE set of
    resamples (the same procedure as :func:`bootstrap_ci`, vectorised over ``qs``).

    Returns a frame indexed by ``q`` with columns ``estimate, low, high`` (NaNs dropped from the
    input; NaN rows for an empty input). Deterministic for a given ``seed``."""
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[~np.isnan(v)]
    qs = [float(q) for q in qs]
    if not qs or any(not (0 <= q <= 100) for q in qs):
        raise ValueError(f"percentile_cis: qs must be a non-empty sequence in [0, 100], got {qs!r}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 1:
        raise ValueError(f"percentile_cis: n_boot must be an integer >= 1, got {n_boot!r}")
    if not (isinstance(level, (int, float)) and 0 < level < 1):
        raise ValueError(f"percentile_cis: level must be in (0, 1), got {level!r}")
    index = pd.Index(qs, name="q")
    if v.size == 0:
        return pd.DataFrame({"estimate": np.nan, "low": np.nan, "high": np.nan}, index=index)
    rng = np.random.default_rng(seed)
    rows = max(1, min(n_boot, 4_000_000 // v.size))
    boot = []
    for start in range(0, n_boot, rows):
        idx = rng.integers(0, v.size, size=(min(rows, n_boot - start), v.size))
        boot.append(np.percentile(v[idx], qs, axis=-1).T)     # (block, len(qs))
    boot = np.concatenate(boot)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(boot, [alpha, 1.0 - alpha], axis=0)
    return pd.DataFrame({"estimate": np.percentile(v, qs), "low": lo, "high": hi}, index=index)


def water_fill(demand, capacity: float, weights=None) -> np.ndarray:
    """The (weighted) max-min fair allocation of ``capacity`` among tenants asking for ``demand``:
    every tenant gets ``min(demand_i, level * weight_i)`` with the one ``level`` at which the
    allocations add up to ``capacity`` (or everyone gets its demand when ``capacity >= sum``).

    A tenant that asks for less than its fair share keeps what it asked for; the rest is split
    among the others in proportion to their weights. Example: demands (1, 4, 4), capacity 6 ->
    (1, 2.5, 2.5)."""
    d = _vector(demand, "demand")
    w = np.ones_like(d) if weights is None else _vector(weights, "weights")
    if w.shape != d.shape or np.any(w <= 0):
        raise ValueError(f"water_fill: weights must be > 0 and match demand (length {d.size}), got {w}")
    c = float(capacity)
    if not math.isfinite(c) or c < 0:
        raise ValueError(f"water_fill: capacity must be a finite number >= 0, got {capacity!r}")
    if c >= d.sum():
        return d.copy()
    out = np.zeros_like(d)
    active = d > 0
    left = c
    while active.any():
        level = left / w[active].sum()
        capped = active & (d <= level * w)
        if not capped.any():
            out[active] = level * w[active]
            break
        out[capped] = d[capped]
        left -= d[capped].sum()
        active &= ~capped
    return out


def demand_normalised_jain(service, demand, weights=None) -> float:
    """Jain's index of ``service_i / fair_i``, where ``fair`` is the max-min fair allocation
    (:func:`water_fill`) of the total service delivered among the tenants' ``demand``s.

    1 when every tenant got its fair share of what was served: a light tenant that got all it
    asked for and heavy tenants that split the rest evenly score 1, where a Jain index over raw
    service would call that split unfair. Tenants with zero demand are left out; NaN if none is
    left."""
    s = _vector(service, "service")
    d = _vector(demand, "demand")
    if s.shape != d.shape:
        raise ValueError(f"demand_normalised_jain: service and demand differ in length ({s.size} vs {d.size})")
    w = None if weights is None else _vector(weights, "weights")
    keep = d > 0
    if not keep.any():
        return math.nan
    fair = water_fill(d[keep], s[keep].sum(), None if w is None else w[keep])
    if np.all(fair == 0):
        return math.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(fair > 0, s[keep] / fair, 0.0)
    return jain_index(y)
