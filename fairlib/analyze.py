"""tenantbench metrics of a run's records, one code path for simulated and measured runs.

Every function here takes the records of one run (``fairlib.client.load_records`` of a measured
run directory, or ``fairlib.records.simulate_records``: the same columns) or a
``fairlib.records.Run`` (records + config + summary). Times in the records are seconds on the run
clock; tables report milliseconds.

Definitions (shared/reference/serving-metrics.md; the client's record fields):

- **Latency**: TTFT = first token chunk - actual send; TPOT = (E2E - TTFT) / (tokens - 1);
  E2E = last token chunk - actual send; over the requests that completed (``error_class ==
  "none"``); percentiles p50/p90/p99 (``np.percentile``, linear) with 95% percentile-bootstrap
  intervals (``fairlib.metrics.percentile_cis``; IID resampling: optimistic for queueing series).
- **SLO goodput** (DistServe): completed requests per second of the load window that met both the
  tenant's TTFT and TPOT SLOs (a one-token answer has no TPOT and meets it); attainment = those
  over the requests sent.
- **Starvation incidence**: among the requests the server accepted (not refused with 429/4xx, not
  a connection failure), the fraction whose TTFT exceeded ``10 x`` the tenant's TTFT SLO or that
  never got a first token.
- **Token-weighted service** (VTC): ``1 x`` prompt tokens (counted when the first token arrives)
  ``+ 2 x`` output tokens (counted at each chunk), inside the load window ``[0, duration_s)``.
  Demand: the same weights over what the tenant asked for (``prompt + 2 x max_tokens`` of each
  request sent in the window). Jain and max/min are reported raw and **demand-normalised**:
  Jain of ``service_i / fair_i``, ``fair`` the max-min fair (water-filling) split of the service
  delivered among the demands (``fairlib.metrics.demand_normalised_jain``). Raw Jain calls a fair
  scheduler unfair when tenants offer different loads; the normalised one does not.
- **Residency** (who was in the batch at each token): each request held one batch slot during
  every gap between its consecutive token chunks, and during its first-token iteration, which is
  taken to start at the later of its send time and the previous "tick" of the whole run (chunk
  times of all streams, clustered within ``min(5 ms, 0.2 x median gap)``). A sweep line over all
  these intervals divides each instant equally among the streams active at that instant: each
  tenant's machine time and share. On the engine model with no prefill cost this is exactly the
  simulator's residency charge ``dt/B`` (a test); with prefill it splits prefill time equally
  instead of charging it to the admitted request; a preempted stream is counted as resident
  during its gap. ``residency(..., prefill="fitted")`` prices prefill instead: the same
  timings fit ``dt = iter_base + iter_slope * B + prefill * P`` per iteration
  (:func:`fit_iteration_cost`), and each iteration's ``prefill * P`` goes to the streams it
  started; on the engine model that is exactly the simulator's charge, prefill included.
  Demand-normalised residency uses each tenant's machine time per served token-weighted unit to
  price its demand.
- **Windowed Jain**: per window (default 10 s), Jain of raw token-weighted service and of
  residency over the tenants that had a request outstanding in that window.
- **Victim degradation**: a tenant's p99 TTFT/E2E and goodput in the contention run over the same
  in the baseline run (the victim alone at the same rate).
- **Validity**: from ``summary.json``: p99 schedule lag against the run's threshold, requested vs
  achieved send rate.

CLI: ``fairlib analyze --run DIR [DIR ...] --out report.md [--plots] [--baseline DIR ...]``.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from .metrics import demand_normalised_jain, jain_index, max_min_ratio, percentile_cis
from .records import Run, load_run

__all__ = ["QS", "STARVATION_FACTOR", "PREFILL_WEIGHT", "DECODE_WEIGHT", "REFUSED", "as_run",
           "latency", "latency_wide", "goodput", "starvation", "token_service", "stream_intervals",
           "residency", "fit_iteration_cost", "windowed_fairness", "fairness", "victim_degradation", "validity",
           "RunAnalysis", "analyze_run", "tenant_table", "combine", "pooled_latency", "ci_table",
           "fairness_table", "validity_table",
           "latency_chart", "share_chart", "windowed_chart", "report", "main",
           "LIVE_ENGINES", "SOURCES", "tenant_latency", "latency_overview", "victim_table", "victim_overview",
           "goodput_chart", "saved_live_runs", "engine_of", "analyze_pairs", "live_table", "live_validity",
           "live_victims", "live_chart"]

QS = (50, 90, 99)
STARVATION_FACTOR = 10.0
PREFILL_WEIGHT, DECODE_WEIGHT = 1.0, 2.0
#: Error classes of requests the server refused, or that never reached it: not "starved".
REFUSED = ("http_429", "http_4xx", "connect_error", "client_error")


# --- inputs ------------------------------------------------------------------------------------
def as_run(x) -> Run:
    """A :class:`~fairlib.records.Run` from a Run, a run directory path or a records DataFrame."""
    if isinstance(x, Run):
        return x
    if isinstance(x, pd.DataFrame):
        return Run(x)
    if isinstance(x, (str, Path)):
        return load_run(x)
    raise ValueError(f"expected a Run, a run directory or a records DataFrame, got {type(x).__name__}")


def _names(records: pd.DataFrame, tenant_names=None) -> list:
    if tenant_names is not None:
        return [str(n) for n in tenant_names]
    pairs = records[["tenant", "tenant_name"]].drop_duplicates().sort_values("tenant", kind="mergesort")
    return [str(n) for n in pairs["tenant_name"]]


def _tenant_idx(records: pd.DataFrame, names: list) -> np.ndarray:
    pos = {n: i for i, n in enumerate(names)}
    idx = np.array([pos.get(str(n), -1) for n in records["tenant_name"]], dtype=np.int64)
    if len(idx) and idx.min() < 0:
        unknown = sorted({str(n) for n in records["tenant_name"]} - set(names))
        raise ValueError(f"records name tenants {unknown} that are not in tenant_names {names}")
    return idx


def _num(records: pd.DataFrame, col: str) -> np.ndarray:
    return pd.to_numeric(records[col], errors="coerce").to_numpy(dtype=np.float64)


def _ok(records: pd.DataFrame) -> np.ndarray:
    return (records["error_class"] == "none").to_numpy()


def _slo_of(slos: Mapping, name: str) -> tuple:
    if name not in slos:
        raise ValueError(f"no SLO for tenant {name!r} (SLOs given for {sorted(slos)})")
    s = slos[name]
    if isinstance(s, Mapping):
        return float(s["ttft_ms"]), float(s["tpot_ms"])
    return float(s[0]), float(s[1])


# --- latency -------------------------------------------------------------------------------------
def latency(records: pd.DataFrame, tenant_names=None, qs: Sequence[float] = QS, n_boot: int = 1000,
            seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """Per-tenant TTFT, TPOT and E2E percentiles (ms) with bootstrap intervals, over the requests
    that completed. Long format: one row per (tenant, metric, q) with ``estimate, low, high, n``."""
    names = _names(records, tenant_names)
    t = _tenant_idx(records, names)
    ok = _ok(records)
    vals = {m: _num(records, f"{m}_s") * 1e3 for m in ("ttft", "tpot", "e2e")}
    rows = []
    for i, n in enumerate(names):
        mine = ok & (t == i)
        for m, v in vals.items():
            x = v[mine]
            x = x[~np.isnan(x)]
            ci = percentile_cis(x, qs, n_boot=n_boot, seed=seed, level=level)
            for q, r in ci.iterrows():
                rows.append({"tenant": n, "metric": m, "q": q, "estimate": r["estimate"], "low": r["low"],
                             "high": r["high"], "n": int(x.size)})
    return pd.DataFrame(rows, columns=["tenant", "metric", "q", "estimate", "low", "high", "n"])


def latency_wide(lat: pd.DataFrame, with_ci: bool = False) -> pd.DataFrame:
    """The long latency table as one row per tenant: ``ttft_p50, ttft_p90, ..., e2e_p99`` (ms),
    plus ``..._low``/``..._high`` columns when ``with_ci``."""
    names = list(dict.fromkeys(lat["tenant"]))
    cols = {}
    for (m, q), g in lat.groupby(["metric", "q"], sort=False):
        key = f"{m}_p{q:g}"
        g = g.set_index("tenant").reindex(names)
        cols[key] = g["estimate"]
        if with_ci:
            cols[key + "_low"] = g["low"]
            cols[key + "_high"] = g["high"]
    out = pd.DataFrame(cols)
    out.index.name = "tenant"
    return out


# --- SLOs ----------------------------------------------------------------------------------------
def goodput(records: pd.DataFrame, slos: Mapping, duration_s: float, tenant_names=None) -> pd.DataFrame:
    """Per tenant: ``sent``, ``completed``, ``met_ttft``, ``met_tpot``, ``met_both``,
    ``attainment`` (met_both / sent), ``goodput_rps`` (met_both / duration_s) and
    ``throughput_rps`` (completed / duration_s). ``slos``: name -> (ttft_ms, tpot_ms)."""
    if not (isinstance(duration_s, (int, float, np.integer, np.floating)) and duration_s > 0):
        raise ValueError(f"goodput: duration_s must be a number > 0, got {duration_s!r}")
    names = _names(records, tenant_names)
    t = _tenant_idx(records, names)
    ok = _ok(records)
    sent = ~np.isnan(_num(records, "actual_send_s"))
    ttft = _num(records, "ttft_s") * 1e3
    tpot = _num(records, "tpot_s") * 1e3
    rows = []
    for i, n in enumerate(names):
        slo_ttft, slo_tpot = _slo_of(slos, n)
        mine = t == i
        done = mine & ok
        m_ttft = done & (ttft <= slo_ttft)
        m_tpot = done & (np.isnan(tpot) | (tpot <= slo_tpot))
        both = m_ttft & m_tpot
        n_sent = int((mine & sent).sum())
        rows.append({"tenant": n, "ttft_slo_ms": slo_ttft, "tpot_slo_ms": slo_tpot, "sent": n_sent,
                     "completed": int(done.sum()), "met_ttft": int(m_ttft.sum()), "met_tpot": int(m_tpot.sum()),
                     "met_both": int(both.sum()),
                     "attainment": both.sum() / n_sent if n_sent else math.nan,
                     "goodput_rps": both.sum() / duration_s, "throughput_rps": done.sum() / duration_s})
    return pd.DataFrame(rows).set_index("tenant")


def starvation(records: pd.DataFrame, slos: Mapping, factor: float = STARVATION_FACTOR,
               tenant_names=None) -> pd.DataFrame:
    """Per tenant: ``accepted`` (sent and not refused: see ``REFUSED``), ``starved`` (TTFT over
    ``factor x`` the TTFT SLO, or no first token at all), ``incidence`` = starved / accepted,
    and ``refused`` (429/4xx/connection failures)."""
    names = _names(records, tenant_names)
    t = _tenant_idx(records, names)
    sent = ~np.isnan(_num(records, "actual_send_s"))
    refused = records["error_class"].isin(REFUSED).to_numpy()
    ttft = _num(records, "ttft_s") * 1e3
    rows = []
    for i, n in enumerate(names):
        slo_ttft, _ = _slo_of(slos, n)
        mine = t == i
        acc = mine & sent & ~refused
        starved = acc & (np.isnan(ttft) | (ttft > factor * slo_ttft))
        na = int(acc.sum())
        rows.append({"tenant": n, "accepted": na, "starved": int(starved.sum()),
                     "incidence": starved.sum() / na if na else math.nan,
                     "refused": int((mine & refused).sum())})
    return pd.DataFrame(rows).set_index("tenant")


# --- service: tokens -----------------------------------------------------------------------------
def _chunks(records: pd.DataFrame):
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


def _window(run: Run, window):
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
    names = _names(rec, tenant_names or run.tenant_names)
    t = _tenant_idx(rec, names)
    lo, hi = _window(run, window)
    first = _num(rec, "first_token_s")
    sends = _num(rec, "actual_send_s")
    intended = _num(rec, "intended_send_s")
    prompt = _num(rec, "prompt_tokens")
    maxt = _num(rec, "max_tokens")
    times, toks, rows = _chunks(rec)
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
    (:func:`_intervals` also gives each interval's tick, whether it is a first token, and the
    request's prompt length.)

    For each request with token chunks at ``t_1 < ... < t_n``: ``(t_{k-1}, t_k]`` for ``k >= 2``
    and the first-token iteration ``(max(send, previous tick), t_1]``, where the ticks are the
    chunk times of all streams, clustered within ``tick_tol_s`` (default ``min(5 ms, 0.2 x``
    the median gap between a stream's consecutive chunks)): the previous tick is when the
    iteration before the first-token one ended."""
    iv = _intervals(records, tenant_names, tick_tol_s)
    return iv["start"], iv["end"], iv["tenant"]


