"""What each tenant got of the machine: token-weighted service and residency, per window.

- **Token-weighted service** (VTC): ``1 x`` prompt tokens (counted when the first token arrives)
  ``+ 2 x`` output tokens (counted at each chunk), inside the load window ``[0, duration_s)``.
  Demand: the same weights over what the tenant asked for (``prompt + 2 x max_tokens`` of each
  request sent in the window). Jain and max/min are reported raw and **demand-normalised**: Jain
  of ``service_i / fair_i``, ``fair`` the max-min fair (water-filling) split of the service
  delivered among the demands. Raw Jain calls a fair scheduler unfair when tenants offer
  different loads; the normalised one does not.
- **Residency** (who was in the batch at each token): each request held one batch slot during
  every gap between its consecutive token chunks, and during its first-token iteration, which is
  taken to start at the later of its send time and the previous "tick" of the whole run (chunk
  times of all streams, clustered within ``min(5 ms, 0.2 x median gap)``). A sweep line over all
  these intervals divides each instant equally among the streams active at that instant: each
  tenant's machine time and share. On the engine model with no prefill cost this is exactly the
  simulator's residency charge ``dt/B`` (a test); with prefill it splits prefill time equally
  instead of charging it to the admitted request. ``residency(..., prefill="fitted")`` prices
  prefill instead: the same timings fit ``dt = iter_base + iter_slope * B + prefill * P`` per
  iteration (:func:`fit_iteration_cost`), and each iteration's ``prefill * P`` goes to the
  streams it started; on the engine model that is exactly the simulator's charge.
- **Windowed Jain**: per window (default 10 s), Jain of raw token-weighted service and of
  residency over the tenants that had a request outstanding in that window
  (``fairlib.analysis.run_fairness``, with the whole run's indices).

The stream intervals, the sweep line and the cost fit live in ``fairlib.analysis.intervals``
(re-exported here), the records' chunks and windows in ``fairlib.analysis.common``.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pandas as pd

from fairlib.analysis.common import (DECODE_WEIGHT, PREFILL_WEIGHT, as_run, chunks, load_window, numeric,
                                     tenant_index, tenant_names_of)
from fairlib.analysis.intervals import (build_intervals, fit_iteration_cost, fit_ticks, intervals_for,
                                        stream_intervals, sweep)

__all__ = ["chunks", "load_window", "token_service", "build_intervals", "stream_intervals", "fit_iteration_cost",
           "residency"]


# --- service: tokens -----------------------------------------------------------------------------
def token_service(run, window="load", tenant_names=None, wp: float = PREFILL_WEIGHT,
                  wq: float = DECODE_WEIGHT) -> pd.DataFrame:
    """Per tenant, inside ``window`` (``"load"`` = ``[0, duration_s)``, ``"all"``, or ``(lo, hi)``
    seconds): ``prompt_tokens`` served (prefills whose first token came in the window),
    ``output_tokens`` emitted, ``service = wp*prompt + wq*output``, ``demand = wp*prompt +
    wq*max_tokens`` over the requests sent in the window, ``served_frac`` and ``share``.

    Parameters
    ----------
    run : Run, str, pathlib.Path or pandas.DataFrame
        The run (anything ``as_run`` takes).
    window : {"load", "all"} or tuple of float, default "load"
        ``"load"`` = ``[0, duration_s)``, ``"all"`` (or None) = every time, or ``(lo, hi)`` in s.
    tenant_names : sequence of str, optional
        The tenants, in order (default ``Run.tenant_names``).
    wp : float, default PREFILL_WEIGHT
        Weight of a prompt token (1).
    wq : float, default DECODE_WEIGHT
        Weight of an output token (2).

    Returns
    -------
    pandas.DataFrame
        Index ``tenant``; columns ``prompt_tokens``, ``output_tokens``, ``service``, ``demand``,
        ``served_frac`` (service / demand, NaN without demand) and ``share`` (service / total).

    Raises
    ------
    ValueError
        A record naming a tenant not in ``tenant_names``, or a run ``as_run`` refuses.
    """
    run = as_run(run)
    rec = run.records
    names = tenant_names_of(rec, tenant_names or run.tenant_names)
    t = tenant_index(rec, names)
    lo, hi = load_window(run, window)
    first = numeric(rec, "first_token_s")
    sends = numeric(rec, "actual_send_s")
    intended = numeric(rec, "intended_send_s")
    prompt = numeric(rec, "prompt_tokens")
    maxt = numeric(rec, "max_tokens")
    times, toks, rows = chunks(rec)
    inwin = (times >= lo) & (times < hi)
    out_tok = np.bincount(t[rows[inwin]], weights=toks[inwin], minlength=len(names)) if len(rows) else np.zeros(len(names))
    pf = (first >= lo) & (first < hi)
    p_tok = np.bincount(t[pf], weights=prompt[pf], minlength=len(names))
    when = np.where(np.isnan(sends), intended, sends)
    asked = (when >= lo) & (when < hi)
    demand = np.bincount(t[asked], weights=wp * prompt[asked] + wq * maxt[asked], minlength=len(names))
    service = wp * p_tok + wq * out_tok
    tot = service.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(demand > 0, service / demand, np.nan)
    out = pd.DataFrame({"prompt_tokens": p_tok, "output_tokens": out_tok, "service": service, "demand": demand,
                        "served_frac": frac, "share": service / tot if tot > 0 else np.nan},
                       index=pd.Index(names, name="tenant"))
    return out


# --- service: residency --------------------------------------------------------------------------
def residency(run, window="load", tenant_names=None, tick_tol_s: Optional[float] = None,
              prefill: str = "split", *, intervals: Optional[dict] = None) -> pd.DataFrame:
    """Each tenant's machine time (s) and share, rebuilt from the stream timings, inside
    ``window`` (as in :func:`token_service`). Also ``busy_s`` (the time any stream was active).

    ``prefill="split"`` (the definition): a sweep line over :func:`stream_intervals`, each
    instant split equally among the streams active then. ``prefill="fitted"``: the same, then per
    tick (iteration) the prefill part ``prefill * P`` of its duration, with the cost fitted by
    :func:`fit_iteration_cost`, moves to the streams whose first token it produced (in proportion
    to their prompts): on the engine model this is exactly the simulator's residency charge,
    prefill included. Fitted results carry the fit in ``attrs["fit"]``.

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
    prefill : {"split", "fitted"}, default "split"
        How prefill time is attributed (above).
    intervals : dict, optional
        The run's :func:`build_intervals` for these tenants and ``tick_tol_s`` (built here when
        not given).

    Returns
    -------
    pandas.DataFrame
        Index ``tenant``; columns ``machine_s``, ``share`` (machine_s / total, NaN when none) and
        ``busy_s``.

    Raises
    ------
    ValueError
        ``prefill`` not ``"split"`` or ``"fitted"``, ``intervals`` built for other tenants or
        another ``tick_tol_s``, or a record naming an unknown tenant.
    """
    run = as_run(run)
    rec = run.records
    names = tenant_names_of(rec, tenant_names or run.tenant_names)
    lo, hi = load_window(run, window)
    if prefill not in ("split", "fitted"):
        raise ValueError(f"residency: prefill must be 'split' or 'fitted', got {prefill!r}")
    iv = intervals_for(rec, names, tick_tol_s, intervals)
    if prefill == "fitted":
        return _residency_fitted(iv, len(names), lo, hi)
    machine, busy = _machine_in_window(iv["start"], iv["end"], iv["tenant"], len(names), lo, hi)
    tot = machine.sum()
    return pd.DataFrame({"machine_s": machine, "share": machine / tot if tot > 0 else np.nan,
                         "busy_s": busy}, index=pd.Index(names, name="tenant"))


def _machine_in_window(s, e, ten, n_t, lo, hi):
    """Each tenant's equal-split machine time inside [lo, hi) and the busy time there."""
    edges = [x for x in (lo, hi) if math.isfinite(x)]
    b, m = sweep(s, e, ten, n_t, edges)
    if not m.shape[1]:
        return np.zeros(n_t), 0.0
    mid = 0.5 * (b[:-1] + b[1:])
    keep = (mid >= lo) & (mid < hi)
    return m[:, keep].sum(axis=1), float(np.diff(b)[keep][m[:, keep].sum(axis=0) > 0].sum())


