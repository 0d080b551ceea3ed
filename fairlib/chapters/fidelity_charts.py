"""Chapter 8's charts (altair passed in, so the module imports without it): the fit, the errors per
scenario, measured against simulated, and the sensitivity."""
from __future__ import annotations

from typing import Optional, Sequence

import pandas as pd

from fairlib.chapters.fidelity_compare import METRIC_LABELS, METRICS, fit_points, valid_only_rows

# --- chapter 8's tables and charts ----------------------------------------------------------------
#: One colour per engine in chapter 8's charts: none of the policy colours
#: (``fairlib.analysis.charts.POLICY_COLOURS``) nor the measured/simulated greys of chapter 7, so
#: that a colour names one thing across the book. Other categories of chapter 8's charts (the
#: decode context, the scaled parameter) are told apart by shape and dash, not by colour.
ENGINE_COLOURS = {"vllm": "#5e3c99", "llamacpp": "#b8860b"}
#: An engine outside :data:`ENGINE_COLOURS`.
OTHER_ENGINE_COLOUR = "#888888"
#: Dash patterns and point shapes for the categories drawn in one colour.
DASHES = ([1, 0], [6, 3], [2, 2], [8, 3, 2, 3])
SHAPES = ("circle", "square", "triangle-up", "diamond")


def _engine_scale(alt, kinds):
    kinds = list(kinds)
    return alt.Scale(domain=kinds, range=[ENGINE_COLOURS.get(k, OTHER_ENGINE_COLOUR) for k in kinds])


def fit_chart(fits: dict, alt):
    """The fitted lines against the measured iteration times, one panel per engine (in the
    engine's colour); the decode context by point shape and line dash."""
    pts = fit_points(fits)
    order = [f"{c:.0f} tokens" for c in sorted(pts["context"].unique())]
    pts["context"] = pts["context"].map(lambda c: f"{c:.0f} tokens")
    pts[["measured_ms", "fitted_ms"]] = pts[["measured_ms", "fitted_ms"]].round(3)
    kinds = list(dict.fromkeys(pts["engine"]))
    ctx = dict(sort=order, title="decode context")
    base = alt.Chart(pts).encode(
        x=alt.X("B:Q", title="running sequences B"),
        color=alt.Color("engine:N", scale=_engine_scale(alt, kinds), legend=None))
    y = alt.Y("measured_ms:Q", title="iteration (ms)")
    dots = base.mark_point(filled=True, size=45).encode(
        y=y, shape=alt.Shape("context:N", scale=alt.Scale(domain=order, range=list(SHAPES[:len(order)])), **ctx))
    lines = base.mark_line().encode(
        y="fitted_ms:Q", strokeDash=alt.StrokeDash(
            "context:N", scale=alt.Scale(domain=order, range=list(DASHES[:len(order)])), **ctx))
    chart = alt.layer(dots, lines).properties(width=260, height=200)
    return chart.facet(column=alt.Column("engine:N", title=None, sort=kinds)).properties(
        title="One iteration: measured (points) and the fitted line (lines)")


def crosscheck_table(fits: dict) -> pd.DataFrame:
    """The client's figures over each engine's own (per-token time, prefill slope) and the
    prefill's curvature (the quadratic's marginal cost at 256 and 768 prompt tokens)."""
    rows = []
    for k, d in fits.items():
        dec, pre = d["fit"]["decode"], d["fit"]["prefill"]
        hist = dec.get("server_histograms") or {}
        rows.append({"engine": k,
                     "per-token time, client / server (median)": dec["server"]["client_over_server_median"],
                     "server figure": dec["server"]["source"],
                     "prefill slope, client / server": pre["server"]["client_slope_over_server_slope"],
                     "prefill ms/token at P=256 (quadratic)": pre["quadratic"]["slope_at_256"],
                     "prefill ms/token at P=768 (quadratic)": pre["quadratic"]["slope_at_768"],
                     "vLLM /metrics mean ITL at B=16 (ms)":
                         (hist.get("mean_itl_ms_median_over_contexts") or [None])[-1]})
    return pd.DataFrame(rows).set_index("engine").T


