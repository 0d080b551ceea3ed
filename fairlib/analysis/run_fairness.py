"""A run's fairness: the indices of ``fairlib.analysis.indices`` (Jain, max/min, demand-normalised
Jain) over its token-weighted service and residency, for the whole load window
(:func:`fairness`) and per window of ``window_s`` seconds (:func:`windowed_fairness`: Jain over
the tenants that had a request outstanding in that window).
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pandas as pd

from fairlib.analysis.common import (DECODE_WEIGHT, PREFILL_WEIGHT, as_run, chunks, numeric, tenant_index,
                                     tenant_names_of)
from fairlib.analysis.indices import demand_normalised_jain, jain_index, max_min_ratio
from fairlib.analysis.intervals import intervals_for, sweep
from fairlib.analysis.service import residency, token_service

__all__ = ["windowed_fairness", "fairness"]


def _outstanding(records: pd.DataFrame):
    """Each request's (start, end) of having work outstanding: send to last event."""
    send = numeric(records, "actual_send_s")
    end = np.fmax(numeric(records, "last_token_s"), numeric(records, "end_s"))
    end = np.where(np.isnan(end), send, end)
    return send, end


def windowed_fairness(run, window_s: float = 10.0, tenant_names=None, tick_tol_s: Optional[float] = None,
                      wp: float = PREFILL_WEIGHT, wq: float = DECODE_WEIGHT, end_s: Optional[float] = None, *,
                      intervals: Optional[dict] = None) -> pd.DataFrame:
    """Per window of ``window_s`` seconds from 0 to the load window's end (``end_s``; default the
    run's ``duration_s``, else the last token): raw token-weighted service and residency per
    tenant, and their Jain indices over the tenants that had a request outstanding in the window
    (``jain_tokens``, ``jain_residency``; ``active`` = how many).

    Parameters
    ----------
    run : Run, str, pathlib.Path or pandas.DataFrame
        The run (anything ``as_run`` takes).
    window_s : float, default 10.0
        Window length (s, > 0).
    tenant_names : sequence of str, optional
        The tenants, in order (default ``Run.tenant_names``).
    tick_tol_s : float, optional
        Chunk times closer than this (s) are one tick; default ``min(0.005, 0.2 * g)``, ``g``
        the median gap between a stream's consecutive chunks.
    wp : float, default PREFILL_WEIGHT
        Weight of a prompt token (counted in the window of its first token).
    wq : float, default DECODE_WEIGHT
        Weight of an output token (counted in the window of its chunk).
    end_s : float, optional
        End of the last window (s); default the run's ``duration_s``, else its last token.
    intervals : dict, optional
        The run's :func:`build_intervals` for these tenants and ``tick_tol_s`` (built here when
        not given).

    Returns
    -------
    pandas.DataFrame
        One row per window: ``t_start_s``, ``t_end_s``, ``active``, ``jain_tokens``,
        ``jain_residency`` (NaN when no active tenant got any), and per tenant ``tokens_<name>``
        and ``residency_s_<name>``.

    Raises
    ------
    ValueError
        ``window_s`` not > 0, ``intervals`` built for other tenants or another ``tick_tol_s``,
        or a record naming an unknown tenant.
    """
    run = as_run(run)
    rec = run.records
    if not (isinstance(window_s, (int, float)) and window_s > 0):
        raise ValueError(f"window_s must be a number > 0, got {window_s!r}")
    names = tenant_names_of(rec, tenant_names or run.tenant_names)
    t = tenant_index(rec, names)
    if end_s is None:
        end_s = run.duration_s
        if not math.isfinite(end_s):
            end_s = float(np.nanmax(numeric(rec, "last_token_s"))) if len(rec) else 0.0
    nw = max(1, int(math.ceil(end_s / window_s - 1e-9)))
    edges = np.arange(nw + 1) * float(window_s)
    tok = _window_tokens(rec, t, len(names), nw, window_s, wp, wq)
    iv = intervals_for(rec, names, tick_tol_s, intervals)
    res = _window_residency(iv, len(names), edges, window_s)
    active = _window_active(rec, t, len(names), nw, window_s)
    rows_out = []
    for w in range(nw):
        act = active[:, w]
        row = {"t_start_s": edges[w], "t_end_s": edges[w + 1], "active": int(act.sum())}
        row["jain_tokens"] = jain_index(tok[act, w]) if act.sum() >= 1 and tok[act, w].max() > 0 else math.nan
        row["jain_residency"] = jain_index(res[act, w]) if act.sum() >= 1 and res[act, w].max() > 0 else math.nan
        for i, n in enumerate(names):
            row[f"tokens_{n}"] = tok[i, w]
            row[f"residency_s_{n}"] = res[i, w]
        rows_out.append(row)
    return pd.DataFrame(rows_out)