def _intervals(records: pd.DataFrame, tenant_names=None, tick_tol_s: Optional[float] = None) -> dict:
    """Arrays per interval: start, end, tenant, tick (of its end), first (a first-token
    interval), prompt (its request's prompt tokens); and ``n_ticks``."""
    names = _names(records, tenant_names)
    t = _tenant_idx(records, names)
    times, _, rows = _chunks(records)
    if times.size == 0:
        z = np.zeros(0)
        zi = np.zeros(0, np.int64)
        return {"start": z, "end": z, "tenant": zi, "tick": zi, "first": np.zeros(0, bool), "prompt": z,
                "n_ticks": 0}
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
    send = _num(records, "actual_send_s")[r1]
    start1 = np.fmax(np.where(np.isnan(send), -np.inf, send), prev)
    start1 = np.where(np.isfinite(start1), start1, t1)
    start1 = np.minimum(start1, t1)
    starts = np.concatenate([times[:-1][same], start1])
    ends = np.concatenate([times[1:][same], t1])
    row = np.concatenate([rows[1:][same], r1])
    tick = tick_id[np.searchsorted(g, ends, side="left")]
    first = np.concatenate([np.zeros(int(same.sum()), bool), np.ones(r1.size, bool)])
    prompt = _num(records, "prompt_tokens")[row]
    return {"start": starts, "end": ends, "tenant": t[row], "tick": tick, "first": first,
            "prompt": np.nan_to_num(prompt), "n_ticks": int(tick_start.size)}