def valid_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of :func:`compare_all` that come from valid runs."""
    return valid_only_rows(table, True)


def long_errors(table: pd.DataFrame, metrics: Sequence[str] = METRICS) -> pd.DataFrame:
    """The comparison table long: engine, scenario, seed, tenant, metric (display name), unit,
    measured, predicted, error, valid."""
    parts = []
    for k in metrics:
        part = table[[f"{k}_measured", f"{k}_predicted", f"{k}_err", "valid"]].reset_index()
        part.columns = ["engine", "scenario", "seed", "tenant", "measured", "predicted", "error", "valid"]
        parts.append(part.assign(metric=METRIC_LABELS[k], unit="points" if k == "share_pct" else "%"))
    return pd.concat(parts, ignore_index=True)


def scenario_errors(table: pd.DataFrame, metrics: Sequence[str] = ("e2e_p50_ms", "ttft_p50_ms"),
                    valid_only: bool = True) -> pd.DataFrame:
    """Median |error| over the tenants of each run: engine, scenario, seed, metric, value."""
    d = long_errors(valid_only_rows(table, valid_only), metrics).dropna(subset=["error"])
    d["abs"] = d["error"].abs()
    out = d.groupby(["engine", "scenario", "seed", "metric"], sort=False)["abs"].median()
    return out.rename("median |error|").reset_index()


def scenario_error_chart(table: pd.DataFrame, alt, metrics=("e2e_p50_ms", "ttft_p50_ms"),
                         valid_only: bool = True):
    """Per scenario and engine, the median |error| over tenants of each valid run (one point per
    random seed) and the median over seeds (a tick)."""
    d = scenario_errors(table, metrics, valid_only)
    d["median |error|"] = d["median |error|"].round(2)
    kinds = list(dict.fromkeys(d["engine"]))
    order = list(dict.fromkeys(d["scenario"]))
    enc = dict(y=alt.Y("scenario:N", sort=order, title=None),
               color=alt.Color("engine:N", scale=_engine_scale(alt, kinds), title="engine"),
               yOffset=alt.YOffset("engine:N", sort=kinds))
    pts = alt.Chart(d).mark_circle(size=38, opacity=0.75).encode(
        x=alt.X("median |error|:Q", title="median |error| over tenants (%)"), **enc)
    med = alt.Chart(d).mark_tick(thickness=2, size=12, color="black").encode(
        x="median(median |error|):Q", **enc)
    return alt.layer(pts, med).properties(width=250, height=alt.Step(11)).facet(
        column=alt.Column("metric:N", title=None, sort=[METRIC_LABELS[m] for m in metrics]))


def scatter_chart(table: pd.DataFrame, alt, metrics=("e2e_p50_ms", "ttft_p50_ms", "e2e_p99_ms"),
                  valid_only: bool = True):
    """Simulated against measured per tenant (valid runs), one panel per metric, log axes for
    latencies; the dashed diagonal is equality."""
    d = long_errors(valid_only_rows(table, valid_only), metrics).dropna(subset=["measured", "predicted"])
    d[["measured", "predicted"]] = d[["measured", "predicted"]].astype(float).round(2)
    kinds = list(dict.fromkeys(d["engine"]))
    panels = []
    for m in metrics:
        lab = METRIC_LABELS[m]
        x = d[d["metric"] == lab]
        share = m == "share_pct"
        lo = 0.0 if share else float(x[["measured", "predicted"]].min().min()) * 0.8
        hi = 100.0 if share else float(x[["measured", "predicted"]].max().max()) * 1.25
        sc = alt.Scale(type="linear" if share else "log", domain=[lo, hi], nice=False)
        ax = alt.Axis(tickCount=4, format="~s")
        unit = "(%)" if share else "(ms)" if m.endswith("_ms") else "(tokens/s)"
        pts = alt.Chart(x).mark_point(filled=True, size=30, opacity=0.7).encode(
            x=alt.X("measured:Q", scale=sc, axis=ax, title=f"measured {lab} {unit}"),
            y=alt.Y("predicted:Q", scale=sc, axis=ax, title="simulated"),
            color=alt.Color("engine:N", scale=_engine_scale(alt, kinds), title="engine"),
            shape=alt.Shape("scenario:N"))
        diag = alt.Chart(pd.DataFrame({"measured": [lo, hi]})).mark_line(
            color="gray", strokeDash=[4, 3]).encode(x=alt.X("measured:Q", scale=sc),
                                                     y=alt.Y("measured:Q", scale=sc))
        panels.append(alt.layer(diag, pts).properties(width=170, height=170))
    return alt.hconcat(*panels).properties(title="Simulated against measured, per tenant (dashed: equal)")


def sensitivity_table(sens: pd.DataFrame, engine: Optional[str] = None) -> pd.DataFrame:
    """:func:`sensitivity` as a grid: rows (engine, parameter, factor), columns the metrics
    (median |error|: share in points, the others in %)."""
    d = sens if engine is None else sens[sens["engine"] == engine]
    order = [METRIC_LABELS[m] for m in METRICS]
    t = d.pivot_table(index=["engine", "parameter", "factor"], columns="metric",
                      values="median |error|", sort=False)
    return t[[c for c in order if c in t.columns]]


def sensitivity_chart(sens: pd.DataFrame, alt):
    """Median |error| against the factor applied to each fitted parameter: one panel per metric
    (its own scale) and engine (in the engine's colour), one line per parameter (its own dash
    and point shape); factor 1 is the fit."""
    d = sens.copy()
    d["median |error|"] = d["median |error|"].astype(float).round(2)
    order = [METRIC_LABELS[m] for m in METRICS]
    params = list(dict.fromkeys(d["parameter"]))
    kinds = list(dict.fromkeys(d["engine"]))
    base = alt.Chart(d).encode(
        x=alt.X("factor:Q", title="parameter x factor", scale=alt.Scale(domain=[0.4, 2.1]),
                axis=alt.Axis(values=sorted(set(d["factor"])))),
        y=alt.Y("median |error|:Q", title="median |error|"),
        color=alt.Color("engine:N", scale=_engine_scale(alt, kinds), legend=None))
    key = dict(sort=params, title="scaled parameter")
    line = base.mark_line().encode(strokeDash=alt.StrokeDash(
        "parameter:N", scale=alt.Scale(domain=params, range=list(DASHES[:len(params)])), **key))
    pts = base.mark_point(filled=True, size=30).encode(shape=alt.Shape(
        "parameter:N", scale=alt.Scale(domain=params, range=list(SHAPES[:len(params)])), **key))
    return alt.layer(line, pts).properties(width=118, height=105).facet(
        column=alt.Column("metric:N", sort=order, title=None),
        row=alt.Row("engine:N", title=None, sort=kinds)
    ).resolve_scale(y="independent")
