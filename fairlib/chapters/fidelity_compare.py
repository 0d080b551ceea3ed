"""Chapter 8's comparison of live runs and their simulations: per-tenant metrics and errors, the
error summary against the goals, the sensitivity to each fitted parameter, and the tables of fits,
scenarios, validity, stalls and per-run costs."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from fairlib import analysis as an
from fairlib.calibrate.fit import engine_at
from fairlib.chapters import published
from fairlib.records import Run
from fairlib.sim.engine import Engine
from fairlib.chapters.fidelity_runs import CHECKS, GOALS, sim_spec, simulate_live

#: The metrics compared, latencies first. Share in points, the others relative (%).
METRICS = ("e2e_p50_ms", "e2e_p99_ms", "ttft_p50_ms", "ttft_p99_ms", "throughput_tok_s", "share_pct")
LATENCY_METRICS = ("e2e_p50_ms", "e2e_p99_ms", "ttft_p50_ms", "ttft_p99_ms")
#: Display names of the metrics (tables and charts).
METRIC_LABELS = {"e2e_p50_ms": "E2E p50", "e2e_p99_ms": "E2E p99", "ttft_p50_ms": "TTFT p50",
                 "ttft_p99_ms": "TTFT p99", "throughput_tok_s": "throughput", "share_pct": "machine share"}


def _tenant_metrics(run: Run, n_boot: int = 0) -> pd.DataFrame:
    """Per tenant: share (load window), TTFT/E2E p50/p99 over the completed requests, throughput.
    A run whose requests were cut (``cut_after_s``: seed000 at 3x overload) has no latencies:
    what completed there depends on the cut, which the simulator does not make."""
    names = run.tenant_names
    lat = an.latency_wide(an.latency(run.records, names, qs=(50, 99), n_boot=max(n_boot, 1)))
    res = an.residency(run, "load", names)
    tok = an.token_service(run, "load", names)
    out = pd.DataFrame(index=pd.Index(names, name="tenant"))
    out["share_pct"] = 100 * res["share"]
    out["ttft_p50_ms"], out["ttft_p99_ms"] = lat["ttft_p50"], lat["ttft_p99"]
    out["e2e_p50_ms"], out["e2e_p99_ms"] = lat["e2e_p50"], lat["e2e_p99"]
    if run.extra.get("cut_after_s") is not None:
        out[list(LATENCY_METRICS)] = math.nan
    out["throughput_tok_s"] = tok["output_tokens"] / run.duration_s
    ok = run.records["error_class"] == "none"
    out["requests"] = run.records.groupby("tenant_name").size().reindex(names).fillna(0).astype(int)
    out["completed"] = run.records[ok].groupby("tenant_name").size().reindex(names).fillna(0).astype(int)
    return out


def _errors(m: pd.DataFrame, s: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame(index=m.index)
    out["requests"] = m["requests"]
    out["completed"] = m["completed"]
    for k in METRICS:
        out[f"{k}_measured"] = m[k]
        out[f"{k}_predicted"] = s[k]
        if k == "share_pct":
            out[f"{k}_err"] = s[k] - m[k]
        else:
            out[f"{k}_err"] = 100 * (s[k] - m[k]) / m[k]
    return out


def compare(measured: Run, simulated: Run) -> pd.DataFrame:
    """One row per tenant: ``<metric>_measured``, ``<metric>_predicted`` and ``<metric>_err``
    (share: points; the others: % of the measured value), and ``valid`` (the live run's schedule
    held: p99 send lag within its threshold)."""
    out = _errors(_tenant_metrics(measured), _tenant_metrics(simulated))
    out["valid"] = bool(measured.summary.get("valid", True))
    return out


def compare_all(pairs, kind: Optional[str] = None) -> pd.DataFrame:
    """:func:`compare` for every pair, stacked: index (engine, scenario, seed, tenant)."""
    parts = []
    for meas, sim in pairs:
        c = compare(meas, sim)
        k = kind or meas.extra.get("engine_kind") or "?"
        c.index = pd.MultiIndex.from_product([[k], [meas.name], [meas.seed], list(c.index)],
                                             names=["engine", "scenario", "seed", "tenant"])
        parts.append(c)
    return pd.concat(parts)


def valid_only_rows(table: pd.DataFrame, valid_only: bool) -> pd.DataFrame:
    if valid_only and "valid" in table:
        return table[table["valid"].astype(bool)]
    return table


def error_summary(table: pd.DataFrame, valid_only: bool = False) -> pd.DataFrame:
    """Per engine and metric (latencies first): median and mean absolute error over (scenario,
    seed, tenant) rows, the worst, and the signed median (bias); share in points, the others in
    %. ``valid_only``: only the rows of valid runs."""
    rows = []
    for eng, t in valid_only_rows(table, valid_only).groupby(level="engine", sort=False):
        for k in METRICS:
            e = t[f"{k}_err"].astype(float).dropna()
            a = e.abs()
            rows.append({"engine": eng, "metric": k, "unit": "points" if k == "share_pct" else "%",
                         "median |error|": a.median(), "mean |error|": a.mean(), "max |error|": a.max(),
                         "median error (bias)": e.median(), "n": int(e.size)})
    cols = ["engine", "metric", "unit", "median |error|", "mean |error|", "max |error|",
            "median error (bias)", "n"]
    return pd.DataFrame(rows, columns=cols).set_index(["engine", "metric"])


def both_ways(table: pd.DataFrame) -> pd.DataFrame:
    """Median |error| per engine and metric over every run and over the valid runs only, with
    the rows each counts."""
    a, v = error_summary(table), error_summary(table, valid_only=True)
    return pd.DataFrame({"unit": a["unit"], "all runs": a["median |error|"], "rows (all)": a["n"],
                         "valid runs only": v["median |error|"], "rows (valid)": v["n"]})


def goal_table(table: pd.DataFrame, valid_only: bool = False) -> pd.DataFrame:
    """Per engine: how many tenant rows meet each of the issue's goals (:data:`GOALS`)."""
    rows = []
    for eng, t in valid_only_rows(table, valid_only).groupby(level="engine", sort=False):
        for k, col, lim in ((f"E2E p50 within {GOALS['e2e_p50_pct']:g}%", "e2e_p50_ms_err", GOALS["e2e_p50_pct"]),
                            (f"TTFT p50 within {GOALS['ttft_p50_pct']:g}%", "ttft_p50_ms_err", GOALS["ttft_p50_pct"]),
                            (f"share within {GOALS['share_pts']:g} points", "share_pct_err", GOALS["share_pts"])):
            e = t[col].astype(float).dropna().abs()
            rows.append({"engine": eng, "goal": k, "rows meeting it": int((e <= lim).sum()), "rows": int(e.size),
                         "fraction": float((e <= lim).mean()) if e.size else math.nan})
    cols = ["engine", "goal", "rows meeting it", "rows", "fraction"]
    return pd.DataFrame(rows, columns=cols).set_index(["engine", "goal"])


