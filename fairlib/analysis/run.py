"""One run's analysis and the tables over many runs.

``analyze_run`` computes everything ``fairlib.analysis`` defines for one run (latency, goodput,
starvation, token-weighted and residency fairness, windowed Jain, validity) into a
:class:`RunAnalysis`; ``tenant_table``, ``combine``, ``fairness_table``, ``validity_table`` lay
many runs side by side.

- **Victim degradation**: a tenant's p99 TTFT/E2E and goodput in the contention run over the same
  in the baseline run (the victim alone at the same rate).
- **Validity**: from ``summary.json``: p99 schedule lag against the run's threshold, requested vs
  achieved send rate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from fairlib.analysis.common import QS, as_run, completed, numeric
from fairlib.analysis.indices import jain_index, percentile_cis
from fairlib.analysis.latencies import goodput, latency, latency_wide, starvation
from fairlib.analysis.service import build_intervals, fairness, residency, token_service, windowed_fairness
from fairlib.records import Run

__all__ = ["victim_degradation", "validity", "RunAnalysis", "analyze_run", "tenant_table",
           "combine", "pooled_latency", "ci_table", "fairness_table", "validity_table",
           "tenant_latency", "latency_overview", "victim_table", "victim_overview"]

# --- victim and validity -------------------------------------------------------------------------
def _tenant_ms(runs: Sequence[Run], tenant: str) -> dict:
    """``{"ttft": ms, "e2e": ms}``: the successful requests of ``tenant`` over ``runs``."""
    recs = pd.concat([r.records for r in runs], ignore_index=True)
    mine = (recs["tenant_name"].astype(str) == tenant).to_numpy() & completed(recs)
    out = {}
    for m in ("ttft", "e2e"):
        x = numeric(recs, f"{m}_s")[mine] * 1e3
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
    """All tenantbench metrics of one run (SLOs from the run's scenario unless given). The stream
    intervals (``build_intervals``) are built once and shared by residency, fairness and the
    windowed series."""
    run = as_run(run)
    names = run.tenant_names
    slos = dict(slos) if slos is not None else run.slos
    if not slos:
        raise ValueError(f"run {run.name!r}: no SLOs in its config (config.extra.scenario); pass slos=")
    dur = run.duration_s
    iv = build_intervals(run.records, names, tick_tol_s)
    fitted = residency(run, window, names, tick_tol_s, prefill="fitted", intervals=iv)
    return RunAnalysis(
        run=run,
        residency_fitted=fitted,
        cost_fit=fitted.attrs.get("fit", {}),
        latency=latency(run.records, names, n_boot=n_boot, seed=seed),
        goodput=goodput(run.records, slos, dur, names),
        starvation=starvation(run.records, slos, tenant_names=names),
        tokens=token_service(run, window, names),
        residency=residency(run, window, names, tick_tol_s, intervals=iv),
        fairness=fairness(run, window, names, tick_tol_s, intervals=iv),
        windowed=windowed_fairness(run, window_s, names, tick_tol_s, intervals=iv),
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


def validity_table(runs: Sequence) -> pd.DataFrame:
    """:func:`validity` of each run, one row per run: ``scenario``, ``seed``, then the fields of
    :func:`validity` with ``errors`` as text (``"timeout 2, http_429 1"``, ``"-"`` for none).
    ``runs``: :class:`RunAnalysis` objects (their ``validity``) or runs (anything ``as_run`` takes)."""
    rows = []
    for x in runs:
        run = x.run if isinstance(x, RunAnalysis) else as_run(x)
        v = dict(x.validity) if isinstance(x, RunAnalysis) else validity(run)
        v["errors"] = ", ".join(f"{k} {n}" for k, n in v["errors"].items()) or "-"
        rows.append({"scenario": run.name, "seed": run.seed, **v})
    return pd.DataFrame(rows)


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
    per seed]}``, ``fairlib.chapters.tenantbench.analyze_all``), the mean over seeds: index (scenario,
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


