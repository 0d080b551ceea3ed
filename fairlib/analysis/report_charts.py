"""The report's charts (altair, imported when drawn), each at least :data:`WIDTH` px wide and
saved as SVG with a PNG beside it (vl-convert):

- ``latency_over_time``: each tenant's rolling p99 TTFT over the run (a window of ``window_s``
  every ``step_s``, by send time): where a bursting neighbour shows;
- ``victim_chart``: the victim's TTFT/E2E percentiles with its neighbour and alone;
- ``goodput_chart``: SLO goodput and attainment per tenant, one bar per setup;
- ``engine_chart``: the engine's waiting queue and running batch over time, from
  ``server_metrics.jsonl`` (vLLM's ``num_requests_waiting``/``running``, llama.cpp's
  ``requests_deferred``/``processing``) or, for a simulated run, from its records (the engine
  model's admission and last token);
- ``comparison_chart``: the comparison table's rows, one panel per row, one bar per setup.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from fairlib.analysis.common import completed, numeric
from fairlib.records import Run, load_server_metrics

__all__ = ["WIDTH", "rolling_p99", "latency_over_time", "victim_chart", "goodput_chart", "engine_state",
           "engine_chart", "comparison_chart", "save_chart"]

WIDTH = 720
_SERIES = {"waiting": ("vllm:num_requests_waiting", "llamacpp:requests_deferred"),
           "running": ("vllm:num_requests_running", "llamacpp:requests_processing")}


def rolling_p99(run: Run, metric: str = "ttft", window_s: float = 10.0, step_s: Optional[float] = None,
                q: float = 99.0) -> pd.DataFrame:
    """Per tenant and step end ``t``: the ``q``-th percentile (ms) of ``metric`` over the completed
    requests sent in ``(t - window_s, t]``; ``n`` of them (rows with none are left out)."""
    step_s = step_s or max(window_s / 5.0, 0.5)
    rec = run.records
    ok = completed(rec)
    sent = numeric(rec, "actual_send_s")
    val = numeric(rec, f"{metric}_s") * 1e3
    names = rec["tenant_name"].astype(str).to_numpy()
    end = max(run.duration_s if np.isfinite(run.duration_s) else 0.0, float(np.nanmax(sent)) if len(sent) else 0.0)
    rows = []
    for t in np.arange(step_s, end + step_s, step_s):
        inwin = ok & (sent > t - window_s) & (sent <= t) & ~np.isnan(val)
        for n in run.tenant_names:
            x = val[inwin & (names == n)]
            if x.size:
                rows.append({"t_s": round(float(t), 6), "tenant": n, "p": float(np.percentile(x, q)), "n": int(x.size)})
    return pd.DataFrame(rows, columns=["t_s", "tenant", "p", "n"])


def latency_over_time(runs: Sequence[Run], metric: str = "ttft", window_s: float = 10.0, title: Optional[str] = None):
    """Lines of :func:`rolling_p99` per tenant (one line per seed), log scale."""
    import altair as alt
    parts = [rolling_p99(r, metric, window_s).assign(seed=str(r.seed)) for r in runs]
    d = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["t_s", "tenant", "p", "seed"])
    d["p"] = d["p"].astype(float).round(3)
    names = list(dict.fromkeys(d["tenant"]))
    return alt.Chart(d).mark_line(point=True).encode(
        x=alt.X("t_s:Q", title="send time (s)"),
        y=alt.Y("p:Q", scale=alt.Scale(type="log"), title=f"{metric.upper()} p99 over {window_s:g} s (ms)"),
        color=alt.Color("tenant:N", sort=names), detail="seed:N",
        tooltip=["tenant", "seed", "t_s", "p", "n"],
    ).properties(width=WIDTH, height=260,
                 title=title or f"Rolling p99 {metric.upper()} per tenant ({window_s:g}-s window, by send time)")


def victim_chart(vd: pd.DataFrame, tenant: str, baseline_label: Optional[str] = None):
    """Grouped bars: the victim's TTFT and E2E p50/p99 with its neighbour and alone (ms)."""
    import altair as alt
    keep = [k for k in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms") if k in vd.index]
    d = vd.loc[keep, ["contention", "alone"]].reset_index().melt(id_vars="metric", var_name="run", value_name="ms")
    d["metric"] = d["metric"].str.replace("_ms", "").str.replace("_", " ").str.upper()
    d["run"] = d["run"].map({"contention": "with its neighbour", "alone": "alone (baseline)"})
    d["ms"] = d["ms"].astype(float).round(3)
    return alt.Chart(d).mark_bar().encode(
        x=alt.X("metric:N", title=None, sort=list(dict.fromkeys(d["metric"]))),
        xOffset=alt.XOffset("run:N"), y=alt.Y("ms:Q", title="ms"),
        color=alt.Color("run:N", title=None), tooltip=["metric", "run", "ms"],
    ).properties(width=WIDTH, height=240, title=f"Victim {tenant}: with its neighbour vs alone"
                 + (f" (baseline: {baseline_label})" if baseline_label else ""))


def goodput_chart(tables: dict):
    """Bars of SLO goodput (req/s) and attainment (%) per tenant, one colour per setup.
    ``tables``: label -> per-tenant table (``goodput_rps``, ``slo_attainment_pct``)."""
    import altair as alt
    parts = []
    for label, t in tables.items():
        x = t[["goodput_rps", "slo_attainment_pct"]].reset_index().assign(setup=label)
        parts.append(x)
    d = pd.concat(parts, ignore_index=True).melt(id_vars=["tenant", "setup"], var_name="measure", value_name="value")
    d["measure"] = d["measure"].map({"goodput_rps": "SLO goodput (req/s)", "slo_attainment_pct": "SLO attainment (%)"})
    d["value"] = d["value"].astype(float).round(4)
    names = list(dict.fromkeys(d["tenant"]))
    per = max(160, (WIDTH - 40) // 2)
    return alt.Chart(d).mark_bar().encode(
        x=alt.X("tenant:N", sort=names, title=None), xOffset=alt.XOffset("setup:N"), y=alt.Y("value:Q", title=None),
        color=alt.Color("setup:N", sort=list(tables)), tooltip=["tenant", "setup", "measure", "value"],
    ).properties(width=per, height=220).facet(column=alt.Column("measure:N", title=None)).resolve_scale(
        y="independent").properties(title="SLO goodput and attainment per tenant")


def engine_state(run: Run, step_s: float = 0.5) -> pd.DataFrame:
    """``t_s``, ``series`` (``waiting``/``running``), ``value``, ``source``: the engine's queue and
    batch over time (the module docstring says from where); empty when the run has neither."""
    if run.path is not None:
        try:
            m = load_server_metrics(run.path)
        except FileNotFoundError:
            m = pd.DataFrame()
        if len(m):
            rows = []
            for series, prefixes in _SERIES.items():
                cols = [c for c in m.columns if any(c == p or c.startswith(p + "{") for p in prefixes)]
                if cols:
                    rows.append(pd.DataFrame({"t_s": m["t"].astype(float), "series": series,
                                              "value": m[cols].astype(float).sum(axis=1)}))
            if rows:
                return pd.concat(rows, ignore_index=True).assign(source="server_metrics.jsonl")
    if run.backend != "sim":
        return pd.DataFrame(columns=["t_s", "series", "value", "source"])
    rec = run.records
    send = numeric(rec, "actual_send_s")
    queue = np.array([(st or {}).get("queue_time_ms") if isinstance(st, dict) else None
                      for st in rec["server_timings"]], dtype=float) / 1e3
    adm = send + queue
    last = numeric(rec, "last_token_s")
    end = float(np.nanmax(last)) if np.isfinite(last).any() else 0.0
    t = np.arange(0.0, end + step_s, step_s)
    wait = ((send[None, :] <= t[:, None]) & ~(adm[None, :] <= t[:, None])).sum(axis=1)
    run_ = ((adm[None, :] <= t[:, None]) & (last[None, :] > t[:, None])).sum(axis=1)
    return pd.concat([pd.DataFrame({"t_s": t, "series": "waiting", "value": wait.astype(float)}),
                      pd.DataFrame({"t_s": t, "series": "running", "value": run_.astype(float)})],
                     ignore_index=True).assign(source="the engine model (records)")


def engine_chart(runs: Sequence[Run]):
    """Lines of :func:`engine_state` (waiting queue, running batch), one per seed; ``None`` when no
    run has a series."""
    import altair as alt
    parts = [engine_state(r).assign(seed=str(r.seed)) for r in runs]
    d = pd.concat([p for p in parts if len(p)], ignore_index=True) if any(len(p) for p in parts) else None
    if d is None:
        return None
    d["value"] = d["value"].round(3)
    src = ", ".join(dict.fromkeys(d["source"]))
    return alt.Chart(d).mark_line().encode(
        x=alt.X("t_s:Q", title="run time (s)"), y=alt.Y("value:Q", title="requests"),
        color=alt.Color("series:N", sort=["waiting", "running"], title=None), strokeDash="seed:N",
        tooltip=["series", "seed", "t_s", "value"],
    ).properties(width=WIDTH, height=220, title=f"The engine's waiting queue and running batch ({src})")


def comparison_chart(table: pd.DataFrame, rows: Optional[Sequence[str]] = None):
    """One panel per row of a comparison table, one bar per setup (its column)."""
    import altair as alt
    rows = [r for r in (rows or table.index) if r in table.index and r != "seeds"]
    d = table.loc[rows].reset_index().melt(id_vars="metric", var_name="setup", value_name="value").dropna()
    d["value"] = d["value"].astype(float).round(4)
    n = max(1, min(4, len(rows)))
    return alt.Chart(d).mark_bar().encode(
        x=alt.X("setup:N", title=None, sort=list(table.columns)), y=alt.Y("value:Q", title=None),
        color=alt.Color("setup:N", sort=list(table.columns)), tooltip=["metric", "setup", "value"],
    ).properties(width=max(150, WIDTH // n - 20), height=150).facet(
        facet=alt.Facet("metric:N", sort=rows, title=None), columns=n).resolve_scale(y="independent").properties(
        title="The setups side by side")


def save_chart(chart, stem: Path) -> list:
    """``stem.svg`` and ``stem.png`` (vl-convert, scale 1); returns both paths."""
    stem = Path(stem)
    out = []
    for ext in ("svg", "png"):
        p = stem.with_suffix("." + ext)
        chart.save(str(p))
        out.append(p)
    return out
