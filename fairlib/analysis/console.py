"""What ``fairlib run``, ``simulate`` and ``analyze`` print at the end, as ``vllm bench serve``
prints its result: the run's outcome, a per-tenant table, fairness, the question and the verdict,
and the first distinct server messages of the failed requests.

    fairlib run: noisy_neighbor seed 0 [http:127.0.0.1:8000]: VALID ...
    tenant         ok  failed  refused  TTFT p50 ms  TTFT p99 ms  ...
    interactive   101       0        0         41.2        212.9  ...
    fairness: Jain of residency 0.99 (demand-normalised), max/min 1.9, worst window 0.71
    question: latency isolation (demand below capacity): read interactive's TTFT p99 ...
    verdict: Latency isolation held: interactive's TTFT p99 was 213 ms, within its 500 ms SLO (...).

The table's cells are ``fairlib.analysis.setups.format_summary``'s, the same strings as the
report's Summary table.
"""
from __future__ import annotations

import math

import pandas as pd
from tabulate import tabulate

from fairlib.analysis.setups import Setup, format_summary, summary_table

__all__ = ["setup_summary", "messages_text", "outcome_line", "table_text", "compare_text", "number"]


def table_text(df: pd.DataFrame, left: tuple = ()) -> str:
    """A text table, cells as they are: the index and the ``left`` columns aligned left, the rest right."""
    d = df.reset_index()
    align = ["left" if i < df.index.nlevels or c in left else "right" for i, c in enumerate(d.columns)]
    return tabulate(d, headers="keys", tablefmt="simple", showindex=False, disable_numparse=True, colalign=align)


def outcome_line(summary: dict) -> str:
    """VALID/INVALID with the counts, the schedule lag and the rates."""
    lag = summary.get("schedule_lag_ms") or {}
    fmt = (lambda v: "-" if v is None else f"{v:.2f}")
    state = "VALID" if summary.get("valid") else f"INVALID ({summary.get('valid_reason')})"
    if summary.get("interrupted"):
        state += " [interrupted]"
    n_ref = summary.get("n_refused", 0)
    return (f"{state}: {summary.get('n_ok')}/{summary.get('n_planned')} ok, {summary.get('n_errors', 0)} failed"
            + (f", {n_ref} refused (429)" if n_ref else "")
            + f"; schedule lag p50 {fmt(lag.get('p50'))} ms, p99 {fmt(lag.get('p99'))} ms; requested "
            f"{fmt(summary.get('requested_rate_rps'))} req/s, achieved {fmt(summary.get('achieved_rate_rps'))}")


def messages_text(summary: dict) -> list:
    """One line per distinct server message (``summary["error_messages"]``), with its count."""
    msgs = summary.get("error_messages") or []
    if not msgs:
        return []
    out = ["server messages (first distinct, with counts):"]
    for m in msgs:
        out.append(f"  {m['count']:>6} x {m['error_class']}: {m['message'][:240]}")
    return out


def setup_summary(setup: Setup, cmd: str) -> str:
    """The console summary of one setup (all its seeds)."""
    lines = []
    for a in setup.analyses:
        lines.append(f"{cmd}: {setup.scenario} seed {a.seed} [{setup.label}]: {outcome_line(a.run.summary)}")
        lines += messages_text(a.run.summary)
    if not setup.table["completed"].sum():
        lines.append("no request completed: no latency, share or verdict to show")
        return "\n".join(lines)
    if len(setup.analyses) > 1:
        lines.append(f"{len(setup.analyses)} seeds: ok/failed/refused summed, the rest means over seeds")
    lines.append(table_text(format_summary(summary_table(setup))))
    f = setup.fairness
    parts = []
    for key, name in (("jain_residency_demand", "Jain of residency (demand-normalised)"),
                      ("max_min_residency", "max/min residency"),
                      ("windowed_jain_residency_min", "worst window's residency Jain")):
        if not math.isnan(f.get(key, math.nan)):
            parts.append(f"{name} {f[key]:.3f}")
    if parts:
        lines.append("fairness: " + ", ".join(parts))
    v = setup.verdict
    lines.append(f"question: {v.asks}")
    lines.append(f"verdict{'' if setup.valid else ' (of an INVALID run: not to be trusted)'}: {v.answer}")
    return "\n".join(lines)


def number(v) -> str:
    """A number as the console shows it: whole above 1000, two decimals above 1, else 3 significant digits."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    a = abs(float(v))
    if math.isinf(a):
        return "inf" if v > 0 else "-inf"
    return f"{v:.0f}" if a >= 1000 else f"{v:.2f}" if a >= 1 else f"{v:.3g}"


def compare_text(table: pd.DataFrame) -> str:
    """``fairlib.analysis.setups.compare``'s table as text: the two setups, delta and ratio."""
    return table_text(table.map(number))
