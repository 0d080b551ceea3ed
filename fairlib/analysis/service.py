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
  residency over the tenants that had a request outstanding in that window.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pandas as pd

from fairlib.analysis.common import DECODE_WEIGHT, PREFILL_WEIGHT, as_run, numeric, tenant_index, tenant_names_of
from fairlib.analysis.indices import demand_normalised_jain, jain_index, max_min_ratio
from fairlib.records import Run

__all__ = ["chunks", "load_window", "token_service", "build_intervals", "stream_intervals", "fit_iteration_cost",
           "residency", "windowed_fairness", "fairness"]



# --- service: tokens -----------------------------------------------------------------------------
def chunks(records: pd.DataFrame):
    """Flattened chunks: (times_s, tokens, row index)."""
    times, toks, rows = [], [], []
    for r, (ct, ck) in enumerate(zip(records["chunk_times_s"], records["chunk_tokens"])):
        if ct is None or (isinstance(ct, float) and math.isnan(ct)) or len(ct) == 0:
            continue
        ct = np.asarray(ct, dtype=np.float64)
        ck = np.ones(len(ct)) if ck is None or len(ck) != len(ct) else np.asarray(ck, dtype=np.float64)
        times.append(ct)
        toks.append(ck)
        rows.append(np.full(len(ct), r, dtype=np.int64))
    if not times:
        return np.zeros(0), np.zeros(0), np.zeros(0, np.int64)
    return np.concatenate(times), np.concatenate(toks), np.concatenate(rows)


def load_window(run: Run, window):
    if window == "all" or window is None:
        return (-math.inf, math.inf)
    if window == "load":
        d = run.duration_s
        return (0.0, d) if math.isfinite(d) else (-math.inf, math.inf)
    lo, hi = window
    return (float(lo), float(hi))


def token_service(run, window="load", tenant_names=None, wp: float = PREFILL_WEIGHT,
                  wq: float = DECODE_WEIGHT) -> pd.DataFrame:
    """Per tenant, inside ``window`` (``"load"`` = ``[0, duration_s)``, ``"all"``, or ``(lo, hi)``
    seconds): ``prompt_tokens`` served (prefills whose first token came in the window),
    ``output_tokens`` emitted, ``service = wp*prompt + wq*output``, ``demand = wp*prompt +
    wq*max_tokens`` over the requests sent in the window, ``served_frac`` and ``share``."""
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
def stream_intervals(records: pd.DataFrame, tenant_names=None, tick_tol_s: Optional[float] = None):
    """The slot-holding intervals of every stream: ``(start_s, end_s, tenant_index)`` arrays.
    (:func:`build_intervals` also gives each interval's tick, whether it is a first token, and the
    request's prompt length.)

    For each request with token chunks at ``t_1 < ... < t_n``: ``(t_{k-1}, t_k]`` for ``k >= 2``
    and the first-token iteration ``(max(send, previous tick), t_1]``, where the ticks are the
    chunk times of all streams, clustered within ``tick_tol_s`` (default ``min(5 ms, 0.2 x``
    the median gap between a stream's consecutive chunks)): the previous tick is when the
    iteration before the first-token one ended."""
    iv = build_intervals(records, tenant_names, tick_tol_s)
    return iv["start"], iv["end"], iv["tenant"]


def build_intervals(records: pd.DataFrame, tenant_names=None, tick_tol_s: Optional[float] = None) -> dict:
    """The intervals of :func:`stream_intervals` with all :func:`residency`, :func:`fairness` and
    :func:`windowed_fairness` need of them: build them once per run and pass them as
    ``intervals=``. Arrays per interval: start, end, tenant, tick (of its end), first (a
    first-token interval), prompt (its request's prompt tokens); and ``n_ticks``, ``names`` (the
    tenants) and ``tick_tol_s`` (as given) they were built for."""
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