def fit_iteration_cost(records: pd.DataFrame, tick_tol_s: Optional[float] = None) -> dict:
    """Fit the engine model's ``dt = iter_base + iter_slope * B + prefill * P`` (ms) to the
    stream timings: every tick (iteration, as seen by the streams) has a duration (median end
    minus median start of the intervals ending in it), ``B`` = the streams that emitted in it
    and ``P`` = the prompt tokens of the streams that got their first token in it. Least squares;
    returns ``iter_base_ms, iter_slope_ms, prefill_ms_per_token, r2, n_ticks``. On the engine
    model itself the fit is exact; on a real engine only as good as the linear model."""
    iv = _intervals(records, None, tick_tol_s)
    return _fit_ticks(iv)


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
              prefill: str = "split") -> pd.DataFrame:
    """Each tenant's machine time (s) and share, rebuilt from the stream timings, inside
    ``window`` (as in :func:`token_service`). Also ``busy_s`` (the time any stream was active).

    ``prefill="split"`` (the definition): a sweep line over :func:`stream_intervals`, each
    instant split equally among the streams active then. ``prefill="fitted"``: the same, then per
    tick (iteration) the prefill part ``prefill * P`` of its duration, with the cost fitted by
    :func:`fit_iteration_cost`, moves to the streams whose first token it produced (in proportion
    to their prompts): on the engine model this is exactly the simulator's residency charge,
    prefill included. Fitted results carry the fit in ``attrs["fit"]``."""
    run = as_run(run)
    rec = run.records
    names = _names(rec, tenant_names or run.tenant_names)
    lo, hi = _window(run, window)
    if prefill == "fitted":
        return _residency_fitted(rec, names, lo, hi, tick_tol_s)
    if prefill != "split":
        raise ValueError(f"residency: prefill must be 'split' or 'fitted', got {prefill!r}")
    s, e, ten = stream_intervals(rec, names, tick_tol_s)
    machine, busy = _machine_in_window(s, e, ten, len(names), lo, hi)
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


def _residency_fitted(rec, names, lo, hi, tick_tol_s) -> pd.DataFrame:
    """The equal split (sweep line), corrected per tick for prefill: a tick (iteration) whose
    streams include first tokens with prompt tokens ``P`` (``p_r`` each) spent ``c * P`` of its
    time on prefill (``c`` fitted); that goes to those streams instead of being split equally, so
    stream ``r`` gains ``c * (p_r - P / B)``. On the engine model this gives ``(dt - c P) / B +
    c p_r``: exactly the simulator's residency charge."""
    iv = _intervals(rec, names, tick_tol_s)
    fit = _fit_ticks(iv)
    n_t = len(names)
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
                       index=pd.Index(names, name="tenant"))
    out.attrs["fit"] = fit
    return out


# --- fairness ------------------------------------------------------------------------------------
def _outstanding(records: pd.DataFrame):
    """Each request's (start, end) of having work outstanding: send to last event."""
    send = _num(records, "actual_send_s")
    end = np.fmax(_num(records, "last_token_s"), _num(records, "end_s"))
    end = np.where(np.isnan(end), send, end)
    return send, end


def windowed_fairness(run, window_s: float = 10.0, tenant_names=None, tick_tol_s: Optional[float] = None,
                      wp: float = PREFILL_WEIGHT, wq: float = DECODE_WEIGHT, end_s: Optional[float] = None) -> pd.DataFrame:
    """Per window of ``window_s`` seconds from 0 to the load window's end (``end_s``; default the
    run's ``duration_s``, else the last token): raw token-weighted service and residency per
    tenant, and their Jain indices over the tenants that had a request outstanding in the window
    (``jain_tokens``, ``jain_residency``; ``active`` = how many)."""
    run = as_run(run)
    rec = run.records
    if not (isinstance(window_s, (int, float)) and window_s > 0):
        raise ValueError(f"window_s must be a number > 0, got {window_s!r}")
    names = _names(rec, tenant_names or run.tenant_names)
    t = _tenant_idx(rec, names)
    if end_s is None:
        end_s = run.duration_s
        if not math.isfinite(end_s):
            end_s = float(np.nanmax(_num(rec, "last_token_s"))) if len(rec) else 0.0
    nw = max(1, int(math.ceil(end_s / window_s - 1e-9)))
    edges = np.arange(nw + 1) * float(window_s)
    # tokens
    times, toks, rows = _chunks(rec)
    w_of = np.floor(times / window_s).astype(np.int64) if times.size else np.zeros(0, np.int64)
    ok = (w_of >= 0) & (w_of < nw)
    tok = np.zeros((len(names), nw))
    np.add.at(tok, (t[rows[ok]], w_of[ok]), wq * toks[ok])
    first = _num(rec, "first_token_s")
    prompt = _num(rec, "prompt_tokens")
    fw = np.floor(first / window_s)
    okf = ~np.isnan(fw) & (fw >= 0) & (fw < nw)
    np.add.at(tok, (t[okf], fw[okf].astype(np.int64)), wp * prompt[okf])
    # residency
    s, e, ten = stream_intervals(rec, names, tick_tol_s)
    b, m = _sweep(s, e, ten, len(names), edges)
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


def fairness(run, window="load", tenant_names=None, tick_tol_s: Optional[float] = None) -> dict:
    """The run's fairness numbers: ``jain_tokens``, ``jain_tokens_demand`` (demand-normalised),
    ``max_min_tokens`` (raw), ``jain_residency``, ``jain_residency_demand``, ``max_min_residency``."""
    run = as_run(run)
    ts = token_service(run, window, tenant_names)
    rs = residency(run, window, tenant_names, tick_tol_s)
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


# --- victim and validity -------------------------------------------------------------------------
def _tenant_ms(runs: Sequence[Run], tenant: str) -> dict:
    """``{"ttft": ms, "e2e": ms}``: the successful requests of ``tenant`` over ``runs``."""
    recs = pd.concat([r.records for r in runs], ignore_index=True)
    mine = (recs["tenant_name"].astype(str) == tenant).to_numpy() & _ok(recs)
    out = {}
    for m in ("ttft", "e2e"):
        x = _num(recs, f"{m}_s")[mine] * 1e3
        out[m] = x[~np.isnan(x)]
    return out


def _victim_numbers(runs: Sequence[Run], tenant: str, n_boot: int, seed: int) -> dict:
    out = {}
    for m, x in _tenant_ms(runs, tenant).items():
        ci = percentile_cis(x, (50, 99), n_boot=n_boot, seed=seed)
        out[f"{m}_p50_ms"] = ci.loc[50.0, "estimate"]
        out[f"{m}_p99_ms"] = ci.loc[99.0, "estimate"]
        out[f"{m}_p99_low"] = ci.loc[99.0, "low"]
        out[f"{m}_p99_high"] = ci.loc[99.0, "high"]
    gps, att = [], []
    for r in runs:
        if tenant not in r.slos:
            raise ValueError(f"victim_degradation: run {r.name!r} has no SLO for {tenant!r}")
        g = goodput(r.records, r.slos, r.duration_s, tenant_names=r.tenant_names)
        gps.append(g.loc[tenant, "goodput_rps"])
        att.append(g.loc[tenant, "attainment"])
    out["goodput_rps"] = float(np.mean(gps))
    out["attainment"] = float(np.mean(att))
    return out


