"""Latency, SLO goodput and starvation per tenant, over the requests of one run.

- **Latency**: TTFT = first token chunk - actual send; TPOT = (E2E - TTFT) / (tokens - 1);
  E2E = last token chunk - actual send; over the requests that completed (``error_class ==
  "none"``); percentiles p50/p90/p99 (``np.percentile``, linear) with 95% percentile-bootstrap
  intervals (``fairlib.analysis.indices.percentile_cis``; IID resampling: optimistic for queueing
  series).
- **SLO goodput** (DistServe): completed requests per second of the load window that met both the
  tenant's TTFT and TPOT SLOs (a one-token answer has no TPOT and meets it); attainment = those
  over the requests sent.
- **Starvation incidence**: among the requests the server accepted (not refused with 429/4xx, not
  a connection failure), the fraction whose TTFT exceeded ``10 x`` the tenant's TTFT SLO or that
  never got a first token.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fairlib.analysis.common import (
    QS,
    REFUSED,
    STARVATION_FACTOR,
    completed,
    numeric,
    slo_of,
    tenant_index,
    tenant_names_of,
)
from fairlib.analysis.indices import percentile_cis

__all__ = ["latency", "latency_wide", "goodput", "starvation"]



# --- latency -------------------------------------------------------------------------------------
def latency(records: pd.DataFrame, tenant_names=None, qs: Sequence[float] = QS, n_boot: int = 1000,
            seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """Per-tenant TTFT, TPOT and E2E percentiles (ms) with bootstrap intervals, over the requests
    that completed (``error_class == "none"``): TTFT = first token - send, TPOT = (E2E - TTFT) /
    (tokens - 1), E2E = last token - send (:func:`~fairlib.analysis.percentile_cis`).

    Parameters
    ----------
    records : pandas.DataFrame
        One run's records (``fairlib.records.RECORD_COLUMNS``; ``Run.records``).
    tenant_names : sequence of str, optional
        The tenants, in order (default: the records' ``tenant_name`` by ``tenant`` index); a
        record naming another tenant is an error.
    qs : sequence of float, default QS
        The percentiles (``QS`` = 50, 90, 99).
    n_boot : int, default 1000
        Bootstrap resamples of each interval.
    seed : int, default 0
        The bootstrap's seed.
    level : float, default 0.95
        The intervals' confidence level, in ``(0, 1)``.

    Returns
    -------
    pandas.DataFrame
        Long format, one row per (tenant, metric, q): ``tenant``, ``metric`` (``ttft``, ``tpot``,
        ``e2e``), ``q``, ``estimate``, ``low``, ``high`` (ms; NaN with no sample) and ``n`` (the
        sample size).

    Raises
    ------
    ValueError
        A record naming a tenant not in ``tenant_names``, or a bad ``qs``/``n_boot``/``level``.
    """
    names = tenant_names_of(records, tenant_names)
    t = tenant_index(records, names)
    ok = completed(records)
    vals = {m: numeric(records, f"{m}_s") * 1e3 for m in ("ttft", "tpot", "e2e")}
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
    plus ``..._low``/``..._high`` columns when ``with_ci``.

    Parameters
    ----------
    lat : pandas.DataFrame
        A long latency table (:func:`latency`).
    with_ci : bool, default False
        Add each percentile's interval bounds as ``<metric>_p<q>_low`` and ``..._high``.

    Returns
    -------
    pandas.DataFrame
        Index ``tenant`` (in ``lat``'s order), one column ``<metric>_p<q>`` per metric and
        percentile (ms).
    """
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
    """SLO goodput per tenant (DistServe): ``goodput_rps = met_both / duration_s``, where
    ``met_both`` counts the completed requests with ``TTFT <= ttft_ms`` and ``TPOT <= tpot_ms``
    (a one-token answer has no TPOT and meets it); ``attainment = met_both / sent``.

    Parameters
    ----------
    records : pandas.DataFrame
        One run's records (``fairlib.records.RECORD_COLUMNS``; ``Run.records``).
    slos : mapping
        Tenant name -> ``(ttft_ms, tpot_ms)`` (a tuple, ``fairlib.scenarios.SLO`` or a mapping
        with those keys), one for every tenant.
    duration_s : float
        The load window (s, > 0) the rates are over (``Run.duration_s``).
    tenant_names : sequence of str, optional
        The tenants, in order (default: the records' ``tenant_name`` by ``tenant`` index); a
        record naming another tenant is an error.

    Returns
    -------
    pandas.DataFrame
        Index ``tenant``; columns ``ttft_slo_ms``, ``tpot_slo_ms``, ``sent``, ``completed``,
        ``met_ttft``, ``met_tpot``, ``met_both``, ``attainment`` (NaN when none was sent),
        ``goodput_rps`` and ``throughput_rps`` (completed / duration_s).

    Raises
    ------
    ValueError
        ``duration_s`` not > 0, a tenant without an SLO, or a record naming an unknown tenant.
    """
    if not (isinstance(duration_s, (int, float, np.integer, np.floating)) and duration_s > 0):
        raise ValueError(f"goodput: duration_s must be a number > 0, got {duration_s!r}")
    names = tenant_names_of(records, tenant_names)
    t = tenant_index(records, names)
    ok = completed(records)
    sent = ~np.isnan(numeric(records, "actual_send_s"))
    ttft = numeric(records, "ttft_s") * 1e3
    tpot = numeric(records, "tpot_s") * 1e3
    rows = []
    for i, n in enumerate(names):
        slo_ttft, slo_tpot = slo_of(slos, n)
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
    """Starvation incidence per tenant: ``incidence = starved / accepted``, where ``accepted`` are
    the requests sent and not refused (``REFUSED``: 429, 4xx, connection failures) and
    ``starved`` those of them with ``TTFT > factor * ttft_ms`` or no first token at all.

    Parameters
    ----------
    records : pandas.DataFrame
        One run's records (``fairlib.records.RECORD_COLUMNS``; ``Run.records``).
    slos : mapping
        Tenant name -> ``(ttft_ms, tpot_ms)`` (a tuple, ``fairlib.scenarios.SLO`` or a mapping
        with those keys), one for every tenant.
    factor : float, default STARVATION_FACTOR
        The multiple of the TTFT SLO beyond which a request counts as starved (default 10).
    tenant_names : sequence of str, optional
        The tenants, in order (default: the records' ``tenant_name`` by ``tenant`` index); a
        record naming another tenant is an error.

    Returns
    -------
    pandas.DataFrame
        Index ``tenant``; columns ``accepted``, ``starved``, ``incidence`` (NaN when none was
        accepted) and ``refused``.

    Raises
    ------
    ValueError
        A tenant without an SLO, or a record naming an unknown tenant.
    """
    names = tenant_names_of(records, tenant_names)
    t = tenant_index(records, names)
    sent = ~np.isnan(numeric(records, "actual_send_s"))
    refused = records["error_class"].isin(REFUSED).to_numpy()
    ttft = numeric(records, "ttft_s") * 1e3
    rows = []
    for i, n in enumerate(names):
        slo_ttft, _ = slo_of(slos, n)
        mine = t == i
        acc = mine & sent & ~refused
        starved = acc & (np.isnan(ttft) | (ttft > factor * slo_ttft))
        na = int(acc.sum())
        rows.append({"tenant": n, "accepted": na, "starved": int(starved.sum()),
                     "incidence": starved.sum() / na if na else math.nan,
                     "refused": int((mine & refused).sum())})
    return pd.DataFrame(rows).set_index("tenant")