def _residency_fitted(iv: dict, n_t: int, lo, hi) -> pd.DataFrame:
    """The equal split (sweep line), corrected per tick for prefill: a tick (iteration) whose
    streams include first tokens with prompt tokens ``P`` (``p_r`` each) spent ``c * P`` of its
    time on prefill (``c`` fitted); that goes to those streams instead of being split equally, so
    stream ``r`` gains ``c * (p_r - P / B)``. On the engine model this gives ``(dt - c P) / B +
    c p_r``: exactly the simulator's residency charge."""
    fit = fit_ticks(iv)
    s, e, ten = iv["start"], iv["end"], iv["tenant"]
    machine, busy = _machine_in_window(s, e, ten, n_t, lo, hi)
    c = fit["prefill_ms_per_token"]
    if iv["n_ticks"] and not math.isnan(c) and c > 0:
        k = iv["tick"]
        nk = iv["n_ticks"]
        B = np.bincount(k, minlength=nk).astype(float)
        P = np.bincount(k, weights=iv["prompt"] * iv["first"], minlength=nk)
        adj = c * (iv["prompt"] * iv["first"] - P[k] / B[k]) / 1e3        # seconds, per interval
        inwin = (e >= lo) & (e < hi)
        machine = machine + np.bincount(ten[inwin], weights=adj[inwin], minlength=n_t)
        machine = np.maximum(machine, 0.0)
    tot = machine.sum()
    out = pd.DataFrame({"machine_s": machine, "share": machine / tot if tot > 0 else np.nan, "busy_s": busy},
                       index=pd.Index(iv["names"], name="tenant"))
    out.attrs["fit"] = fit
    return out
