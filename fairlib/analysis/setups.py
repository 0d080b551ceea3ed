"""Runs grouped by the setup they measured, and setups side by side.

A **setup** is one scenario measured one way: runs of the same scenario with the same ``label``
(``fairlib.records.Run.label``: ``sim:residency``, ``http:gateway-residency``, ...). Seeds of one
setup are pooled or averaged; two labels never are (``group_runs``). ``Setup`` holds a setup's
analyses, its victim degradation against the baseline scenario's runs of the same label (or, when
only another label's baseline ran, that label's, named in ``baseline_label``) and its verdict.

- ``summary_table``: the per-tenant summary the console and the report print (``ok``/``failed``/
  ``refused`` summed over seeds; latencies, goodput, attainment and share the means over seeds of
  ``fairlib.analysis.run.combine``), ``format_summary`` its text.
- ``comparison_table``: one column per setup of a scenario, one row per number that answers the
  scenario's question (the victim's TTFT p99, attainment and goodput, every tenant's share, Jain,
  max/min, the windowed minimum, failed requests); ``compare`` two setups with their deltas.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from fairlib.analysis.run import RunAnalysis, analyze_run, combine, fairness_table, victim_degradation
from fairlib.analysis.verdict import Verdict, mean_fairness, verdict
from fairlib.records import Run

__all__ = ["Setup", "group_runs", "build_setups", "summary_table", "format_summary", "comparison_table",
           "compare", "SUMMARY_COLUMNS", "FAIRNESS_COLUMNS"]

#: The console summary's columns (glossary names) and their headings.
SUMMARY_COLUMNS = {"ok": "ok", "failed": "failed", "refused": "refused", "ttft_p50_ms": "TTFT p50 ms",
                   "ttft_p99_ms": "TTFT p99 ms", "tpot_p50_ms": "TPOT p50 ms", "tpot_p99_ms": "TPOT p99 ms",
                   "e2e_p50_ms": "E2E p50 ms", "e2e_p99_ms": "E2E p99 ms", "goodput_rps": "goodput req/s",
                   "slo_attainment_pct": "SLO att. %", "share_pct": "share %"}
FAIRNESS_COLUMNS = ("jain_tokens", "jain_tokens_demand", "max_min_tokens", "jain_residency", "jain_residency_demand",
                    "max_min_residency", "windowed_jain_tokens_min", "windowed_jain_residency_min")
_DIGITS = {"goodput_rps": 3}


def group_runs(runs: Sequence[Run]) -> dict:
    """``{(scenario, label): [runs by seed]}``, in order of scenario, then label.

    Parameters
    ----------
    runs : sequence of Run
        The runs (``Run.name`` is the scenario, ``Run.label`` the setup).

    Returns
    -------
    dict
        ``(scenario, label) -> list of Run``, sorted by scenario, label, then seed.
    """
    groups: dict = {}
    for r in sorted(runs, key=lambda r: (str(r.name), str(r.label), str(r.seed))):
        groups.setdefault((r.name, r.label), []).append(r)
    return groups


@dataclass
class Setup:
    """One scenario measured one way (see the module docstring).

    Its properties: ``runs``, ``seeds``, ``spec`` (the scenario dict), ``table``
    (:func:`~fairlib.analysis.combine` of the analyses), ``fairness_rows``, ``fairness`` (their
    means over seeds), ``verdict`` and ``valid`` (every run valid).

    Parameters
    ----------
    scenario : str
        The scenario's name.
    label : str
        The setup's label (``Run.label``).
    analyses : list of RunAnalysis
        One per seed (:func:`~fairlib.analysis.analyze_run`).
    victim : pandas.DataFrame, optional
        Its :func:`~fairlib.analysis.victim_degradation`, when the baseline ran.
    baseline_label : str, optional
        The label of the baseline runs compared with (another label's when this one's did not run).
    notes : list of str, optional
        What the report should say about the setup (a missing baseline, ...).
    """

    scenario: str
    label: str
    analyses: list
    victim: Optional[pd.DataFrame] = None
    baseline_label: Optional[str] = None
    notes: list = field(default_factory=list)

    @property
    def runs(self) -> list:
        return [a.run for a in self.analyses]

    @property
    def seeds(self) -> list:
        return [a.seed for a in self.analyses]

    @property
    def spec(self) -> dict:
        return self.runs[0].scenario

    @cached_property
    def table(self) -> pd.DataFrame:
        return combine(self.analyses)

    @cached_property
    def fairness_rows(self) -> pd.DataFrame:
        return fairness_table(self.analyses)

    @cached_property
    def fairness(self) -> dict:
        return mean_fairness(self.fairness_rows, FAIRNESS_COLUMNS)

    @cached_property
    def verdict(self) -> Verdict:
        return verdict(self.table, self.fairness, self.spec, self.analyses[0].slos, self.victim)

    @property
    def valid(self) -> bool:
        return all(a.validity["valid"] for a in self.analyses)


def _baseline_for(scen: dict, label: str, backend: str, pool: dict):
    """The baseline scenario's runs for a setup: the same label, else the same backend, else the
    first label that ran; ``(runs, label)`` or ``(None, None)``."""
    name = scen.get("baseline")
    cands = {lab: rs for (n, lab), rs in pool.items() if n == name}
    if not cands:
        return None, None
    if label in cands:
        return cands[label], label
    same = [lab for lab, rs in cands.items() if rs[0].backend == backend]
    lab = same[0] if same else next(iter(cands))
    return cands[lab], lab


def build_setups(runs: Sequence[Run], baselines: Sequence[Run] = (), *, window_s: float = 10.0,
                 n_boot: int = 1000, on_run=None) -> list:
    """The setups of ``runs`` (analysed), each with its victim degradation when the scenario names
    a victim and runs of its baseline are among ``runs`` or ``baselines``.

    Parameters
    ----------
    runs : sequence of Run
        The runs to analyse, grouped by :func:`group_runs`.
    baselines : sequence of Run, default ()
        More runs to find baselines among (not reported as setups themselves).
    window_s : float, default 10.0
        Window length (s) of the windowed Jain series.
    n_boot : int, default 1000
        Bootstrap resamples of the latency intervals.
    on_run : callable, optional
        Called with no argument after each run is analysed (a progress count).

    Returns
    -------
    list of Setup
        One per (scenario, label), in :func:`group_runs`'s order.
    """
    pool = group_runs(list(runs) + list(baselines))
    out = []
    for (name, label), rs in group_runs(runs).items():
        analyses = []
        for r in rs:
            analyses.append(analyze_run(r, window_s=window_s, n_boot=n_boot))
            if on_run is not None:
                on_run()
        s = Setup(name, label, analyses)
        scen = rs[0].scenario
        if scen.get("victim") and scen.get("baseline"):
            bl, blab = _baseline_for(scen, label, rs[0].backend, pool)
            if bl is None:
                s.notes.append(f"No run of the baseline scenario {scen['baseline']!r} was given (--baseline DIR): "
                               f"no victim degradation.")
            elif any(r.records["error_class"].eq("none").any() for r in bl) and s.table["completed"].sum():
                s.victim = victim_degradation(rs, bl, scen["victim"], n_boot=n_boot)
                s.baseline_label = blab
                if blab != label:
                    s.notes.append(f"The baseline ran only as {blab!r}: the victim is compared with that setup alone.")
        out.append(s)
    return out


def _outcomes(a: RunAnalysis) -> pd.DataFrame:
    rec = a.run.records
    names = a.run.tenant_names
    cls = rec["error_class"].astype(str)
    t = rec["tenant_name"].astype(str)
    out = pd.DataFrame(index=pd.Index(names, name="tenant"))
    out["ok"] = [int(((t == n) & (cls == "none")).sum()) for n in names]
    out["refused"] = [int(((t == n) & (cls == "http_429")).sum()) for n in names]
    out["failed"] = [int(((t == n) & ~cls.isin(["none", "http_429", "interrupted"])).sum()) for n in names]
    return out


def summary_table(setup: Setup) -> pd.DataFrame:
    """Per tenant, :data:`SUMMARY_COLUMNS` (the module docstring says how seeds combine).

    Parameters
    ----------
    setup : Setup
        The setup.

    Returns
    -------
    pandas.DataFrame
        Index ``tenant``; columns ``ok``, ``failed``, ``refused`` (sums over seeds),
        ``ttft_p50_ms``, ``ttft_p99_ms``, ``tpot_p50_ms``, ``tpot_p99_ms``, ``e2e_p50_ms``,
        ``e2e_p99_ms``, ``goodput_rps``, ``slo_attainment_pct`` and ``share_pct`` (residency
        share; means over seeds).
    """
    counts = sum((_outcomes(a) for a in setup.analyses), start=0)
    t = setup.table
    out = pd.DataFrame(index=t.index)
    for c in ("ok", "failed", "refused"):
        out[c] = counts[c].reindex(t.index).astype(int)
    for c in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms", "goodput_rps",
              "slo_attainment_pct"):
        out[c] = t[c]
    out["share_pct"] = t["residency_share_pct"]
    return out


def _cell(col: str, v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if col in ("ok", "failed", "refused"):
        return str(int(v))
    return f"{float(v):.{_DIGITS.get(col, 1)}f}"


def format_summary(df: pd.DataFrame) -> pd.DataFrame:
    """``summary_table`` as text cells under the headings of :data:`SUMMARY_COLUMNS` (what the console
    and the report print: the same strings)."""
    out = pd.DataFrame({SUMMARY_COLUMNS[c]: [_cell(c, v) for v in df[c]] for c in SUMMARY_COLUMNS if c in df},
                       index=df.index)
    out.index.name = "tenant"
    return out


def _rows(setup: Setup) -> dict:
    """The numbers that answer the setup's question, by row name."""
    t, f = setup.table, setup.fairness
    rows: dict = {}
    v = setup.spec.get("victim")        # the scenario's, so that every setup of it has the same rows
    tenants = [v] if v in t.index else list(t.index)
    for n in tenants:
        rows[f"{n}: TTFT p99 (ms)"] = t.loc[n, "ttft_p99_ms"]
        rows[f"{n}: TTFT p50 (ms)"] = t.loc[n, "ttft_p50_ms"]
        rows[f"{n}: SLO attainment (%)"] = t.loc[n, "slo_attainment_pct"]
        rows[f"{n}: goodput (req/s)"] = t.loc[n, "goodput_rps"]
    if setup.victim is not None:
        rows[f"{v}: TTFT p99 / alone"] = setup.victim.loc["ttft_p99_ms", "ratio"]
    for n in t.index:
        rows[f"{n}: residency share (%)"] = t.loc[n, "residency_share_pct"]
    for n in t.index:
        rows[f"{n}: token share (%)"] = t.loc[n, "token_share_pct"]
    for c in ("jain_residency_demand", "jain_tokens_demand", "jain_residency", "max_min_residency",
              "windowed_jain_residency_min", "windowed_jain_tokens_min"):
        rows[c] = f.get(c, math.nan)
    sm = summary_table(setup)
    rows["failed requests"] = float(sm["failed"].sum())
    rows["refused requests"] = float(sm["refused"].sum())
    rows["seeds"] = float(len(setup.analyses))
    return rows