def victim_degradation(contention, baseline, tenant: Optional[str] = None, n_boot: int = 1000,
                       seed: int = 0) -> pd.DataFrame:
    """The victim's numbers under contention, alone (the baseline run: the victim alone at the same
    rate) and their ratio (contention / alone): p50 and p99 TTFT and E2E (ms, over the pooled
    completed requests of the runs given), goodput (requests/s meeting both SLOs, mean over runs)
    and SLO attainment. A latency ratio above 1 and a goodput ratio below 1 are the damage.
    ``tenant`` defaults to the contention scenario's ``victim``."""
    cons = [as_run(r) for r in (contention if isinstance(contention, (list, tuple)) else [contention])]
    bases = [as_run(r) for r in (baseline if isinstance(baseline, (list, tuple)) else [baseline])]
    if not cons or not bases:
        raise ValueError("victim_degradation needs at least one contention run and one baseline run")
    tenant = tenant or cons[0].scenario.get("victim")
    if tenant is None:
        raise ValueError("victim_degradation: name the tenant (the scenario names no victim)")
    a = _victim_numbers(cons, tenant, n_boot, seed)
    b = _victim_numbers(bases, tenant, n_boot, seed)
    keys = ["ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms", "goodput_rps", "attainment"]
    rows = []
    for k in keys:
        ratio = a[k] / b[k] if b[k] not in (0, 0.0) and not math.isnan(b[k]) else math.nan
        rows.append({"metric": k, "contention": a[k], "alone": b[k], "ratio": ratio})
    out = pd.DataFrame(rows).set_index("metric")
    out.attrs["tenant"] = tenant
    return out


def validity(run) -> dict:
    """The run's own validity, from its summary: ``valid``, ``reason``, schedule lag p50/p99/max
    (ms) against ``threshold_ms``, ``requested_rps``, ``achieved_rps`` and their ratio, requests
    planned and completed, and the error classes seen."""
    run = as_run(run)
    s = run.summary or {}
    lag = s.get("schedule_lag_ms") or {}
    req, ach = s.get("requested_rate_rps"), s.get("achieved_rate_rps")
    errors = {k: v for k, v in (s.get("error_counts") or {}).items() if k != "none" and v}
    return {"backend": run.backend, "valid": bool(s.get("valid", False)), "reason": s.get("valid_reason"),
            "lag_p50_ms": lag.get("p50"), "lag_p99_ms": lag.get("p99"), "lag_max_ms": lag.get("max"),
            "threshold_ms": s.get("lag_threshold_ms"), "requested_rps": req, "achieved_rps": ach,
            "achieved_over_requested": (ach / req) if req and ach else None,
            "n_planned": s.get("n_planned"), "n_ok": s.get("n_ok"), "interrupted": bool(s.get("interrupted", False)),
            "errors": errors}


# --- one run, many runs --------------------------------------------------------------------------
@dataclass
class RunAnalysis:
    """Everything :func:`analyze_run` computes for one run."""

    run: Run
    latency: pd.DataFrame
    goodput: pd.DataFrame
    starvation: pd.DataFrame
    tokens: pd.DataFrame
    residency: pd.DataFrame
    fairness: dict
    windowed: pd.DataFrame
    validity: dict
    slos: dict = field(default_factory=dict)
    residency_fitted: Optional[pd.DataFrame] = None   # prefill attributed with the fitted cost
    cost_fit: dict = field(default_factory=dict)       # fit_iteration_cost of the run

    @property
    def name(self) -> str:
        return self.run.name

    @property
    def seed(self):
        return self.run.seed


def analyze_run(run, slos: Optional[Mapping] = None, window="load", window_s: float = 10.0, n_boot: int = 1000,
                seed: int = 0, tick_tol_s: Optional[float] = None) -> RunAnalysis:
    """All tenantbench metrics of one run (SLOs from the run's scenario unless given)."""
    run = as_run(run)
    names = run.tenant_names
    slos = dict(slos) if slos is not None else run.slos
    if not slos:
        raise ValueError(f"run {run.name!r}: no SLOs in its config (config.extra.scenario); pass slos=")
    dur = run.duration_s
    fitted = residency(run, window, names, tick_tol_s, prefill="fitted")
    return RunAnalysis(
        run=run,
        residency_fitted=fitted,
        cost_fit=fitted.attrs.get("fit", {}),
        latency=latency(run.records, names, n_boot=n_boot, seed=seed),
        goodput=goodput(run.records, slos, dur, names),
        starvation=starvation(run.records, slos, tenant_names=names),
        tokens=token_service(run, window, names),
        residency=residency(run, window, names, tick_tol_s),
        fairness=fairness(run, window, names, tick_tol_s),
        windowed=windowed_fairness(run, window_s, names, tick_tol_s),
        validity=validity(run),
        slos=slos,
    )


def tenant_table(a: RunAnalysis) -> pd.DataFrame:
    """One row per tenant: requests, latency percentiles (ms), SLO goodput and attainment,
    starvation, token-weighted and residency shares (%)."""
    lat = latency_wide(a.latency)
    out = pd.DataFrame(index=lat.index)
    out["requests"] = a.goodput["sent"]
    out["completed"] = a.goodput["completed"]
    for c in ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "e2e_p50", "e2e_p99"):
        out[c + "_ms"] = lat[c]
    out["goodput_rps"] = a.goodput["goodput_rps"]
    out["slo_attainment_pct"] = 100 * a.goodput["attainment"]
    out["starved_pct"] = 100 * a.starvation["incidence"]
    out["token_share_pct"] = 100 * a.tokens["share"]
    out["served_frac_pct"] = 100 * a.tokens["served_frac"]
    out["residency_share_pct"] = 100 * a.residency["share"]
    if a.residency_fitted is not None:
        out["residency_fitted_share_pct"] = 100 * a.residency_fitted["share"]
    return out


def combine(analyses: Sequence[RunAnalysis]) -> pd.DataFrame:
    """Tenant tables of several runs (seeds) of one scenario: the mean over runs, with ``_sd``
    columns (the standard deviation over runs) for the shares and tail latencies."""
    tabs = [tenant_table(a) for a in analyses]
    allt = pd.concat(tabs, keys=range(len(tabs)), names=["run", "tenant"])
    names = list(tabs[0].index)
    mean = allt.groupby(level="tenant", sort=False).mean().reindex(names)
    if len(tabs) > 1:
        sd = allt.groupby(level="tenant", sort=False).std(ddof=1).reindex(names)
        for c in ("ttft_p99_ms", "residency_share_pct", "token_share_pct"):
            mean[c + "_sd"] = sd[c]
    mean.index.name = "tenant"
    return mean