def check(table: pd.DataFrame, valid_only: bool = False) -> dict:
    """The regression bounds (:data:`CHECKS`) per engine: ``{engine: {bound: (value, limit, ok)}}``.
    ``valid_only``: over the rows of valid runs only."""
    out = {}
    for eng, t in valid_only_rows(table, valid_only).groupby(level="engine", sort=False):
        share = t["share_pct_err"].abs()
        vals = {"share_pts_max": share.max(), "share_pts_median": share.median(),
                "e2e_p50_pct_median": t["e2e_p50_ms_err"].abs().median(),
                "ttft_p50_pct_median": t["ttft_p50_ms_err"].abs().median(),
                "throughput_pct_median": t["throughput_tok_s_err"].abs().median()}
        out[eng] = {k: (float(v), CHECKS[k], bool(v <= CHECKS[k])) for k, v in vals.items()}
    return out


#: The fitted parameters :func:`sensitivity` perturbs, and by how much.
SENSITIVITY_PARAMS = ("iter_base_ms", "iter_slope_ms", "prefill_ms_per_token")
SENSITIVITY_FACTORS = (0.5, 1.0, 1.5, 2.0)
PARAM_LABELS = {"iter_base_ms": "iter_base", "iter_slope_ms": "iter_slope",
                "prefill_ms_per_token": "prefill"}


