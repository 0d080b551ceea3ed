"""The stream intervals: when each request held a batch slot, rebuilt from its chunk times, the
sweep line that splits each instant among the streams active then, and the engine model's
iteration cost fitted to the same timings (``fairlib.analysis.service`` docstring: residency).
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pandas as pd

from fairlib.analysis.common import chunks, numeric, tenant_index, tenant_names_of

__all__ = ["stream_intervals", "build_intervals", "intervals_for", "fit_iteration_cost", "tick_table", "fit_ticks",
           "sweep"]


def stream_intervals(records: pd.DataFrame, tenant_names=None, tick_tol_s: Optional[float] = None):
    """The slot-holding intervals of every stream: ``(start_s, end_s, tenant_index)`` arrays.
    (:func:`build_intervals` also gives each interval's tick, whether it is a first token, and the
    request's prompt length.)

    For each request with token chunks at ``t_1 < ... < t_n``: ``(t_{k-1}, t_k]`` for ``k >= 2``
    and the first-token iteration ``(max(send, previous tick), t_1]``, where the ticks are the
    chunk times of all streams, clustered within ``tick_tol_s`` (default ``min(5 ms, 0.2 x``
    the median gap between a stream's consecutive chunks)): the previous tick is when the
    iteration before the first-token one ended.

    Parameters
    ----------
    records : pandas.DataFrame
        One run's records (``Run.records``).
    tenant_names : sequence of str, optional
        The tenants, in order (default: the records' ``tenant_name`` by ``tenant`` index).
    tick_tol_s : float, optional
        Chunk times closer than this (s) are one tick; default ``min(0.005, 0.2 * g)``, ``g``
        the median gap between a stream's consecutive chunks.

    Returns
    -------
    tuple of numpy.ndarray
        ``(start_s, end_s, tenant_index)``, one entry per interval.

    Raises
    ------
    ValueError
        A record naming a tenant not in ``tenant_names``.
    """
    iv = build_intervals(records, tenant_names, tick_tol_s)
    return iv["start"], iv["end"], iv["tenant"]


def build_intervals(records: pd.DataFrame, tenant_names=None, tick_tol_s: Optional[float] = None) -> dict:
    """The intervals of :func:`stream_intervals` with all :func:`residency`, :func:`fairness` and
    :func:`windowed_fairness` need of them: build them once per run and pass them as
    ``intervals=``. Arrays per interval: start, end, tenant, tick (of its end), first (a
    first-token interval), prompt (its request's prompt tokens); and ``n_ticks``, ``names`` (the
    tenants) and ``tick_tol_s`` (as given) they were built for.

    Parameters
    ----------
    records : pandas.DataFrame
        One run's records (``Run.records``).
    tenant_names : sequence of str, optional
        The tenants, in order (default: the records' ``tenant_name`` by ``tenant`` index).
    tick_tol_s : float, optional
        Chunk times closer than this (s) are one tick; default ``min(0.005, 0.2 * g)``, ``g``
        the median gap between a stream's consecutive chunks.

    Returns
    -------
    dict
        ``start``, ``end`` (s), ``tenant``, ``tick``, ``first``, ``prompt`` (arrays, one entry
        per interval), ``n_ticks``, ``names``, ``tick_tol_s``.

    Raises
    ------
    ValueError
        A record naming a tenant not in ``tenant_names``.
    """
    names = tenant_names_of(records, tenant_names)
    given_tol = tick_tol_s
    t = tenant_index(records, names)
    times, _, rows = chunks(records)
    if times.size == 0:
        z = np.zeros(0)
        zi = np.zeros(0, np.int64)
        return {"start": z, "end": z, "tenant": zi, "tick": zi, "first": np.zeros(0, bool), "prompt": z,
                "n_ticks": 0, "names": names, "tick_tol_s": given_tol}
    order = np.lexsort((times, rows))
    times, rows = times[order], rows[order]
    same = rows[1:] == rows[:-1]
    gaps = np.diff(times)[same]
    if tick_tol_s is None:
        med = float(np.median(gaps)) if gaps.size else 0.0
        tick_tol_s = min(5e-3, 0.2 * med)
    g = np.sort(times)
    new = np.concatenate([[True], np.diff(g) > tick_tol_s])
    tick_start = g[new]                       # first chunk time of each tick
    tick_id = np.cumsum(new) - 1              # tick of each sorted time
    first_idx = np.flatnonzero(np.concatenate([[True], ~same]))
    t1 = times[first_idx]
    r1 = rows[first_idx]
    k = tick_id[np.searchsorted(g, t1, side="left")]
    prev = np.where(k > 0, tick_start[np.maximum(k - 1, 0)], -np.inf)
    send = numeric(records, "actual_send_s")[r1]
    start1 = np.fmax(np.where(np.isnan(send), -np.inf, send), prev)
    start1 = np.where(np.isfinite(start1), start1, t1)
    start1 = np.minimum(start1, t1)
    starts = np.concatenate([times[:-1][same], start1])
    ends = np.concatenate([times[1:][same], t1])
    row = np.concatenate([rows[1:][same], r1])
    tick = tick_id[np.searchsorted(g, ends, side="left")]
    first = np.concatenate([np.zeros(int(same.sum()), bool), np.ones(r1.size, bool)])
    prompt = numeric(records, "prompt_tokens")[row]
    return {"start": starts, "end": ends, "tenant": t[row], "tick": tick, "first": first,
            "prompt": np.nan_to_num(prompt), "n_ticks": int(tick_start.size), "names": names, "tick_tol_s": given_tol}


def intervals_for(records: pd.DataFrame, names: list, tick_tol_s, intervals: Optional[dict]) -> dict:
    """``intervals`` when given (checked: built for ``names`` and ``tick_tol_s``), else built."""
    if intervals is None:
        return build_intervals(records, names, tick_tol_s)
    if intervals["names"] != names or intervals["tick_tol_s"] != tick_tol_s:
        raise ValueError(f"intervals: built for tenants {intervals['names']} and tick_tol_s "
                         f"{intervals['tick_tol_s']!r}, not for {names} and {tick_tol_s!r}")
    return intervals


def fit_iteration_cost(records: pd.DataFrame, tick_tol_s: Optional[float] = None) -> dict:
    """Fit the engine model's ``dt = iter_base + iter_slope * B + prefill * P`` (ms) to the
    stream timings: every tick (iteration, as seen by the streams) has a duration (median end
    minus median start of the intervals ending in it), ``B`` = the streams that emitted in it
    and ``P`` = the prompt tokens of the streams that got their first token in it. Least squares;
    returns ``iter_base_ms, iter_slope_ms, prefill_ms_per_token, r2, n_ticks``. On the engine
    model itself the fit is exact; on a real engine only as good as the linear model.

    Parameters
    ----------
    records : pandas.DataFrame
        One run's records (``Run.records``).
    tick_tol_s : float, optional
        Chunk times closer than this (s) are one tick; default ``min(0.005, 0.2 * g)``, ``g``
        the median gap between a stream's consecutive chunks.

    Returns
    -------
    dict
        ``iter_base_ms``, ``iter_slope_ms``, ``prefill_ms_per_token`` (0 when no tick prefilled),
        ``r2`` and ``n_ticks`` (the ticks fitted); NaNs and ``n_ticks`` 0 with fewer than 3
        usable ticks.
    """
    return fit_ticks(build_intervals(records, None, tick_tol_s))


def tick_table(iv: dict):
    """Per tick: ``B`` (streams that emitted), ``P`` (prompt tokens first-tokened) and its duration (ms)."""
    k = iv["n_ticks"]
    tick = iv["tick"]
    B = np.bincount(tick, minlength=k).astype(float)
    P = np.bincount(tick, weights=iv["prompt"] * iv["first"], minlength=k)
    d = pd.DataFrame({"tick": tick, "start": iv["start"], "end": iv["end"]}).groupby("tick")
    s = d["start"].median().reindex(range(k)).to_numpy()
    e = d["end"].median().reindex(range(k)).to_numpy()
    return B, P, (e - s) * 1e3


def fit_ticks(iv: dict) -> dict:
    """Least squares of ``dt = iter_base + iter_slope * B + prefill * P`` over the ticks (:func:`fit_iteration_cost`)."""
    nan = {"iter_base_ms": math.nan, "iter_slope_ms": math.nan, "prefill_ms_per_token": math.nan,
           "r2": math.nan, "n_ticks": 0}
    if iv["n_ticks"] < 3:
        return nan
    B, P, dt = tick_table(iv)
    ok = (B > 0) & np.isfinite(dt) & (dt > 0)
    if ok.sum() < 3:
        return nan
    X = np.column_stack([np.ones(ok.sum()), B[ok], P[ok]])
    cols = [0, 1] + ([2] if np.any(P[ok] > 0) else [])
    coef, *_ = np.linalg.lstsq(X[:, cols], dt[ok], rcond=None)
    full = np.zeros(3)
    full[cols] = coef
    pred = X @ full
    ss = float(((dt[ok] - dt[ok].mean()) ** 2).sum())
    r2 = 1.0 - float(((dt[ok] - pred) ** 2).sum()) / ss if ss > 0 else 1.0
    return {"iter_base_ms": float(full[0]), "iter_slope_ms": float(full[1]), "prefill_ms_per_token": float(full[2]),
            "r2": r2, "n_ticks": int(ok.sum())}


def sweep(starts, ends, ten, n_t, edges=()):
    """Boundaries ``b`` and the machine time ``[n_t, len(b) - 1]`` each tenant got in each segment
    ``[b_k, b_k+1)``: the segment's length split equally among the intervals covering it."""
    b = np.unique(np.concatenate([starts, ends, np.asarray(edges, dtype=np.float64)]))
    nb = b.size
    if nb < 2:
        return b, np.zeros((n_t, 0))
    i0 = np.searchsorted(b, starts)
    i1 = np.searchsorted(b, ends)
    width = nb + 1
    d = (np.bincount(ten * width + i0, minlength=n_t * width)
         - np.bincount(ten * width + i1, minlength=n_t * width)).reshape(n_t, width)
    counts = np.cumsum(d, axis=1)[:, :nb - 1].astype(np.float64)
    total = counts.sum(axis=0)
    seg = np.diff(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        part = np.where(total > 0, seg / total, 0.0)
    return b, counts * part
