"""Fairness indices of per-tenant vectors, and percentiles with bootstrap intervals.

The same functions serve simulated and measured runs. Jain's index ``(sum y)^2 / (n sum y^2)``,
max/min, the max-min fair (water-filling) split, and Jain of service over that fair split
(demand-normalised). The latency definitions are ``fairlib.analysis.latencies``'s.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

__all__ = ["max_min_ratio", "jain_index", "percentile_cis", "water_fill", "demand_normalised_jain"]


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


def max_min_ratio(x, weights=None) -> float:
    """``max(y) / min(y)`` with ``y_i = x_i / weights_i`` (``y = x`` without weights): 1 is an even
    split. ``inf`` if some but not all ``y_i`` are 0; NaN if all are 0.

    Parameters
    ----------
    x : array-like of float
        Per-tenant amounts (service, machine time, ...): a non-empty 1-D vector, finite, >= 0.
    weights : array-like of float, optional
        Per-tenant entitlements (> 0, one per ``x``); default all 1.

    Returns
    -------
    float
        The ratio, in ``[1, inf]``, or NaN.

    Raises
    ------
    ValueError
        ``x`` or ``weights`` empty, not 1-D, negative or not finite, or of different lengths.
    """
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
    NaN if all are 0. Weights normalise by entitlement or demand.

    Parameters
    ----------
    x : array-like of float
        Per-tenant amounts: a non-empty 1-D vector, finite, >= 0.
    weights : array-like of float, optional
        Per-tenant entitlements (> 0, one per ``x``); default all 1.

    Returns
    -------
    float
        The index, in ``[1/n, 1]``, or NaN (exactly rounded sums: the same bits on every CPU).

    Raises
    ------
    ValueError
        ``x`` or ``weights`` empty, not 1-D, negative or not finite, or of different lengths.

    Examples
    --------
    >>> from fairlib.analysis import jain_index
    >>> jain_index([1, 1, 1, 1]), jain_index([4, 0, 0, 0]), jain_index([2, 1], weights=[2, 1])
    (1.0, 0.25, 1.0)
    """
    y = _normalised(x, weights)
    top = y.max()
    if top == 0:
        return math.nan
    ys = [float(v) for v in y / top]  # scale-free; avoids under/overflow of the squares
    # exactly rounded sums (math.fsum): the same bits on every CPU, unlike np.dot (BLAS)
    return math.fsum(ys) ** 2 / (len(ys) * math.fsum(v * v for v in ys))


# --- bootstrap -----------------------------------------------------------------------------
def percentile_cis(values, qs: Sequence[float] = (50, 90, 99), n_boot: int = 1000, seed: int = 0,
                   level: float = 0.95) -> pd.DataFrame:
    """Several percentiles of ``values`` with percentile-bootstrap intervals from ONE set of
    resamples: ``n_boot`` resamples with replacement from ``default_rng(seed)``; the interval of
    each ``q`` is the ``(1 - level)/2`` and ``(1 + level)/2`` quantiles of its resampled percentile.

    Parameters
    ----------
    values : array-like of float
        The sample (e.g. latencies in ms); NaNs are dropped.
    qs : sequence of float, default (50, 90, 99)
        The percentiles, each in ``[0, 100]`` (``np.percentile``, linear).
    n_boot : int, default 1000
        Bootstrap resamples (>= 1).
    seed : int, default 0
        Seed of ``numpy.random.default_rng``: the same seed, the same intervals.
    level : float, default 0.95
        Confidence level of the intervals, in ``(0, 1)``.

    Returns
    -------
    pandas.DataFrame
        Indexed by ``q``, columns ``estimate, low, high``; NaN rows for an empty input.

    Raises
    ------
    ValueError
        ``qs`` empty or outside ``[0, 100]``, ``n_boot`` not an integer >= 1, ``level`` outside
        ``(0, 1)``.
    """
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
    blocks = []
    for start in range(0, n_boot, rows):
        idx = rng.integers(0, v.size, size=(min(rows, n_boot - start), v.size))
        blocks.append(np.percentile(v[idx], qs, axis=-1).T)     # (block, len(qs))
    boot = np.concatenate(blocks)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(boot, [alpha, 1.0 - alpha], axis=0)
    return pd.DataFrame({"estimate": np.percentile(v, qs), "low": lo, "high": hi}, index=index)


def water_fill(demand, capacity: float, weights=None) -> np.ndarray:
    """The (weighted) max-min fair allocation of ``capacity`` among tenants asking for ``demand``:
    every tenant gets ``min(demand_i, level * weight_i)`` with the one ``level`` at which the
    allocations add up to ``capacity`` (or everyone gets its demand when ``capacity >= sum``).

    A tenant that asks for less than its fair share keeps what it asked for; the rest is split
    among the others in proportion to their weights.

    Parameters
    ----------
    demand : array-like of float
        What each tenant asks for: a non-empty 1-D vector, finite, >= 0.
    capacity : float
        What there is to split (finite, >= 0; the same unit as ``demand``).
    weights : array-like of float, optional
        Per-tenant weights (> 0, one per ``demand``); default all 1.

    Returns
    -------
    numpy.ndarray
        Each tenant's allocation (float64, summing to ``min(capacity, sum(demand))``).

    Raises
    ------
    ValueError
        ``demand`` or ``weights`` empty, not 1-D, negative or not finite, of different lengths,
        or ``capacity`` not a finite number >= 0.

    Examples
    --------
    >>> from fairlib.analysis import water_fill
    >>> water_fill([1, 4, 4], 6).tolist()
    [1.0, 2.5, 2.5]
    """
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
    left.

    Parameters
    ----------
    service : array-like of float
        What each tenant got (finite, >= 0).
    demand : array-like of float
        What each tenant asked for, in the same unit (finite, >= 0, one per ``service``).
    weights : array-like of float, optional
        Per-tenant weights of the fair split (> 0); default all 1.

    Returns
    -------
    float
        ``jain_index(service_i / fair_i)`` over the tenants with demand, in ``[1/n, 1]``, or NaN.

    Raises
    ------
    ValueError
        A vector empty, not 1-D, negative or not finite, or ``service`` and ``demand`` of
        different lengths.
    """
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