def sensitivity(runs: Sequence[Run], params: Sequence[str] = SENSITIVITY_PARAMS,
                factors: Sequence[float] = SENSITIVITY_FACTORS, valid_only: bool = True) -> pd.DataFrame:
    """How each error moves when one fitted parameter is scaled: every live run simulated again
    with ``param x factor`` (the others as fitted; the same schedule) and compared. Long table:
    engine, parameter, factor, metric, median |error| and median error (bias) over the (scenario,
    seed, tenant) rows, share in points and the others in %."""
    runs = [r for r in runs if r.summary.get("valid", True) or not valid_only]
    if not runs:
        return pd.DataFrame(columns=["engine", "parameter", "factor", "metric", "unit",
                                     "median |error|", "median error (bias)"])
    measured = [_tenant_metrics(r) for r in runs]
    rows = []
    for p in params:
        for f in factors:
            if f == 1.0 and p != params[0]:
                continue
            parts = []
            for r, m in zip(runs, measured):
                eng = Engine(**(r.extra.get("sim_engine") or sim_spec(r).engine.to_dict()))
                eng = replace(eng, **{p: getattr(eng, p) * f})
                e = _errors(m, _tenant_metrics(simulate_live(r, eng, check_schedule=False)))
                e["engine"] = r.extra.get("engine_kind") or "?"
                parts.append(e)
            t = pd.concat(parts)
            for eng_kind, g in t.groupby("engine", sort=False):
                for k in METRICS:
                    e = g[f"{k}_err"].astype(float).dropna()
                    for pp in (params if f == 1.0 else [p]):
                        rows.append({"engine": eng_kind, "parameter": PARAM_LABELS.get(pp, pp), "factor": f,
                                     "metric": METRIC_LABELS[k], "unit": "points" if k == "share_pct" else "%",
                                     "median |error|": e.abs().median(), "median error (bias)": e.median()})
    return pd.DataFrame(rows)


def idle_ttft(fits: dict) -> pd.DataFrame:
    """The idle engine's time to first token per prompt length (the fit's single requests,
    medians) against the engine model's: one iteration with one sequence at that context plus
    ``prefill * P``. Positive: the model is slower than the engine."""
    rows = []
    for kind, d in fits.items():
        pre = d["fit"]["prefill"]
        for P, t in zip(pre["P"], pre["ttft_ms_median"]):
            eng = engine_at(d, float(P))
            model = float(eng.iteration_ms(1)) + eng.prefill_ms_per_token * float(P)
            lin = pre["linear"]["intercept"] + pre["linear"]["slope"] * float(P)
            rows.append({"engine": kind, "prompt tokens": int(P), "measured TTFT (ms)": t,
                         "model TTFT (ms)": model, "model - measured (ms)": model - t,
                         "prefill line residual (ms)": t - lin})
    return pd.DataFrame(rows).set_index(["engine", "prompt tokens"])


