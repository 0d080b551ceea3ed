"""Which question a scenario asks, and its answer in one sentence from a run's numbers.

- **Demand below capacity** (the scenario's offered load < 1): every request can be served, so
  whole-run shares follow demand and cannot move; the question is **latency isolation**: does a
  neighbour's load raise the victim's latency? Read the victim's TTFT p99 (against its SLO and
  its baseline alone) and the windowed minimum Jain (the worst stretch). Isolation *held* when the
  victim's TTFT p99 is within its TTFT SLO.
- **Demand at or above capacity**: someone must wait; the question is **shares**: does each tenant
  get its fair part of the machine? Read the demand-normalised Jain of residency and max/min.
  Shares are *fair* when that Jain is at least :data:`FAIR_JAIN`.

A scenario without a load figure asks isolation when it names a victim, else shares. The victim
is the scenario's ``victim``, else the tenant whose TTFT p99 is furthest over (or nearest to) its
SLO.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import pandas as pd

__all__ = ["Verdict", "verdict", "question_of", "mean_fairness", "FAIR_JAIN", "QUESTIONS"]

FAIR_JAIN = 0.95     # demand-normalised Jain of residency at or above which shares are called fair
QUESTIONS = ("isolation", "shares")


@dataclass(frozen=True)
class Verdict:
    """A scenario's question and its answer (:func:`verdict`).

    Parameters
    ----------
    question : {"isolation", "shares"}
        The question (:data:`QUESTIONS`).
    asks : str
        The question and what to read to answer it.
    answer : str
        The answer, one sentence.
    ok : bool or None
        Isolation held / shares were fair; ``None`` when nothing completed.
    tenant : str, optional
        The victim read, for isolation.
    """

    question: str
    asks: str
    answer: str
    ok: Optional[bool]
    tenant: Optional[str] = None


def _ms(v: float) -> str:
    return f"{v:,.0f} ms" if v >= 100 else f"{v:,.1f} ms"


def question_of(scenario: dict) -> tuple:
    """``(question, offered load or None)`` of a run's scenario (``config.extra.scenario``)."""
    load = scenario.get("offered_load", scenario.get("rho"))
    load = float(load) if isinstance(load, (int, float)) and math.isfinite(load) else None
    if load is None:
        return ("isolation" if scenario.get("victim") else "shares"), None
    return ("isolation" if load < 1.0 else "shares"), load


def _victim(scenario: dict, table: pd.DataFrame, slos: dict) -> str:
    v = scenario.get("victim")
    if v is not None and v in table.index:
        return str(v)
    over = {t: table.loc[t, "ttft_p99_ms"] / slos[t][0] for t in table.index
            if t in slos and not math.isnan(table.loc[t, "ttft_p99_ms"])}
    return str(max(over, key=lambda t: over[t])) if over else str(table.index[0])


def verdict(table: pd.DataFrame, fairness: dict, scenario: dict, slos: dict,
            victim: Optional[pd.DataFrame] = None) -> Verdict:
    """The verdict of one setup: ``table`` its per-tenant table (``combine``: means over seeds),
    ``fairness`` its fairness numbers (means over seeds of ``fairness_table``'s columns),
    ``scenario`` the run's scenario dict, ``slos`` tenant -> (ttft_ms, tpot_ms), ``victim`` its
    victim degradation against the baseline when that ran (``victim_degradation``).

    Isolation held when the victim's ``TTFT p99 <= ttft_ms``; shares are fair when the
    demand-normalised Jain of residency is at least :data:`FAIR_JAIN` (0.95).

    Parameters
    ----------
    table : pandas.DataFrame
        Per-tenant table (:func:`~fairlib.analysis.combine`): ``ttft_p99_ms``, ``completed``,
        ``slo_attainment_pct``, ``residency_share_pct``.
    fairness : dict
        Fairness numbers, means over seeds (``jain_residency_demand``, ``max_min_residency``,
        ``windowed_jain_residency_min``).
    scenario : dict
        The run's scenario (``config.extra.scenario``): ``offered_load`` or ``rho``, ``victim``.
    slos : dict
        Tenant -> ``(ttft_ms, tpot_ms)``.
    victim : pandas.DataFrame, optional
        The victim's degradation (:func:`~fairlib.analysis.victim_degradation`).

    Returns
    -------
    Verdict
        The question (isolation below capacity, else shares) and its answer.
    """
    q, load = question_of(scenario)
    where = f" (offered load {load:.2f} of capacity)" if load is not None else ""
    done = table["completed"].sum() if "completed" in table else 0
    if q == "isolation":
        who = _victim(scenario, table, slos)
        asks = (f"Demand is below capacity{where}: every request can be served, so whole-run shares follow "
                f"demand; the question is latency isolation, does a neighbour's load raise {who}'s latency? "
                f"Read {who}'s TTFT p99 against its SLO and its baseline alone, and the windowed minimum Jain.")
        p99 = float(table.loc[who, "ttft_p99_ms"])
        if not done or math.isnan(p99):
            return Verdict(q, asks, f"No request of {who} completed: nothing to judge.", None, who)
        slo = slos[who][0]
        ok = p99 <= slo
        extra = []
        if victim is not None and "ttft_p99_ms" in victim.index and not math.isnan(victim.loc["ttft_p99_ms", "ratio"]):
            extra.append(f"{victim.loc['ttft_p99_ms', 'ratio']:.1f}x its {_ms(victim.loc['ttft_p99_ms', 'alone'])} "
                         f"alone")
        extra.append(f"SLO attainment {table.loc[who, 'slo_attainment_pct']:.1f}%")
        wmin = fairness.get("windowed_jain_residency_min", math.nan)
        tail = f"; the worst window's residency Jain was {wmin:.2f}" if not math.isnan(wmin) else ""
        answer = (f"Latency isolation {'held' if ok else 'did not hold'}: {who}'s TTFT p99 was {_ms(p99)}, "
                  f"{'within' if ok else 'over'} its {_ms(slo)} SLO ({', '.join(extra)}){tail}.")
        return Verdict(q, asks, answer, ok, who)
    asks = (f"Demand is at or above capacity{where}: someone must wait, so the question is shares, does each "
            f"tenant get its fair part of the machine? Read the demand-normalised Jain of residency and max/min.")
    jain = fairness.get("jain_residency_demand", math.nan)
    shares = table["residency_share_pct"].dropna() if "residency_share_pct" in table else pd.Series(dtype=float)
    if not done or math.isnan(jain) or shares.empty:
        return Verdict(q, asks, "No request completed: nothing to judge.", None)
    ok = jain >= FAIR_JAIN
    lo, hi = shares.idxmin(), shares.idxmax()
    mm = fairness.get("max_min_residency", math.nan)
    answer = (f"Shares were {'fair' if ok else 'not fair'}: the demand-normalised Jain of residency was {jain:.3f} "
              f"({'>=' if ok else '<'} {FAIR_JAIN:g}); residency shares ran from {shares[lo]:.1f}% ({lo}) to "
              f"{shares[hi]:.1f}% ({hi})" + (f", max/min {mm:.2f}" if not math.isnan(mm) else "") + ".")
    return Verdict(q, asks, answer, ok)


def mean_fairness(rows: pd.DataFrame, columns: Sequence[str]) -> dict:
    """The mean over seeds of ``columns`` of a ``fairness_table``."""
    return {c: float(pd.to_numeric(rows[c], errors="coerce").mean()) for c in columns if c in rows}
