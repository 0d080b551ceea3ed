"""Victim degradation: a tenant's latency percentiles and goodput in the contention runs over the
same in the baseline runs (the victim alone at the same rate), ``ratio = contention / alone``.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from fairlib.analysis.common import QS, as_run, completed, numeric
from fairlib.analysis.indices import percentile_cis
from fairlib.analysis.latencies import goodput
from fairlib.records import Run

__all__ = ["victim_degradation", "victim_table", "victim_overview"]


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

    Parameters
    ----------
    contention : Run or list of Run
        The victim's runs under contention (anything ``as_run`` takes; a list pools seeds).
    baseline : Run or list of Run
        The baseline scenario's runs: the victim alone at the same rate.
    tenant : str, optional
        The victim; default the contention scenario's ``victim``.
    n_boot : int, default 1000
        Bootstrap resamples of each interval.
    seed : int, default 0
        The bootstrap's seed.

    Returns
    -------
    pandas.DataFrame
        Index ``metric`` (``ttft_p50_ms``, ``ttft_p99_ms``, ``e2e_p50_ms``, ``e2e_p99_ms``,
        ``goodput_rps``, ``attainment``); columns ``contention``, ``alone``, ``ratio`` (NaN when
        ``alone`` is 0 or NaN); ``attrs["tenant"]`` the victim.

    Raises
    ------
    ValueError
        No contention or no baseline run, no victim named, or a run without an SLO for it.
    """
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


def victim_table(contention, baseline, tenant: Optional[str] = None, qs: Sequence[float] = QS,
                 n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """:func:`victim_degradation` with every percentile of ``qs`` (p50, p90, p99): the victim's
    TTFT and E2E percentiles (ms, pooled completed requests of the runs given), goodput and
    attainment under contention, alone, and their ratio.

    Parameters
    ----------
    contention : Run or list of Run
        The victim's runs under contention (anything ``as_run`` takes; a list pools seeds).
    baseline : Run or list of Run
        The baseline scenario's runs: the victim alone at the same rate.
    tenant : str, optional
        The victim; default the contention scenario's ``victim``.
    qs : sequence of float, default QS
        The percentiles of TTFT and E2E.
    n_boot : int, default 1000
        Bootstrap resamples of each interval.
    seed : int, default 0
        The bootstrap's seed.

    Returns
    -------
    pandas.DataFrame
        Index ``metric`` (``ttft_p<q>_ms`` and ``e2e_p<q>_ms`` for each ``q``, ``goodput_rps``,
        ``attainment``); columns ``contention``, ``alone``, ``ratio``; ``attrs["tenant"]``.

    Raises
    ------
    ValueError
        As :func:`victim_degradation`.
    """
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
    baseline ran: index (scenario, policy, victim, metric); ``None`` when there is none.

    Parameters
    ----------
    results : dict
        ``{(scenario, policy): [RunAnalysis per seed]}`` (``fairlib.chapters.tenantbench.analyze_all``).
    qs : sequence of float, default QS
        The percentiles of TTFT and E2E.
    n_boot : int, default 500
        Bootstrap resamples (of :func:`victim_degradation`'s intervals).

    Returns
    -------
    pandas.DataFrame or None
        :func:`victim_table`'s rows, indexed (scenario, policy, victim, metric).
    """
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