def _intervals_for(records: pd.DataFrame, names: list, tick_tol_s, intervals: Optional[dict]) -> dict:
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
    model itself the fit is exact; on a real engine only as good as the linear model."""
    return _fit_ticks(build_intervals(records, None, tick_tol_s))


def _tick_table(iv: dict):
    k = iv["n_ticks"]
    tick = iv["tick"]
    B = np.bincount(tick, minlength=k).astype(float)
    P = np.bincount(tick, weights=iv["prompt"] * iv["first"], minlength=k)
    d = pd.DataFrame({"tick": tick, "start": iv["start"], "end": iv["end"]}).groupby("tick")
    s = d["start"].median().reindex(range(k)).to_numpy()
    e = d["end"].median().reindex(range(k)).to_numpy()
    return B, P, (e - s) * 1e3


def _fit_ticks(iv: dict) -> dict:
    nan = {"iter_base_ms": math.nan, "iter_slope_ms": math.nan, "prefill_ms_per_token": math.nan,
           "r2": math.nan, "n_ticks": 0}
    if iv["n_ticks"] < 3:
        return nan
    B, P, dt = _tick_table(iv)
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


def _sweep(starts, ends, ten, n_t, edges=()):
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


def residency(run, window="load", tenant_names=None, tick_tol_s: Optional[float] = None,
              prefill: str = "split", *, intervals: Optional[dict] = None) -> pd.DataFrame:
    """Each tenant's machine time (s) and share, rebuilt from the stream timings, inside
    ``window`` (as in :func:`token_service`). Also ``busy_s`` (the time any stream was active).

    ``prefill="split"`` (the definition): a sweep line over :func:`stream_intervals`, each
    instant split equally among the streams active then. ``prefill="fitted"``: the same, then per
    tick (iteration) the prefill part ``prefill * P`` of its duration, with the cost fitted by
    :func:`fit_iteration_cost`, moves to the streams whose first token it produced (in proportion
    to their prompts): on the engine model this is exactly the simulator's residency charge,
    prefill included. Fitted results carry the fit in ``attrs["fit"]``. ``intervals``: the run's
    :func:`build_intervals` (built here when not given)."""
    run = as_run(run)
    rec = run.records
    names = tenant_names_of(rec, tenant_names or run.tenant_names)
    lo, hi = load_window(run, window)
    if prefill not in ("split", "fitted"):
        raise ValueError(f"residency: prefill must be 'split' or 'fitted', got {prefill!r}")
    iv = _intervals_for(rec, names, tick_tol_s, intervals)
    if prefill == "fitted":
        return _residency_fitted(iv, len(names), lo, hi)
    machine, busy = _machine_in_window(iv["start"], iv["end"], iv["tenant"], len(names), lo, hi)
    tot = machine.sum()
    return pd.DataFrame({"machine_s": machine, "share": machine / tot if tot > 0 else np.nan,
                         "busy_s": busy}, index=pd.Index(names, name="tenant"))


def _machine_in_window(s, e, ten, n_t, lo, hi):
    """Each tenant's equal-split machine time inside [lo, hi) and the busy time there."""
    edges = [x for x in (lo, hi) if math.isfinite(x)]
    b, m = _sweep(s, e, ten, n_t, edges)
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
    fit = _fit_ticks(iv)
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


# --- fairness ------------------------------------------------------------------------------------
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
    (``jain_tokens``, ``jain_residency``; ``active`` = how many). ``intervals``: the run's
    :func:`build_intervals` (built here when not given)."""
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
    # tokens
    times, toks, rows = chunks(rec)
    w_of = np.floor(times / window_s).astype(np.int64) if times.size else np.zeros(0, np.int64)
    ok = (w_of >= 0) & (w_of < nw)
    tok = np.zeros((len(names), nw))
    np.add.at(tok, (t[rows[ok]], w_of[ok]), wq * toks[ok])
    first = numeric(rec, "first_token_s")
    prompt = numeric(rec, "prompt_tokens")
    fw = np.floor(first / window_s)
    okf = ~np.isnan(fw) & (fw >= 0) & (fw < nw)
    np.add.at(tok, (t[okf], fw[okf].astype(np.int64)), wp * prompt[okf])
    # residency
    iv = _intervals_for(rec, names, tick_tol_s, intervals)
    b, m = _sweep(iv["start"], iv["end"], iv["tenant"], len(names), edges)
    res = np.zeros((len(names), nw))
    if m.shape[1]:
        mid = 0.5 * (b[:-1] + b[1:])
        wi = np.floor(mid / window_s).astype(np.int64)
        okr = (wi >= 0) & (wi < nw)
        for i in range(len(names)):
            res[i] = np.bincount(wi[okr], weights=m[i, okr], minlength=nw)[:nw]
    # who had work outstanding
    o0, o1 = _outstanding(rec)
    active = np.zeros((len(names), nw), dtype=bool)
    for i in range(len(names)):
        mine = (t == i) & ~np.isnan(o0)
        for a, z in zip(o0[mine], o1[mine]):
            k0 = max(0, int(a // window_s))                       # outstanding over [a, z): half-open
            k1 = min(nw - 1, int(math.ceil(z / window_s)) - 1 if z > a else k0)
            if k0 <= k1:
                active[i, k0:k1 + 1] = True
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


def fairness(run, window="load", tenant_names=None, tick_tol_s: Optional[float] = None, *,
             intervals: Optional[dict] = None) -> dict:
    """The run's fairness numbers: ``jain_tokens``, ``jain_tokens_demand`` (demand-normalised),
    ``max_min_tokens`` (raw), ``jain_residency``, ``jain_residency_demand``, ``max_min_residency``.
    ``intervals``: the run's :func:`build_intervals` (built here when not given)."""
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
