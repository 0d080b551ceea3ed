"""Every column ``fairlib analyze`` writes, defined once: the report's glossary section, the
console summary's headings and the book's page on measuring (book/serve-and-probe.md) all read
:data:`DEFINITIONS`.

    glossary_markdown(["ttft_p99_ms", "jain_residency_demand"])   # the report's section
    glossary_table()                                               # all of it, as a DataFrame
"""
from __future__ import annotations

from typing import Iterable, Optional

import pandas as pd

from fairlib.analysis.common import DECODE_WEIGHT, PREFILL_WEIGHT, STARVATION_FACTOR

__all__ = ["DEFINITIONS", "define", "glossary_table", "glossary_markdown"]

_W = f"token-weighted service ({PREFILL_WEIGHT:g} x prompt + {DECODE_WEIGHT:g} x output tokens, VTC's weights)"

#: column -> definition (one sentence, plain text: it is printed in Markdown and on a console).
DEFINITIONS = {
    # per tenant
    "requests": "requests of the tenant sent in the run",
    "completed": "requests answered in full (every max_tokens token, error class none)",
    "ok": "requests answered in full (error class none)",
    "failed": "requests that failed (an HTTP error other than 429, a timeout, a disconnect, a short stream)",
    "refused": "requests refused with HTTP 429 (a rate limit or an admission control: the policy's decision)",
    "ttft_p50_ms": "time to first token, median over the completed requests (ms): first token chunk - send",
    "ttft_p90_ms": "time to first token, 90th percentile over the completed requests (ms)",
    "ttft_p99_ms": "time to first token, 99th percentile over the completed requests (ms)",
    "tpot_p50_ms": "time per output token after the first, median (ms): (E2E - TTFT) / (tokens - 1)",
    "tpot_p90_ms": "time per output token after the first, 90th percentile (ms)",
    "tpot_p99_ms": "time per output token after the first, 99th percentile (ms)",
    "e2e_p50_ms": "end-to-end latency, median (ms): last token chunk - send",
    "e2e_p90_ms": "end-to-end latency, 90th percentile (ms)",
    "e2e_p99_ms": "end-to-end latency, 99th percentile (ms)",
    "goodput_rps": "requests per second of the load window that completed and met both of the tenant's SLOs "
                   "(TTFT and TPOT)",
    "slo_attainment_pct": "share of the tenant's sent requests that completed within both SLOs (%)",
    "starved_pct": f"share of the accepted requests whose TTFT exceeded {STARVATION_FACTOR:g} x the TTFT SLO or "
                   "that never got a first token (%)",
    "token_share_pct": f"the tenant's part of all {_W} delivered in the load window (%)",
    "served_frac_pct": "token-weighted service delivered / the service the tenant asked for, in the load "
                       "window (%): below 100 the tenant's demand was not met",
    "residency_share_pct": "residency: the tenant's part of the machine time, each instant of the run split "
                           "equally among the streams in the running batch (%)",
    "share_pct": "residency share: the tenant's part of the machine time (%), as residency_share_pct",
    "residency_fitted_share_pct": "residency share with prefill priced by the cost fitted from the stream "
                                  "timings (each iteration's prefill * P charged to the streams it started) (%)",
    "p50": "in the latency table: the median of the metric (ms) over the pooled completed requests, with its 95% "
           "percentile-bootstrap interval [low, high]",
    "p90": "in the latency table: the 90th percentile (ms) with its 95% bootstrap interval",
    "p99": "in the latency table: the 99th percentile (ms) with its 95% bootstrap interval",
    "ttft_p99_ms_sd": "standard deviation over seeds of ttft_p99_ms",
    "residency_share_pct_sd": "standard deviation over seeds of residency_share_pct",
    "token_share_pct_sd": "standard deviation over seeds of token_share_pct",
    # fairness
    "jain_tokens": f"Jain's index (sum x)^2 / (n sum x^2) of the tenants' {_W}: 1 is an even split, 1/n one "
                   "tenant got everything",
    "jain_tokens_demand": "Jain's index of each tenant's token-weighted service over its max-min fair "
                          "(water-filling) share of what was delivered, given its demand: 1 is fair whatever the "
                          "tenants asked for",
    "max_min_tokens": "largest / smallest tenant's token-weighted service (raw: 1 is an even split)",
    "jain_residency": "Jain's index of the tenants' residency (machine time)",
    "jain_residency_demand": "Jain's index of residency over each tenant's max-min fair share given its demand in "
                             "machine time: the index the book reads for fairness",
    "max_min_residency": "largest / smallest tenant's residency (raw)",
    "jain_residency_fitted": "Jain's index of residency with prefill priced by the fitted cost",
    "windowed_jain_tokens_min": "the lowest Jain index of token-weighted service over the windows of the run "
                                "(tenants with a request outstanding in the window): the worst stretch",
    "windowed_jain_residency_min": "the lowest Jain index of residency over the windows of the run: the worst "
                                   "stretch, where a bursting neighbour shows",
    # validity
    "valid": "the measurement holds: complete, at least one success, at most --max-error-rate of the answers "
             "failed, p99 schedule lag within its threshold",
    "reason": "why the run is valid or which condition failed",
    "lag_p50_ms": "schedule lag, median (ms): actual - intended send time",
    "lag_p99_ms": "schedule lag, 99th percentile (ms): above the threshold the client fell behind",
    "lag_max_ms": "schedule lag, largest (ms)",
    "threshold_ms": "the p99 schedule lag the run allows (--lag-threshold-ms)",
    "requested_rps": "requests per second the schedule asks for",
    "achieved_rps": "requests per second actually sent",
    "achieved_over_requested": "achieved / requested send rate",
    "n_planned": "requests in the schedule",
    "n_ok": "requests answered in full",
    "n_refused": "requests refused with HTTP 429",
    "n_errors": "requests that failed",
    "interrupted": "the run was stopped before its end (a signal)",
    "errors": "error classes seen, with counts",
    "backend": "sim (the engine model) or http (a live endpoint)",
    "label": "the setup measured (--label; default backend:policy, e.g. sim:residency, http:gateway-residency)",
    # victim
    "contention": "the victim's value with its neighbour (the scenario)",
    "alone": "the victim's value alone at the same rate (the baseline scenario)",
    "ratio": "contention / alone: above 1 for a latency, below 1 for goodput or attainment, is the damage",
    "attainment": "share of the victim's sent requests that met both SLOs (0 to 1)",
    # the cost fitted from the streams
    "iter_base_ms": "fitted fixed cost of one iteration (ms)",
    "iter_slope_ms": "fitted cost per sequence in the running batch (ms)",
    "prefill_ms_per_token": "fitted cost per prompt token admitted (ms)",
    "r2": "R^2 of the fit over the iterations the streams show",
    "n_ticks": "iterations the streams show (token emissions of the whole run)",
}


