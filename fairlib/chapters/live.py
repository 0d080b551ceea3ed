"""Saved live runs beside their simulated twins (chapters 7 and 8).

``saved_live_runs`` finds the committed run directories (``data/runs/<engine>/<scenario>/seed<k>``);
``analyze_pairs`` analyses measured and simulated runs the same way; the ``live_*`` tables and
``live_chart`` put the two side by side, per engine and scenario.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from fairlib.analysis.charts import dot_chart
from fairlib.analysis.common import QS
from fairlib.kinds import REAL_ENGINES
from fairlib.analysis.run import RunAnalysis, analyze_run, tenant_latency, tenant_table, victim_table
from fairlib.paths import data_path
from fairlib.records import Run, load_run
from fairlib.records.rundir import records_path
from fairlib.scenarios import available

__all__ = ["LIVE_ENGINES", "SOURCES", "saved_live_runs", "engine_of", "analyze_pairs",
           "live_table", "live_validity", "live_victims", "live_chart"]



# --- chapter 7: latency percentiles, victims, saved live runs next to the simulator -------------
#: The engines whose live runs the book keeps under ``data/runs/<engine>`` (chapter 7 shows them
#: first, chapter 8 measures their fidelity), in the order the chapters show them.
LIVE_ENGINES = REAL_ENGINES


#: A measured run and its simulation (the same schedule in the engine model).
SOURCES = ("measured", "simulated")


# saved live runs: data/runs/<engine>/<scenario>/seed<k>
def saved_live_runs(engines: Optional[Sequence[str]] = None, root=None) -> list:
    """Every live run saved under ``root/<engine>/<scenario>/seed<k>`` (default ``data/runs``):
    whatever scenarios and seeds are there, by engine (:data:`LIVE_ENGINES` first), scenario
    (the scenario files' order) and seed. ``engines``: which engines (default every folder)."""
    root = Path(root) if root is not None else data_path("runs")
    if engines is None:
        found = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        engines = [k for k in LIVE_ENGINES if k in found] + [k for k in found if k not in LIVE_ENGINES]
    order = list(available())

    def seed_of(p):
        tail = p.name[4:]
        return (0, int(tail)) if tail.isdigit() else (1, tail)
    out = []
    for k in engines:
        d = root / k
        if not d.is_dir():
            raise FileNotFoundError(f"no saved live runs of engine {k!r} under {d}")
        scen = sorted((p for p in d.iterdir() if p.is_dir()),
                      key=lambda p: (order.index(p.name) if p.name in order else len(order), p.name))
        for s in scen:
            for p in sorted(s.glob("seed*"), key=seed_of):
                if records_path(p).exists():
                    out.append(load_run(p))
    return out


def engine_of(run: Run) -> str:
    """The engine a live run measured: its config's ``engine_kind``, else its folder."""
    kind = run.extra.get("engine_kind")
    if kind:
        return str(kind)
    return Path(run.path).parents[1].name if run.path else "?"


def analyze_pairs(pairs, n_boot: int = 500, window_s: float = 10.0) -> dict:
    """``{(engine, scenario): [(measured, simulated) RunAnalysis per seed]}`` of the
    ``(measured, simulated)`` run pairs of ``fairlib.chapters.fidelity.simulate_pairs``."""
    out: dict = {}
    for m, s in pairs:
        out.setdefault((engine_of(m), m.name), []).append(
            (analyze_run(m, n_boot=n_boot, window_s=window_s), analyze_run(s, n_boot=n_boot, window_s=window_s)))
    return out


def _is_cut(a: RunAnalysis) -> bool:
    return a.run.extra.get("cut_after_s") is not None


def _kept(items: list) -> tuple:
    """The pairs a table averages (the valid runs; every run when none is valid) and the label
    that says which: ``"0, 1, 2"``, ``"0, 2 (1 invalid, left out)"``, ``"0 (INVALID)"``."""
    valid = [p for p in items if p[0].validity["valid"]]
    bad = [p for p in items if not p[0].validity["valid"]]
    seeds = lambda ps: ", ".join(str(p[0].seed) for p in ps)       # noqa: E731
    if not bad:
        return items, seeds(items)
    if valid:
        return valid, f"{seeds(valid)} ({seeds(bad)} invalid, left out)"
    return items, f"{seeds(items)} (INVALID)"


def live_table(live: dict, columns: Sequence[str], skip_cut: bool = False) -> pd.DataFrame:
    """Per (engine, scenario, seeds, tenant): each column of ``columns`` (a :func:`tenant_table`
    or :func:`tenant_latency` column) measured and simulated, the mean over the valid runs of
    the group (every run, marked ``INVALID`` in ``seeds``, when none is valid). ``skip_cut``:
    leave out the groups whose live requests were cut at a deadline (their latencies and
    goodput are not the simulator's; listed in ``attrs["skipped"]``)."""
    parts, skipped = [], []
    for (eng, name), items in live.items():
        if skip_cut and _is_cut(items[0][0]):
            skipped.append((eng, name))
            continue
        kept, label = _kept(items)
        sides = []
        for i, src in enumerate(SOURCES):
            tabs = []
            for p in kept:
                t = tenant_table(p[i])
                lat = tenant_latency(p[i])
                tabs.append(t.join(lat[[c for c in lat.columns if c not in t.columns]]))
            names = list(tabs[0].index)
            mean = pd.concat(tabs).groupby(level="tenant", sort=False).mean().reindex(names)[list(columns)]
            mean.columns = pd.MultiIndex.from_product([list(columns), [src]])
            sides.append(mean)
        t = pd.concat(sides, axis=1)[[(c, s) for c in columns for s in SOURCES]]
        t.index = pd.MultiIndex.from_product([[eng], [name], [label], list(t.index)],
                                             names=["engine", "scenario", "seeds", "tenant"])
        parts.append(t)
    out = pd.concat(parts) if parts else pd.DataFrame()
    out.attrs["skipped"] = skipped
    return out


def live_validity(live: dict) -> pd.DataFrame:
    """Per live run (engine, scenario, seed): ``valid`` (its summary's flag), ``verdict`` (``ok``
    or ``INVALID: <reason>``), schedule lag p50/p99 (ms), requests completed of planned, the
    load window (s) and whether the tables average it."""
    rows = []
    for (eng, name), items in live.items():
        kept = {id(p) for p in _kept(items)[0]}
        for p in items:
            v = p[0].validity
            rows.append({"engine": eng, "scenario": name, "seed": p[0].seed, "valid": v["valid"],
                         "verdict": "ok" if v["valid"] else f"INVALID: {v['reason']}",
                         "lag p50 (ms)": v["lag_p50_ms"], "lag p99 (ms)": v["lag_p99_ms"],
                         "completed": f"{v['n_ok']} of {v['n_planned']}",
                         "load window (s)": p[0].run.duration_s,
                         "in the tables": "yes" if id(p) in kept else "no"})
    return pd.DataFrame(rows).set_index(["engine", "scenario", "seed"])


def live_victims(live: dict, qs: Sequence[float] = QS, n_boot: int = 500) -> Optional[pd.DataFrame]:
    """:func:`victim_table` on each engine, measured and simulated: the contention scenario's
    valid runs against its baseline's (every run, marked, when none is valid). Index (engine,
    scenario, seeds, metric); columns (source, contention / alone / ratio)."""
    parts = []
    for (eng, name), items in live.items():
        scen = items[0][0].run.scenario
        victim, base = scen.get("victim"), scen.get("baseline")
        if not victim or (eng, base) not in live:
            continue
        kc, lc = _kept(items)
        kb, lb = _kept(live[(eng, base)])
        sides = [victim_table([p[i].run for p in kc], [p[i].run for p in kb], victim, qs, n_boot)
                 for i in range(len(SOURCES))]
        t = pd.concat(sides, axis=1, keys=list(SOURCES))
        t.index = pd.MultiIndex.from_product([[eng], [f"{name} / {base}"], [f"{lc} / {lb}"], list(t.index)],
                                             names=["engine", "scenario", "seeds", "metric"])
        parts.append(t)
    return pd.concat(parts) if parts else None


def live_chart(table: pd.DataFrame, measures: dict, title: str):
    """Measured and simulated per tenant (dots; rows ``scenario: tenant``, ``(INVALID)`` when
    the group has no valid run), one panel per measure and engine. ``table``: :func:`live_table`
    with the columns of ``measures`` (column -> axis title)."""
    d = table.stack(level=1) if int(pd.__version__.split(".")[0]) >= 3 else table.stack(level=1, future_stack=True)
    d.index = d.index.set_names("source", level=-1)
    d = d.reset_index()
    inval = d["seeds"].str.contains("INVALID")
    d["row"] = d["scenario"] + ": " + d["tenant"] + np.where(inval, " (INVALID)", "")
    scale = _source_scale()
    return dot_chart(d, measures, "source", scale, "engine", title, hollow="simulated")


def _source_scale():
    import altair as alt
    return alt.Scale(domain=list(SOURCES), range=["#1a1a1a", "#a0a0a0"])