def _window_tokens(rec: pd.DataFrame, t, n_t: int, nw: int, window_s: float, wp: float, wq: float):
    """``[n_t, nw]`` token-weighted service: ``wq`` per output token in its chunk's window, ``wp``
    per prompt token in its first token's window."""
    times, toks, rows = chunks(rec)
    w_of = np.floor(times / window_s).astype(np.int64) if times.size else np.zeros(0, np.int64)
    ok = (w_of >= 0) & (w_of < nw)
    tok = np.zeros((n_t, nw))
    np.add.at(tok, (t[rows[ok]], w_of[ok]), wq * toks[ok])
    first = numeric(rec, "first_token_s")
    prompt = numeric(rec, "prompt_tokens")
    fw = np.floor(first / window_s)
    okf = ~np.isnan(fw) & (fw >= 0) & (fw < nw)
    np.add.at(tok, (t[okf], fw[okf].astype(np.int64)), wp * prompt[okf])
    return tok


def _window_residency(iv: dict, n_t: int, edges, window_s: float):
    """``[n_t, nw]`` machine seconds: the sweep line's equal split, summed per window."""
    nw = len(edges) - 1
    b, m = sweep(iv["start"], iv["end"], iv["tenant"], n_t, edges)
    res = np.zeros((n_t, nw))
    if m.shape[1]:
        mid = 0.5 * (b[:-1] + b[1:])
        wi = np.floor(mid / window_s).astype(np.int64)
        okr = (wi >= 0) & (wi < nw)
        for i in range(n_t):
            res[i] = np.bincount(wi[okr], weights=m[i, okr], minlength=nw)[:nw]
    return res


def _window_active(rec: pd.DataFrame, t, n_t: int, nw: int, window_s: float):
    """``[n_t, nw]`` booleans: the tenant had a request outstanding (:func:`_outstanding`, half-open
    ``[send, last event)``) at some time in the window."""
    o0, o1 = _outstanding(rec)
    active = np.zeros((n_t, nw), dtype=bool)
    for i in range(n_t):
        mine = (t == i) & ~np.isnan(o0)
        for a, z in zip(o0[mine], o1[mine]):
            k0 = max(0, int(a // window_s))                       # outstanding over [a, z): half-open
            k1 = min(nw - 1, int(math.ceil(z / window_s)) - 1 if z > a else k0)
            if k0 <= k1:
                active[i, k0:k1 + 1] = True
    return active


def fairness(run, window="load", tenant_names=None, tick_tol_s: Optional[float] = None, *,
             intervals: Optional[dict] = None) -> dict:
    """The run's fairness numbers: ``jain_tokens``, ``jain_tokens_demand`` (demand-normalised),
    ``max_min_tokens`` (raw), ``jain_residency``, ``jain_residency_demand``, ``max_min_residency``.
    The demand-normalised indices are :func:`~fairlib.analysis.demand_normalised_jain` of the
    service over the demand; for residency the demand is priced in machine seconds, ``demand_i x
    machine_s_i / service_i`` (the mean price for a tenant that got no service).

    Parameters
    ----------
    run : Run, str, pathlib.Path or pandas.DataFrame
        The run (anything ``as_run`` takes).
    window : {"load", "all"} or tuple of float, default "load"
        ``"load"`` = ``[0, duration_s)``, ``"all"`` (or None) = every time, or ``(lo, hi)`` in s.
    tenant_names : sequence of str, optional
        The tenants, in order (default ``Run.tenant_names``).
    tick_tol_s : float, optional
        Chunk times closer than this (s) are one tick; default ``min(0.005, 0.2 * g)``, ``g``
        the median gap between a stream's consecutive chunks.
    intervals : dict, optional
        The run's :func:`build_intervals` for these tenants and ``tick_tol_s`` (built here when
        not given).

    Returns
    -------
    dict
        The six numbers above (NaN where nothing was served or demanded).

    Raises
    ------
    ValueError
        ``intervals`` built for other tenants or another ``tick_tol_s``, or a record naming an
        unknown tenant.
    """
    run = as_run(run)
    ts = token_service(run, window, tenant_names)
    rs = residency(run, window, tenant_names, tick_tol_s, intervals=intervals)
    svc, dem = ts["service"].to_numpy(), ts["demand"].to_numpy()
    mach = rs["machine_s"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        price = np.where(svc > 0, mach / svc, np.nan)          # machine s per token-weighted unit
    mean_price = np.nanmean(price) if np.any(~np.isnan(price)) else np.nan
    mdem = dem * np.where(np.isnan(price), mean_price, price)   # demand in machine seconds
    out = {
        "jain_tokens": jain_index(svc) if svc.max() > 0 else math.nan,
        "jain_tokens_demand": demand_normalised_jain(svc, dem) if dem.max() > 0 else math.nan,
        "max_min_tokens": max_min_ratio(svc) if svc.max() > 0 else math.nan,
        "jain_residency": jain_index(mach) if mach.max() > 0 else math.nan,
        "jain_residency_demand": (demand_normalised_jain(mach, np.nan_to_num(mdem))
                                  if np.nan_to_num(mdem).max() > 0 else math.nan),
        "max_min_residency": max_min_ratio(mach) if mach.max() > 0 else math.nan,
    }
    return out