def define(name: str) -> str:
    """The definition of a column; ``KeyError`` naming the known ones otherwise."""
    if name not in DEFINITIONS:
        raise KeyError(f"no definition of {name!r}; fairlib.analysis.glossary.DEFINITIONS has {sorted(DEFINITIONS)}")
    return DEFINITIONS[name]


def glossary_table(names: Optional[Iterable[str]] = None) -> pd.DataFrame:
    """``column`` and ``definition`` for ``names`` (default all), in order.

    Parameters
    ----------
    names : iterable of str, optional
        Column names defined in :data:`DEFINITIONS`; default all of them.

    Returns
    -------
    pandas.DataFrame
        Columns ``column`` and ``definition``, one row per name.

    Raises
    ------
    KeyError
        A name without a definition (the known ones listed).
    """
    names = list(DEFINITIONS) if names is None else list(dict.fromkeys(names))
    return pd.DataFrame({"column": names, "definition": [define(n) for n in names]})


def glossary_markdown(names: Optional[Iterable[str]] = None) -> str:
    """A Markdown definition list of ``names`` (default all): ``- **name**: definition``.

    Parameters
    ----------
    names : iterable of str, optional
        Column names defined in :data:`DEFINITIONS`; default all of them.

    Returns
    -------
    str
        One line per name.

    Raises
    ------
    KeyError
        A name without a definition (the known ones listed).
    """
    return "\n".join(f"- **{r.column}**: {r.definition}" for r in glossary_table(names).itertuples())