def published_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Ours next to the published fidelity of Vidur, BLIS and LLMServingSim
    (``data/published_figures.toml``, ch8.*), metric by metric where they say which."""
    vid = published.figure("ch8.vidur_error")["value"]
    blis = published.figure("ch8.blis_error")["value"]
    lss = published.figure("ch8.llmservingsim_error")["value"]
    rows = [{"simulator": "Vidur", "what": published.figure("ch8.vidur_error")["what"], "error (%)": vid},
            {"simulator": "BLIS", "what": "median E2E error (%)", "error (%)": blis[0]},
            {"simulator": "BLIS", "what": "mean TTFT error (%)", "error (%)": blis[1]},
            {"simulator": "LLMServingSim 2.0", "what": published.figure("ch8.llmservingsim_error")["what"],
             "error (%)": lss}]
    for eng in dict.fromkeys(summary.index.get_level_values("engine")):
        s = summary.loc[eng]
        rows += [{"simulator": f"fairlib on {eng}", "what": "median |E2E p50 error| over tenants (%)",
                  "error (%)": s.loc["e2e_p50_ms", "median |error|"]},
                 {"simulator": f"fairlib on {eng}", "what": "mean |TTFT p50 error| over tenants (%)",
                  "error (%)": s.loc["ttft_p50_ms", "mean |error|"]},
                 {"simulator": f"fairlib on {eng}", "what": "median |E2E p99 error| over tenants (%)",
                  "error (%)": s.loc["e2e_p99_ms", "median |error|"]}]
    return pd.DataFrame(rows)


def fit_points(fits: dict) -> pd.DataFrame:
    """The decode sweep of each fit, long: engine, context, B, measured median dt (ms) and the
    joint fit's dt at the same point (for a chart)."""
    rows = []
    for kind, d in fits.items():
        dec = d["fit"]["decode"]
        j = dec["joint"]
        for c, v in dec["per_context"].items():
            for b, m in zip(v["B"], v["dt_ms_median"]):
                rows.append({"engine": kind, "context": float(c), "B": b, "measured_ms": m,
                             "fitted_ms": j["iter_base_ms"] + (j["slope_0_ms"] + j["slope_ctx_ms_per_token"] * float(c)) * b})
    return pd.DataFrame(rows)


def scenario_table(runs: Sequence[Run]) -> pd.DataFrame:
    """Per live run: the engine, the scenario's mean decode context, the simulated engine's slope,
    the offered load, requests sent and the policy the endpoint ran."""
    rows = []
    for r in runs:
        sim = r.extra.get("sim_engine") or {}
        rows.append({"engine": r.extra.get("engine_kind"), "scenario": r.name, "seed": r.seed,
                     "decode context (tokens)": r.extra.get("decode_context"),
                     "iter_slope (ms)": sim.get("iter_slope_ms"),
                     # what this run's tenants offered: a baseline offers its victim's part of the
                     # scenario's rho (runs recorded before offered_load existed stored that as rho)
                     "rho": r.scenario.get("offered_load", r.scenario.get("rho")),
                     "load window (s)": r.duration_s, "requests": len(r.records),
                     "server policy": r.extra.get("policy")})
    return pd.DataFrame(rows).set_index(["engine", "scenario", "seed"])


#: The columns of ``fairlib.analysis.validity_table`` that :func:`live_validity_table` shows, and their names there.
LIVE_VALIDITY_COLUMNS = {"valid": "valid", "lag_p50_ms": "lag p50 (ms)", "lag_p99_ms": "lag p99 (ms)",
                         "lag_max_ms": "lag max (ms)", "requested_rps": "requested (req/s)",
                         "achieved_rps": "achieved (req/s)", "n_ok": "completed", "n_planned": "planned",
                         "errors": "errors"}


def live_validity_table(runs: Sequence[Run]) -> pd.DataFrame:
    """``fairlib.analysis.validity_table`` of live runs (valid: p99 schedule lag within the
    threshold; lag p50/p99/max (ms), requested and achieved send rate, requests completed and
    planned, the errors seen) under the names of :data:`LIVE_VALIDITY_COLUMNS`, with what only a
    live run records: the machine load as it started and the client's pauses seen in its streams
    (:func:`stalls`). Indexed by (engine, scenario, seed)."""
    runs = list(runs)
    v = an.validity_table(runs)[["scenario", "seed", *LIVE_VALIDITY_COLUMNS]].rename(columns=LIVE_VALIDITY_COLUMNS)
    v.insert(0, "engine", [r.extra.get("engine_kind") for r in runs])
    st = [stalls(r) for r in runs]
    v["machine load (1 min)"] = [r.extra.get("loadavg_1m", math.nan) for r in runs]
    v["client pauses"] = [x["n"] for x in st]
    v["client paused (ms)"] = [x["total_ms"] for x in st]
    return v.set_index(["engine", "scenario", "seed"])


