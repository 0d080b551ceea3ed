"""Fairness and latency metrics: functions of per-tenant vectors and of the per-request table.

The same functions serve simulated and measured runs (shared/spec/architecture.md). Latency
definitions follow vLLM bench / AIPerf (shared/reference/serving-metrics.md), times in ms:

    queue = admitted_ms - arrival_ms          TTFT = first_token_ms - arrival_ms
    E2E   = finish_ms - arrival_ms            TPOT = (finish_ms - first_token_ms) / (output_tokens - 1)
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional, Sequence, Union

import numpy as np
import pandas as pd

__all__ = ["shares", "max_min_ratio", "jain_index", "latency_table", "bootstrap_ci", "CI",
           "LATENCY_METRICS"]

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
    y = y / top  # scale-free; avoids under/overflow of the squares
    return float(y.sum() ** 2 / (y.size * np.dot(y, y)))


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