def comparison_table(setups: Sequence[Setup]) -> pd.DataFrame:
    """One column per setup (its label), one row per number that answers the question; the setups
    should share a scenario (a row missing in one is NaN).

    Parameters
    ----------
    setups : sequence of Setup
        Setups of one scenario, with distinct labels.

    Returns
    -------
    pandas.DataFrame
        Index ``metric`` (``<victim>: TTFT p99 (ms)``, shares, Jain, failed requests, ``seeds``,
        ...), one column per label.

    Raises
    ------
    ValueError
        Two setups share a label.
    """
    cols = {s.label: _rows(s) for s in setups}
    if len(cols) != len(setups):
        raise ValueError(f"comparison_table: two setups share a label ({[s.label for s in setups]})")
    order = list(dict.fromkeys(k for r in cols.values() for k in r))
    out = pd.DataFrame({lab: [r.get(k, math.nan) for k in order] for lab, r in cols.items()},
                       index=pd.Index(order, name="metric"))
    return out


def compare(a: Setup, b: Setup) -> pd.DataFrame:
    """Two setups' comparison rows with ``delta = b - a`` and ``ratio = b / a``.

    Parameters
    ----------
    a : Setup
        Setup A.
    b : Setup
        Setup B (with A's label too: the columns are named ``<label> (A)`` and ``<label> (B)``).

    Returns
    -------
    pandas.DataFrame
        Index ``metric``; A's and B's columns, ``delta`` and ``ratio`` (NaN where A is 0 or NaN).
    """
    t = comparison_table([a, b]) if a.label != b.label else pd.concat(
        {f"{a.label} (A)": pd.Series(_rows(a)), f"{b.label} (B)": pd.Series(_rows(b))}, axis=1)
    x, y = t.iloc[:, 0].astype(float), t.iloc[:, 1].astype(float)
    t["delta"] = y - x
    with np.errstate(divide="ignore", invalid="ignore"):
        t["ratio"] = np.where((x != 0) & ~np.isnan(x), y / x, np.nan)
    t.index.name = "metric"
    return t