#: What :func:`stalls` counts as a client pause: a gap of more than this many ms between token
#: chunks, after which one stream delivered this many chunks within this many ms.
STALL_GAP_MS, STALL_REPEAT, STALL_BURST_MS = 100.0, 3, 5.0


def stalls(run: Run, gap_ms: float = STALL_GAP_MS, repeat: int = STALL_REPEAT,
           burst_ms: float = STALL_BURST_MS) -> dict:
    """Pauses of the client seen in a live run's streams: gaps of more than ``gap_ms`` between
    consecutive token chunks of the whole run (all streams together) while a request was in
    flight, after which one stream delivered at least ``repeat`` chunks within ``burst_ms``
    (faster than any engine iteration here): the engine kept emitting while the client did not
    read, and the client then read what had queued up. A gap without that is the engine's (a
    long prefill, say). The simulator has no such pauses.
    ``{"n": count, "total_ms": sum of the gaps, "max_ms": the longest}``."""
    rec = run.records[run.records["error_class"] == "none"]
    ts: list = []
    sid: list = []
    for k, ch in enumerate(rec["chunk_times_s"]):
        if isinstance(ch, (list, tuple)):
            ts.extend(ch)
            sid.extend([k] * len(ch))
    if len(ts) < 2:
        return {"n": 0, "total_ms": 0.0, "max_ms": 0.0}
    order = np.argsort(ts, kind="stable")
    t, sids = np.asarray(ts, float)[order], np.asarray(sid)[order]
    send = pd.to_numeric(run.records["actual_send_s"]).to_numpy(float)
    end = pd.to_numeric(run.records["end_s"]).to_numpy(float)
    gaps = []
    for i in np.flatnonzero(np.diff(t) * 1e3 > gap_ms):
        a, b = t[i], t[i + 1]
        if not np.any((send < a) & (end > b)):
            continue
        stop = int(np.searchsorted(t, b + burst_ms / 1e3, side="right"))
        if stop > i + 1 and np.bincount(sids[i + 1:stop]).max() >= repeat:
            gaps.append((b - a) * 1e3)
    return {"n": len(gaps), "total_ms": float(math.fsum(gaps)), "max_ms": float(max(gaps, default=0.0))}


def run_costs(runs: Sequence[Run], valid_only: bool = True) -> pd.DataFrame:
    """The engine model fitted to each live run's own stream timings
    (``fairlib.analysis.fit_iteration_cost``: every tick's duration against its batch and the
    prompt tokens it started) beside the engine the simulator ran for it. Per run: engine,
    scenario, seed, and ``<parameter> (run)`` / ``<parameter> (fit)`` for iter_base, iter_slope and
    prefill, with the tick fit's R^2."""
    rows = []
    for r in runs:
        if valid_only and not r.summary.get("valid", True):
            continue
        f = an.fit_iteration_cost(r.records)
        sim = r.extra.get("sim_engine") or sim_spec(r).engine.to_dict()
        row = {"engine": r.extra.get("engine_kind"), "scenario": r.name, "seed": r.seed}
        for k, lab in PARAM_LABELS.items():
            row[f"{lab} (run)"], row[f"{lab} (fit)"] = f[k], sim[k]
        row["R2 (run)"] = f["r2"]
        rows.append(row)
    return pd.DataFrame(rows).set_index(["engine", "scenario", "seed"])
