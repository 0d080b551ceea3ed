"""One run's analysis and the tables over many runs.

``analyze_run`` computes everything ``fairlib.analysis`` defines for one run (latency, goodput,
starvation, token-weighted and residency fairness, windowed Jain, validity) into a
:class:`RunAnalysis`; ``tenant_table``, ``combine``, ``fairness_table``, ``validity_table`` lay
many runs side by side.

- **Victim degradation** (``fairlib.analysis.victim``, re-exported here): a tenant's p99 TTFT/E2E
  and goodput in the contention run over the same in the baseline run (the victim alone at the
  same rate).
- **Validity**: from ``summary.json``: p99 schedule lag against the run's threshold, requested vs
  achieved send rate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import pandas as pd

from fairlib.analysis.common import QS, as_run
from fairlib.analysis.indices import jain_index
from fairlib.analysis.latencies import goodput, latency, latency_wide, starvation
from fairlib.analysis.run_fairness import fairness, windowed_fairness
from fairlib.analysis.service import build_intervals, residency, token_service
from fairlib.analysis.victim import victim_degradation, victim_overview, victim_table
from fairlib.records import Run

__all__ = ["victim_degradation", "validity", "RunAnalysis", "analyze_run", "tenant_table",
           "combine", "pooled_latency", "ci_table", "fairness_table", "validity_table",
           "tenant_latency", "latency_overview", "victim_table", "victim_overview"]


# --- validity ------------------------------------------------------------------------------------
def validity(run) -> dict:
    """The run's own validity, from its summary: ``valid``, ``reason``, schedule lag p50/p99/max
    (ms) against ``threshold_ms``, ``requested_rps``, ``achieved_rps`` and their ratio, requests
    planned and completed, and the error classes seen.

    Parameters
    ----------
    run : Run, str, pathlib.Path or pandas.DataFrame
        The run (anything ``as_run`` takes); its ``summary.json`` is read.

    Returns
    -------
    dict
        ``backend``, ``valid``, ``reason``, ``lag_p50_ms``, ``lag_p99_ms``, ``lag_max_ms``,
        ``threshold_ms``, ``requested_rps``, ``achieved_rps``, ``achieved_over_requested``,
        ``n_planned``, ``n_ok``, ``interrupted`` and ``errors`` (error class -> count, ``none``
        left out); ``None`` for a number the summary lacks.

    Raises
    ------
    ValueError
        A run ``as_run`` refuses.
    """
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
    """Everything :func:`analyze_run` computes for one run (``name`` and ``seed``: the run's).

    Parameters
    ----------
    run : Run
        The run analysed.
    latency : pandas.DataFrame
        :func:`~fairlib.analysis.latency` (long: tenant, metric, q, estimate, low, high, n).
    goodput : pandas.DataFrame
        :func:`~fairlib.analysis.goodput`, per tenant.
    starvation : pandas.DataFrame
        :func:`~fairlib.analysis.starvation`, per tenant.
    tokens : pandas.DataFrame
        :func:`~fairlib.analysis.token_service` over the load window, per tenant.
    residency : pandas.DataFrame
        :func:`~fairlib.analysis.residency` (``prefill="split"``), per tenant.
    fairness : dict
        :func:`~fairlib.analysis.fairness`: the six whole-run indices.
    windowed : pandas.DataFrame
        :func:`~fairlib.analysis.windowed_fairness`, per window.
    validity : dict
        :func:`validity` of the run.
    slos : dict, optional
        Tenant -> ``(ttft_ms, tpot_ms)`` used.
    residency_fitted : pandas.DataFrame, optional
        :func:`~fairlib.analysis.residency` with ``prefill="fitted"``.
    cost_fit : dict, optional
        :func:`~fairlib.analysis.fit_iteration_cost` of the run.
    """

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
    windowed series.

    Parameters
    ----------
    run : Run, str, pathlib.Path or pandas.DataFrame
        The run (anything ``as_run`` takes).
    slos : mapping, optional
        Tenant -> ``(ttft_ms, tpot_ms)``; default ``Run.slos`` (the scenario's).
    window : {"load", "all"} or tuple of float, default "load"
        The window of token service, residency and fairness (``token_service``).
    window_s : float, default 10.0
        Window length (s, > 0) of the windowed Jain series.
    n_boot : int, default 1000
        Bootstrap resamples of the latency intervals.
    seed : int, default 0
        The bootstrap's seed.
    tick_tol_s : float, optional
        The tick tolerance of the stream intervals (s; default from the chunk gaps).

    Returns
    -------
    RunAnalysis
        Every metric of the run.

    Raises
    ------
    ValueError
        No SLOs (neither given nor in the run's config), or what a metric refuses.
    """
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
    starvation, token-weighted and residency shares (%).

    Parameters
    ----------
    a : RunAnalysis
        One run's analysis (:func:`analyze_run`).

    Returns
    -------
    pandas.DataFrame
        Index ``tenant``; columns ``requests``, ``completed``, ``ttft_p50_ms``, ``ttft_p99_ms``,
        ``tpot_p50_ms``, ``tpot_p99_ms``, ``e2e_p50_ms``, ``e2e_p99_ms``, ``goodput_rps``,
        ``slo_attainment_pct``, ``starved_pct``, ``token_share_pct``, ``served_frac_pct``,
        ``residency_share_pct`` and, when fitted, ``residency_fitted_share_pct``.
    """
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
    columns (the standard deviation over runs) for the shares and tail latencies.

    Parameters
    ----------
    analyses : sequence of RunAnalysis
        The analyses of the runs (:func:`analyze_run`).

    Returns
    -------
    pandas.DataFrame
        :func:`tenant_table`'s columns (means over runs); with two runs or more also
        ``ttft_p99_ms_sd``, ``residency_share_pct_sd``, ``token_share_pct_sd`` (ddof 1).
    """
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
    several runs (seeds) of one scenario.

    Parameters
    ----------
    runs : sequence
        The runs (anything ``as_run`` takes), at least one; the first gives the tenants.
    n_boot : int, default 1000
        Bootstrap resamples of each interval.
    seed : int, default 0
        The bootstrap's seed.

    Returns
    -------
    pandas.DataFrame
        :func:`~fairlib.analysis.latency`'s long table over the pooled records.
    """
    runs = [as_run(r) for r in runs]
    recs = pd.concat([r.records for r in runs], ignore_index=True)
    return latency(recs, runs[0].tenant_names, n_boot=n_boot, seed=seed)


def fairness_table(analyses: Sequence[RunAnalysis]) -> pd.DataFrame:
    """The fairness numbers of each run, one row per run (scenario, seed, backend).

    Parameters
    ----------
    analyses : sequence of RunAnalysis
        The analyses of the runs (:func:`analyze_run`).

    Returns
    -------
    pandas.DataFrame
        Columns ``scenario``, ``seed``, ``backend``, the six of :func:`~fairlib.analysis.fairness`,
        ``jain_residency_fitted`` (when fitted), ``windowed_jain_tokens_min`` and
        ``windowed_jain_residency_min``.
    """
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

    Parameters
    ----------
    runs : sequence of RunAnalysis or Run
        :class:`RunAnalysis` objects (their ``validity``) or runs (anything ``as_run`` takes).

    Returns
    -------
    pandas.DataFrame
        One row per run: ``scenario``, ``seed`` and :func:`validity`'s fields.
    """
    rows = []
    for x in runs:
        run = x.run if isinstance(x, RunAnalysis) else as_run(x)
        v = dict(x.validity) if isinstance(x, RunAnalysis) else validity(run)
        v["errors"] = ", ".join(f"{k} {n}" for k, n in v["errors"].items()) or "-"
        rows.append({"scenario": run.name, "seed": run.seed, **v})
    return pd.DataFrame(rows)


def ci_table(lat: pd.DataFrame, digits: int = 1) -> pd.DataFrame:
    """A long latency table as text, one row per (tenant, metric), one column per percentile:
    ``estimate [low, high]`` (ms).

    Parameters
    ----------
    lat : pandas.DataFrame
        A long latency table (:func:`~fairlib.analysis.latency`).
    digits : int, default 1
        Decimals shown.

    Returns
    -------
    pandas.DataFrame
        Index (tenant, metric); one text column per percentile (``p50``, ...); ``-`` where the
        estimate is NaN.
    """
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
    over the run's completed requests (ms): :func:`tenant_table` with p90 beside p50 and p99.

    Parameters
    ----------
    a : RunAnalysis
        One run's analysis (:func:`analyze_run`).
    metrics : sequence of str, default ("ttft", "tpot", "e2e")
        The latency metrics.
    qs : sequence of float, default QS
        The percentiles (p50, p90, p99); each must be one :func:`analyze_run` computed.

    Returns
    -------
    pandas.DataFrame
        Index ``tenant``; columns ``<metric>_p<q>_ms``.

    Raises
    ------
    ValueError
        A percentile the run's latency table lacks.
    """
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
    per seed]}``, ``fairlib.chapters.tenantbench.analyze_all``), the mean over seeds.

    Parameters
    ----------
    results : dict
        ``{(scenario, policy): [RunAnalysis per seed]}`` (``fairlib.chapters.tenantbench.analyze_all``).
    metrics : sequence of str, default ("ttft", "tpot", "e2e")
        The latency metrics.
    qs : sequence of float, default QS
        The percentiles (p50, p90, p99); each must be one :func:`analyze_run` computed.

    Returns
    -------
    pandas.DataFrame
        Index (scenario, policy, tenant); columns ``<metric>_p<q>_ms``.
    """
    parts = []
    for (name, pol), analyses in results.items():
        tabs = [tenant_latency(a, metrics, qs) for a in analyses]
        names = list(tabs[0].index)
        t = pd.concat(tabs).groupby(level="tenant", sort=False).mean().reindex(names)
        t.index = pd.MultiIndex.from_product([[name], [pol], names], names=["scenario", "policy", "tenant"])
        parts.append(t)
    return pd.concat(parts)