def pooled_latency(runs: Sequence, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Latency percentiles with bootstrap intervals over the pooled completed requests of
    several runs (seeds) of one scenario."""
    runs = [as_run(r) for r in runs]
    recs = pd.concat([r.records for r in runs], ignore_index=True)
    return latency(recs, runs[0].tenant_names, n_boot=n_boot, seed=seed)


def fairness_table(analyses: Sequence[RunAnalysis]) -> pd.DataFrame:
    """The fairness numbers of each run, one row per run (scenario, seed, backend)."""
    rows = []
    for a in analyses:
        extra = {}
        if a.residency_fitted is not None:
            m = a.residency_fitted["machine_s"].to_numpy()
            extra["jain_residency_fitted"] = jain_index(m) if m.max() > 0 else math.nan
        rows.append({"scenario": a.name, "seed": a.seed, "backend": a.run.backend, **a.fairness, **extra,
                     "windowed_jain_tokens_min": a.windowed["jain_tokens"].min(),
                     "windowed_jain_residency_min": a.windowed["jain_residency"].min()})
    return pd.DataFrame(rows)


def validity_table(analyses: Sequence[RunAnalysis]) -> pd.DataFrame:
    rows = []
    for a in analyses:
        v = dict(a.validity)
        v["errors"] = ", ".join(f"{k} {n}" for k, n in v["errors"].items()) or "-"
        rows.append({"scenario": a.name, "seed": a.seed, **v})
    return pd.DataFrame(rows)


# --- charts --------------------------------------------------------------------------------------
def latency_chart(lat: pd.DataFrame, metric: str = "ttft", title: Optional[str] = None, column: Optional[str] = None):
    """Points (p50, p90, p99) with their bootstrap intervals per tenant, log scale. ``lat``: a long
    latency table, optionally with a ``column`` to facet by (e.g. backend or scenario)."""
    import altair as alt
    d = lat[lat["metric"] == metric].copy()
    d["percentile"] = "p" + d["q"].map(lambda q: f"{q:g}")
    d = d.dropna(subset=["estimate"])
    for c in ("estimate", "low", "high"):
        d[c] = d[c].astype(float).round(3)
    names = list(dict.fromkeys(d["tenant"]))
    base = alt.Chart(d)
    y = alt.Y("tenant:N", sort=names, title=None)
    scale = alt.Scale(type="log")
    pts = base.mark_point(filled=True, size=50).encode(
        x=alt.X("estimate:Q", scale=scale, title=f"{metric.upper()} (ms)"), y=y,
        color=alt.Color("percentile:N", sort=["p50", "p90", "p99"]),
        shape=alt.Shape("percentile:N", sort=["p50", "p90", "p99"], legend=None))
    bars = base.mark_rule().encode(x=alt.X("low:Q", scale=scale), x2="high:Q", y=y,
                                   color=alt.Color("percentile:N", sort=["p50", "p90", "p99"]))
    ch = alt.layer(bars, pts).properties(width=320, height=max(60, 28 * len(names)))
    if column:
        ch = ch.facet(row=alt.Row(f"{column}:N", title=None), data=d)
    return ch.properties(title=title or f"{metric.upper()} per tenant: p50/p90/p99 with 95% bootstrap intervals")


def share_chart(shares: pd.DataFrame, title: str = "Share per tenant (%)", color: str = "measure"):
    """Grouped bars: ``shares`` is long with ``tenant``, ``measure``, ``pct`` (and optionally
    ``scenario`` to facet by)."""
    import altair as alt
    d = shares.copy()
    d["pct"] = d["pct"].astype(float).round(3)
    names = list(dict.fromkeys(d["tenant"]))
    ch = alt.Chart(d).mark_bar().encode(
        x=alt.X("tenant:N", sort=names, title=None), xOffset=alt.XOffset(f"{color}:N"),
        y=alt.Y("pct:Q", title="%"), color=alt.Color(f"{color}:N"))
    if "scenario" in d.columns:
        ch = ch.properties(width=160, height=160).facet(column=alt.Column("scenario:N", title=None))
        ch = ch.resolve_scale(x="independent")
    else:
        ch = ch.properties(width=220, height=180)
    return ch.properties(title=title)


def windowed_chart(windowed: pd.DataFrame, title: str = "Windowed Jain index"):
    """Jain over time (tokens and residency); ``windowed`` may carry ``scenario``/``seed`` columns."""
    import altair as alt
    keep = [c for c in ("scenario", "seed", "backend") if c in windowed.columns]
    d = windowed[["t_start_s", "jain_tokens", "jain_residency"] + keep].melt(
        id_vars=["t_start_s"] + keep, var_name="over", value_name="jain").dropna(subset=["jain"])
    d["jain"] = d["jain"].astype(float).round(4)
    d["over"] = d["over"].map({"jain_tokens": "token-weighted service", "jain_residency": "residency"})
    enc = {"x": alt.X("t_start_s:Q", title="window start (s)"),
           "y": alt.Y("jain:Q", scale=alt.Scale(domain=[0, 1]), title="Jain index"),
           "color": alt.Color("over:N", title=None)}
    if "seed" in d.columns:
        enc["detail"] = "seed:N"
    ch = alt.Chart(d).mark_line(point=True).encode(**enc).properties(width=220, height=150)
    if "scenario" in d.columns:
        ch = ch.facet(column=alt.Column("scenario:N", title=None))
    return ch.properties(title=title)


# --- report --------------------------------------------------------------------------------------
def _md(df: pd.DataFrame, digits: int = 2) -> str:
    return df.round(digits).to_markdown()


def ci_table(lat: pd.DataFrame, digits: int = 1) -> pd.DataFrame:
    """A long latency table as text, one row per (tenant, metric), one column per percentile:
    ``estimate [low, high]`` (ms)."""
    def fmt(r):
        if math.isnan(r["estimate"]):
            return "-"
        return f"{r['estimate']:.{digits}f} [{r['low']:.{digits}f}, {r['high']:.{digits}f}]"
    d = lat.assign(cell=lat.apply(fmt, axis=1), pct=lat["q"].map(lambda q: f"p{q:g}"))
    order = list(dict.fromkeys(d["pct"]))
    out = d.pivot_table(index=["tenant", "metric"], columns="pct", values="cell", aggfunc="first", sort=False)
    return out[order].rename_axis(columns=None)


def _group(runs: Sequence[Run]) -> dict:
    groups: dict = {}
    runs = sorted(runs, key=lambda r: (str(r.name), str(r.backend), str(r.seed)))
    for r in runs:
        groups.setdefault((r.name, r.backend), []).append(r)
    return groups


def report(runs: Sequence, baselines: Sequence = (), plots_dir: Optional[Path] = None, window_s: float = 10.0,
           n_boot: int = 1000, default_slo: Optional[tuple] = None) -> str:
    """The markdown report of several runs (grouped by scenario and backend). Victim degradation
    is reported for a scenario that names a victim and a baseline when runs of that baseline are
    among ``runs`` or ``baselines``. With ``plots_dir``, SVG charts are written there and linked.
    ``default_slo`` = ``(ttft_ms, tpot_ms)`` for every tenant of a run whose config names no SLOs
    (a run made without a scenario file)."""
    runs = [as_run(r) for r in runs]
    base_runs = [as_run(r) for r in baselines]
    for r in runs + base_runs:
        if not r.slos:
            if default_slo is None:
                raise ValueError(f"run {r.path or r.name}: its config names no SLOs (no scenario); "
                                 "give them with --slo TTFT_MS,TPOT_MS")
            sc = dict(r.scenario)
            sc["tenants"] = [{"name": n, "ttft_slo_ms": float(default_slo[0]), "tpot_slo_ms": float(default_slo[1])}
                             for n in r.tenant_names]
            sc.setdefault("name", r.name)
            r.config = {**r.config, "extra": {**r.extra, "scenario": sc}}
    groups = _group(runs)
    by_name: dict = {}
    for r in runs + base_runs:
        by_name.setdefault((r.name, r.backend), []).append(r)
    lines = ["# fairlib analyze report", ""]
    lines += [f"{len(runs)} run(s): " + ", ".join(f"{n} ({b}, {len(v)} seed(s))" for (n, b), v in groups.items()), ""]
    lines += ["Definitions: `fairlib.analyze` (TTFT to the first token chunk, TPOT = (E2E - TTFT) / (tokens - 1), "
              "E2E to the last token chunk; goodput = completed requests/s meeting both SLOs; starvation = TTFT > "
              f"{STARVATION_FACTOR:g}x the TTFT SLO; service weights: prompt {PREFILL_WEIGHT:g}, output "
              f"{DECODE_WEIGHT:g}). Latencies in ms.", ""]
    for (name, backend), rs in groups.items():
        analyses = [analyze_run(r, window_s=window_s, n_boot=n_boot) for r in rs]
        scen = rs[0].scenario
        lines += [f"## {name} ({backend})", ""]
        if scen.get("description"):
            lines += [scen["description"], ""]
        if scen.get("question"):
            lines += [f"Question: {scen['question']}", ""]
        lines += [f"Seeds: {', '.join(str(a.seed) for a in analyses)}; load window {rs[0].duration_s:g} s.", ""]
        lines += ["### Validity", "", _md(validity_table(analyses).drop(columns=["scenario"]).set_index("seed"), 3), ""]
        lines += ["### Per tenant (mean over seeds)", "", _md(combine(analyses)), ""]
        lat = pooled_latency(rs, n_boot=n_boot)
        lines += ["### Latency percentiles with 95% bootstrap intervals (pooled over seeds)", "",
                  ci_table(lat).to_markdown(), ""]
        lines += ["### Fairness", "", _md(fairness_table(analyses).drop(columns=["scenario"]).set_index("seed"), 3), ""]
        fits = pd.DataFrame([{"seed": a.seed, **a.cost_fit} for a in analyses]).set_index("seed")
        lines += ["### Iteration cost fitted from the stream timings", "",
                  "`dt = iter_base + iter_slope * B + prefill * P` (ms) over the iterations the streams show; "
                  "it prices prefill in `residency_fitted_share_pct`.", "", _md(fits, 4), ""]
        if scen.get("victim") and scen.get("baseline"):
            bl = by_name.get((scen["baseline"], backend)) or [r for (n, _), v in by_name.items()
                                                              if n == scen["baseline"] for r in v]
            if bl:
                vd = victim_degradation(rs, bl, scen["victim"], n_boot=n_boot)
                lines += [f"### Victim degradation ({scen['victim']}: contention / alone)", "", _md(vd, 3), ""]
            else:
                lines += ["### Victim degradation", "",
                          f"No run of the baseline scenario {scen['baseline']!r} was given (--baseline DIR).", ""]
        if plots_dir is not None:
            plots_dir = Path(plots_dir)
            plots_dir.mkdir(parents=True, exist_ok=True)
            stem = f"{name}_{backend}"
            wins = pd.concat([a.windowed.assign(seed=a.seed) for a in analyses], ignore_index=True)
            shares = []
            for a in analyses:
                for t in a.residency.index:
                    shares.append({"tenant": t, "measure": "residency", "pct": 100 * a.residency.loc[t, "share"]})
                    shares.append({"tenant": t, "measure": "token-weighted", "pct": 100 * a.tokens.loc[t, "share"]})
            shares = pd.DataFrame(shares).groupby(["tenant", "measure"], sort=False, as_index=False)["pct"].mean()
            charts = {"ttft": latency_chart(lat, "ttft"), "e2e": latency_chart(lat, "e2e"),
                      "shares": share_chart(shares, "Share of service per tenant (%, mean over seeds)"),
                      "jain": windowed_chart(wins)}
            lines += ["### Plots", ""]
            for k, ch in charts.items():
                p = plots_dir / f"{stem}_{k}.svg"
                ch.save(str(p))
                lines += [f"![{name} {k}]({plots_dir.name}/{p.name})", ""]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``fairlib analyze``: run directories (simulated or measured) -> a markdown report."""
    ap = argparse.ArgumentParser(prog="fairlib analyze", description=main.__doc__)
    ap.add_argument("--run", nargs="+", required=True, metavar="DIR", help="run directories to analyze")
    ap.add_argument("--baseline", nargs="*", default=[], metavar="DIR",
                    help="run directories of the victim baseline scenario (victim alone at the same rate)")
    ap.add_argument("--out", default="report.md", help="the markdown report to write (default report.md)")
    ap.add_argument("--plots", action="store_true", help="also write SVG charts next to the report")
    ap.add_argument("--window-s", type=float, default=10.0, help="window of the Jain time series (s)")
    ap.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples for the intervals")
    ap.add_argument("--slo", metavar="TTFT_MS,TPOT_MS",
                    help="SLOs for every tenant of a run whose config names none (default: the scenario's)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    plots = out.parent / (out.stem + "_plots") if args.plots else None
    try:
        slo = None
        if args.slo:
            parts = [float(x) for x in args.slo.split(",")]
            if len(parts) != 2 or min(parts) <= 0:
                raise ValueError(f"--slo takes TTFT_MS,TPOT_MS (two numbers > 0), got {args.slo!r}")
            slo = tuple(parts)
        runs = [load_run(d) for d in args.run]
        bases = [load_run(d) for d in args.baseline]
        text = report(runs, bases, plots, window_s=args.window_s, n_boot=args.n_boot, default_slo=slo)
    except ValueError as e:
        print(f"fairlib analyze: {e}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"fairlib analyze: wrote {out}" + (f" and charts in {plots}" if plots else ""))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


# --- chapter 7: latency percentiles, victims, saved live runs next to the simulator -------------
#: The engines whose live runs the book keeps under ``data/runs/<engine>`` (chapter 7 shows them
#: first, chapter 8 measures their fidelity), in the order the chapters show them.
LIVE_ENGINES = ("vllm", "llamacpp")
#: A measured run and its simulation (the same schedule in the engine model).
SOURCES = ("measured", "simulated")


def tenant_latency(a: RunAnalysis, metrics: Sequence[str] = ("ttft", "tpot", "e2e"),
                   qs: Sequence[float] = QS) -> pd.DataFrame:
    """One row per tenant: every percentile ``<metric>_p<q>_ms`` (p50, p90 and p99 by default)
    over the run's completed requests (ms): :func:`tenant_table` with p90 beside p50 and p99."""
    lat = latency_wide(a.latency)
    cols = [f"{m}_p{q:g}" for m in metrics for q in qs]
    missing = [c for c in cols if c not in lat.columns]
    if missing:
        raise ValueError(f"tenant_latency: the run's latency table has no {missing} "
                         f"(analyze_run computes p{', p'.join(f'{q:g}' for q in QS)})")
    out = lat[cols].copy()
    out.columns = [c + "_ms" for c in cols]
    return out


def latency_overview(results: dict, metrics: Sequence[str] = ("ttft", "tpot", "e2e"),
                     qs: Sequence[float] = QS) -> pd.DataFrame:
    """:func:`tenant_latency` of every run of ``results`` (``{(scenario, policy): [RunAnalysis
    per seed]}``, ``fairlib.tenantbench.analyze_all``), the mean over seeds: index (scenario,
    policy, tenant)."""
    parts = []
    for (name, pol), analyses in results.items():
        tabs = [tenant_latency(a, metrics, qs) for a in analyses]
        names = list(tabs[0].index)
        t = pd.concat(tabs).groupby(level="tenant", sort=False).mean().reindex(names)
        t.index = pd.MultiIndex.from_product([[name], [pol], names], names=["scenario", "policy", "tenant"])
        parts.append(t)
    return pd.concat(parts)


def victim_table(contention, baseline, tenant: Optional[str] = None, qs: Sequence[float] = QS,
                 n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """:func:`victim_degradation` with every percentile of ``qs`` (p50, p90, p99): the victim's
    TTFT and E2E percentiles (ms, pooled completed requests of the runs given), goodput and
    attainment under contention, alone, and their ratio."""
    cons = [as_run(r) for r in (contention if isinstance(contention, (list, tuple)) else [contention])]
    bases = [as_run(r) for r in (baseline if isinstance(baseline, (list, tuple)) else [baseline])]
    base = victim_degradation(cons, bases, tenant, n_boot=n_boot, seed=seed)
    tenant = base.attrs["tenant"]

    def pct(runs):
        out = {}
        for m, x in _tenant_ms(runs, tenant).items():
            for q in qs:
                out[f"{m}_p{q:g}_ms"] = float(np.percentile(x, q)) if x.size else math.nan
        return out
    a, b = pct(cons), pct(bases)
    rows = []
    for k in list(a) + ["goodput_rps", "attainment"]:
        c, al = (a[k], b[k]) if k in a else (base.loc[k, "contention"], base.loc[k, "alone"])
        ratio = c / al if al not in (0, 0.0) and not math.isnan(al) else math.nan
        rows.append({"metric": k, "contention": c, "alone": al, "ratio": ratio})
    out = pd.DataFrame(rows).set_index("metric")
    out.attrs["tenant"] = tenant
    return out


def victim_overview(results: dict, qs: Sequence[float] = QS, n_boot: int = 500) -> Optional[pd.DataFrame]:
    """:func:`victim_table` for every scenario of ``results`` that names a victim and whose
    baseline ran: index (scenario, policy, victim, metric); ``None`` when there is none."""
    by_name: dict = {}
    for (name, _), analyses in results.items():
        by_name.setdefault(name, []).extend(a.run for a in analyses)
    parts = []
    for (name, pol), analyses in results.items():
        scen = analyses[0].run.scenario
        if scen.get("victim") and scen.get("baseline") in by_name:
            vd = victim_table([a.run for a in analyses], by_name[scen["baseline"]], scen["victim"], qs, n_boot)
            vd.index = pd.MultiIndex.from_product([[name], [pol], [scen["victim"]], list(vd.index)],
                                                  names=["scenario", "policy", "victim", "metric"])
            parts.append(vd)
    return pd.concat(parts) if parts else None


def goodput_chart(table: pd.DataFrame, color: str = "policy", title: Optional[str] = None,
                  scale=None, facet: Optional[str] = None):
    """SLO goodput (requests/s) and attainment (%) per tenant, one dot per ``color`` value (a
    policy by default, in the book's policy colours), rows ``scenario: tenant``. ``table``: index
    or columns ``scenario``, ``tenant``, ``color`` (and ``facet``), columns ``goodput_rps`` and
    ``slo_attainment_pct`` (:func:`fairlib.tenantbench.goodput_overview`, :func:`live_table`)."""
    measures = {"goodput_rps": "goodput (requests/s)", "slo_attainment_pct": "SLO attainment (%)"}
    return _dot_chart(table, measures, color, scale, facet,
                      title or "SLO goodput and attainment per tenant")


def _dot_chart(table, measures: dict, color: str, scale=None, facet: Optional[str] = None,
               title: str = "", hollow: Optional[str] = None):
    """Dots per ``scenario: tenant`` row, one panel per measure (and per ``facet`` value); the
    ``hollow`` value of ``color`` is drawn as a larger open ring, so that it shows around a dot
    it coincides with."""
    import altair as alt
    d = table.reset_index() if any(n is not None for n in table.index.names) else table.copy()
    if isinstance(d.columns, pd.MultiIndex):
        raise ValueError("_dot_chart: flatten the columns first")
    if "row" not in d.columns:
        d["row"] = d["scenario"].astype(str) + ": " + d["tenant"].astype(str)
    scen_rank = {n: i for i, n in enumerate(dict.fromkeys(d["scenario"]))}
    ten_rank = {k: i for i, k in enumerate(dict.fromkeys(zip(d["scenario"], d["tenant"])))}
    d["_rank"] = [(scen_rank[s], ten_rank[(s, t)]) for s, t in zip(d["scenario"], d["tenant"])]
    rows = list(dict.fromkeys(d.sort_values("_rank", kind="mergesort")["row"]))
    keep = ["row", color] + ([facet] if facet else [])
    long = d[keep + list(measures)].melt(id_vars=keep, var_name="measure", value_name="value")
    long["measure"] = long["measure"].map(measures)
    long = long.dropna(subset=["value"])
    long["value"] = long["value"].astype(float).round(3)
    order = list(dict.fromkeys(d[color]))
    if scale is None and color == "policy":
        from .book import policy_scale
        try:
            scale = policy_scale(order)
        except KeyError:                 # a label the book has no colour for (e.g. "server")
            scale = None
    col = alt.Color(f"{color}:N", sort=order, title=color, **({"scale": scale} if scale is not None else {}))
    enc = {"x": alt.X("value:Q", title=None), "y": alt.Y("row:N", sort=rows, title=None), "color": col}
    base = alt.Chart()
    if hollow is None:
        ch = base.mark_point(filled=True, size=45, opacity=0.85).encode(**enc)
    else:
        ring = alt.datum[color] == hollow
        ch = alt.layer(base.transform_filter(~ring).mark_point(filled=True, size=35, opacity=1).encode(**enc),
                       base.transform_filter(ring).mark_point(filled=False, size=110, strokeWidth=1.6,
                                                              opacity=1).encode(**enc))
    n_rows = max(len(set(g)) for _, g in d.groupby(facet)["row"]) if facet else len(rows)
    ch = ch.properties(width=200, height=max(60, 16 * n_rows))
    kw = {"column": alt.Column("measure:N", sort=list(measures.values()), title=None)}
    if facet:
        kw["row"] = alt.Row(f"{facet}:N", sort=list(dict.fromkeys(d[facet])), title=None)
    return ch.facet(data=long, **kw).resolve_scale(
        x="independent", y="independent" if facet else "shared").properties(title=title)


# saved live runs: data/runs/<engine>/<scenario>/seed<k>
def saved_live_runs(engines: Optional[Sequence[str]] = None, root=None) -> list:
    """Every live run saved under ``root/<engine>/<scenario>/seed<k>`` (default ``data/runs``):
    whatever scenarios and seeds are there, by engine (:data:`LIVE_ENGINES` first), scenario
    (the scenario files' order) and seed. ``engines``: which engines (default every folder)."""
    from .engines import repo_root
    from .scenarios import available
    root = Path(root) if root is not None else repo_root() / "data" / "runs"
    if engines is None:
        found = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        engines = [k for k in LIVE_ENGINES if k in found] + [k for k in found if k not in LIVE_ENGINES]
    order = list(available())

    def seed_of(p):
        tail = p.name[4:]
        return (0, int(tail)) if tail.isdigit() else (1, tail)
    out = []
    for k in engines:
        d = root / k
        if not d.is_dir():
            raise FileNotFoundError(f"no saved live runs of engine {k!r} under {d}")
        scen = sorted((p for p in d.iterdir() if p.is_dir()),
                      key=lambda p: (order.index(p.name) if p.name in order else len(order), p.name))
        for s in scen:
            for p in sorted(s.glob("seed*"), key=seed_of):
                if (p / "records.jsonl").exists():
                    out.append(load_run(p))
    return out


def engine_of(run: Run) -> str:
    """The engine a live run measured: its config's ``engine_kind``, else its folder."""
    kind = run.extra.get("engine_kind")
    if kind:
        return str(kind)
    return Path(run.path).parents[1].name if run.path else "?"


def analyze_pairs(pairs, n_boot: int = 500, window_s: float = 10.0) -> dict:
    """``{(engine, scenario): [(measured, simulated) RunAnalysis per seed]}`` of the
    ``(measured, simulated)`` run pairs of ``fairlib.fidelity.simulate_pairs``."""
    out: dict = {}
    for m, s in pairs:
        out.setdefault((engine_of(m), m.name), []).append(
            (analyze_run(m, n_boot=n_boot, window_s=window_s), analyze_run(s, n_boot=n_boot, window_s=window_s)))
    return out


def _is_cut(a: RunAnalysis) -> bool:
    return a.run.extra.get("cut_after_s") is not None


def _kept(items: list) -> tuple:
    """The pairs a table averages (the valid runs; every run when none is valid) and the label
    that says which: ``"0, 1, 2"``, ``"0, 2 (1 invalid, left out)"``, ``"0 (INVALID)"``."""
    valid = [p for p in items if p[0].validity["valid"]]
    bad = [p for p in items if not p[0].validity["valid"]]
    seeds = lambda ps: ", ".join(str(p[0].seed) for p in ps)       # noqa: E731
    if not bad:
        return items, seeds(items)
    if valid:
        return valid, f"{seeds(valid)} ({seeds(bad)} invalid, left out)"
    return items, f"{seeds(items)} (INVALID)"


def live_table(live: dict, columns: Sequence[str], skip_cut: bool = False) -> pd.DataFrame:
    """Per (engine, scenario, seeds, tenant): each column of ``columns`` (a :func:`tenant_table`
    or :func:`tenant_latency` column) measured and simulated, the mean over the valid runs of
    the group (every run, marked ``INVALID`` in ``seeds``, when none is valid). ``skip_cut``:
    leave out the groups whose live requests were cut at a deadline (their latencies and
    goodput are not the simulator's; listed in ``attrs["skipped"]``)."""
    parts, skipped = [], []
    for (eng, name), items in live.items():
        if skip_cut and _is_cut(items[0][0]):
            skipped.append((eng, name))
            continue
        kept, label = _kept(items)
        sides = []
        for i, src in enumerate(SOURCES):
            tabs = []
            for p in kept:
                t = tenant_table(p[i])
                lat = tenant_latency(p[i])
                tabs.append(t.join(lat[[c for c in lat.columns if c not in t.columns]]))
            names = list(tabs[0].index)
            mean = pd.concat(tabs).groupby(level="tenant", sort=False).mean().reindex(names)[list(columns)]
            mean.columns = pd.MultiIndex.from_product([list(columns), [src]])
            sides.append(mean)
        t = pd.concat(sides, axis=1)[[(c, s) for c in columns for s in SOURCES]]
        t.index = pd.MultiIndex.from_product([[eng], [name], [label], list(t.index)],
                                             names=["engine", "scenario", "seeds", "tenant"])
        parts.append(t)
    out = pd.concat(parts) if parts else pd.DataFrame()
    out.attrs["skipped"] = skipped
    return out


def live_validity(live: dict) -> pd.DataFrame:
    """Per live run (engine, scenario, seed): ``valid`` (its summary's flag), ``verdict`` (``ok``
    or ``INVALID: <reason>``), schedule lag p50/p99 (ms), requests completed of planned, the
    load window (s) and whether the tables average it."""
    rows = []
    for (eng, name), items in live.items():
        kept = {id(p) for p in _kept(items)[0]}
        for p in items:
            v = p[0].validity
            rows.append({"engine": eng, "scenario": name, "seed": p[0].seed, "valid": v["valid"],
                         "verdict": "ok" if v["valid"] else f"INVALID: {v['reason']}",
                         "lag p50 (ms)": v["lag_p50_ms"], "lag p99 (ms)": v["lag_p99_ms"],
                         "completed": f"{v['n_ok']} of {v['n_planned']}",
                         "load window (s)": p[0].run.duration_s,
                         "in the tables": "yes" if id(p) in kept else "no"})
    return pd.DataFrame(rows).set_index(["engine", "scenario", "seed"])


def live_victims(live: dict, qs: Sequence[float] = QS, n_boot: int = 500) -> Optional[pd.DataFrame]:
    """:func:`victim_table` on each engine, measured and simulated: the contention scenario's
    valid runs against its baseline's (every run, marked, when none is valid). Index (engine,
    scenario, seeds, metric); columns (source, contention / alone / ratio)."""
    parts = []
    for (eng, name), items in live.items():
        scen = items[0][0].run.scenario
        victim, base = scen.get("victim"), scen.get("baseline")
        if not victim or (eng, base) not in live:
            continue
        kc, lc = _kept(items)
        kb, lb = _kept(live[(eng, base)])
        sides = [victim_table([p[i].run for p in kc], [p[i].run for p in kb], victim, qs, n_boot)
                 for i in range(len(SOURCES))]
        t = pd.concat(sides, axis=1, keys=list(SOURCES))
        t.index = pd.MultiIndex.from_product([[eng], [f"{name} / {base}"], [f"{lc} / {lb}"], list(t.index)],
                                             names=["engine", "scenario", "seeds", "metric"])
        parts.append(t)
    return pd.concat(parts) if parts else None


def live_chart(table: pd.DataFrame, measures: dict, title: str):
    """Measured and simulated per tenant (dots; rows ``scenario: tenant``, ``(INVALID)`` when
    the group has no valid run), one panel per measure and engine. ``table``: :func:`live_table`
    with the columns of ``measures`` (column -> axis title)."""
    d = table.stack(level=1) if int(pd.__version__.split(".")[0]) >= 3 else table.stack(level=1, future_stack=True)
    d.index = d.index.set_names("source", level=-1)
    d = d.reset_index()
    inval = d["seeds"].str.contains("INVALID")
    d["row"] = d["scenario"] + ": " + d["tenant"] + np.where(inval, " (INVALID)", "")
    scale = _source_scale()
    return _dot_chart(d, measures, "source", scale, "engine", title, hollow="simulated")


def _source_scale():
    import altair as alt
    return alt.Scale(domain=list(SOURCES), range=["#1a1a1a", "#a0a0a0"])
