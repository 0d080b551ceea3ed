"""Metrics of records: one code path for simulated and measured runs.

Every function takes the records of one run (``fairlib.records``: a measured run directory or
the simulator's records, the same columns) or a ``fairlib.records.Run``.

Modules: ``indices`` (Jain, max/min, water-filling, demand-normalised Jain: functions of
per-tenant vectors; percentiles with bootstrap intervals), ``common`` (the inputs: tenants,
completed requests, SLOs), ``latencies`` (TTFT/TPOT/E2E percentiles, SLO goodput, starvation), ``service``
(token-weighted service, residency from the stream intervals), ``intervals`` (the stream
intervals, the sweep line, the iteration-cost fit), ``run_fairness`` (the fairness indices of a
run, whole and windowed), ``run`` (one run's analysis and the tables over runs, validity),
``victim`` (victim degradation), ``setups`` (runs grouped
by scenario and label, side by side), ``verdict`` (the scenario's question and its answer),
``glossary`` (every column defined once), ``console`` (the summary commands print), ``charts``
and ``report_charts`` (altair), ``reporting`` (the Markdown report and ``fairlib analyze``).

    from fairlib import analysis as an
    a = an.analyze_run("runs/http/noisy_neighbor/seed0")
    an.tenant_table(a)
"""
from fairlib.analysis.charts import goodput_chart, latency_chart, share_chart, windowed_chart
from fairlib.analysis.common import DECODE_WEIGHT, PREFILL_WEIGHT, QS, REFUSED, STARVATION_FACTOR, as_run
from fairlib.analysis.indices import demand_normalised_jain, jain_index, max_min_ratio, percentile_cis, water_fill
from fairlib.analysis.latencies import goodput, latency, latency_wide, starvation
from fairlib.analysis.glossary import DEFINITIONS, glossary_markdown, glossary_table
from fairlib.analysis.reporting import main, report
from fairlib.analysis.run import (RunAnalysis, analyze_run, ci_table, combine, fairness_table, latency_overview,
                                  pooled_latency, tenant_latency, tenant_table, validity, validity_table,
                                  victim_degradation, victim_overview, victim_table)
from fairlib.analysis.run_fairness import fairness, windowed_fairness
from fairlib.analysis.service import (build_intervals, fit_iteration_cost, residency, stream_intervals,
                                      token_service)
from fairlib.analysis.setups import Setup, build_setups, compare, comparison_table, group_runs, summary_table
from fairlib.analysis.verdict import Verdict, verdict

__all__ = ["QS", "STARVATION_FACTOR", "PREFILL_WEIGHT", "DECODE_WEIGHT", "REFUSED", "as_run",
           "jain_index", "max_min_ratio", "water_fill", "demand_normalised_jain", "percentile_cis",
           "latency", "latency_wide", "goodput", "starvation",
           "token_service", "stream_intervals", "build_intervals", "residency", "fit_iteration_cost", "windowed_fairness", "fairness",
           "RunAnalysis", "analyze_run", "victim_degradation", "validity", "tenant_table", "combine",
           "pooled_latency", "ci_table", "fairness_table", "validity_table", "tenant_latency", "latency_overview",
           "victim_table", "victim_overview",
           "latency_chart", "share_chart", "windowed_chart", "goodput_chart", "report", "main",
           "DEFINITIONS", "glossary_markdown", "glossary_table", "Setup", "build_setups", "compare",
           "comparison_table", "group_runs", "summary_table", "Verdict", "verdict"]
