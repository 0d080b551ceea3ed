"""Charts of the analysis tables (altair, imported when a chart is drawn), and the book's one
colour per policy (``POLICY_COLOURS``, ``policy_scale``) that every chart uses.
"""
from __future__ import annotations

from typing import Optional

import pandas as pd

__all__ = ["POLICY_COLOURS", "POLICY_LABELS", "policy_colour", "policy_scale", "latency_chart", "share_chart",
           "windowed_chart", "goodput_chart", "dot_chart"]



# --- charts --------------------------------------------------------------------------------------
def latency_chart(lat: pd.DataFrame, metric: str = "ttft", title: Optional[str] = None, column: Optional[str] = None):
    """Points (p50, p90, p99) with their bootstrap intervals per tenant, log scale. ``lat``: a long
    latency table, optionally with a ``column`` to facet by (e.g. backend or scenario).

    Parameters
    ----------
    lat : pandas.DataFrame
        A long latency table (:func:`~fairlib.analysis.latency`): ``tenant``, ``metric``, ``q``,
        ``estimate``, ``low``, ``high`` (ms).
    metric : {"ttft", "tpot", "e2e"}, default "ttft"
        The metric drawn.
    title : str, optional
        Default ``"<METRIC> per tenant: p50/p90/p99 with 95% bootstrap intervals"``.
    column : str, optional
        A column of ``lat`` to facet rows by.

    Returns
    -------
    altair.Chart
        The chart (a layered or faceted one); altair is imported here.
    """
    import altair as alt
    d = lat[lat["metric"] == metric].copy()
    d["percentile"] = "p" + d["q"].map(lambda q: f"{q:g}")
    d = d.dropna(subset=["estimate"])
    for c in ("estimate", "low", "high"):
        d[c] = d[c].astype(float).round(3)
    names = list(dict.fromkeys(d["tenant"]))
    base = alt.Chart(d)
    y = alt.Y("tenant:N", sort=names, title=None)
    scale = alt.Scale(type="log")
    pts = base.mark_point(filled=True, size=50).encode(
        x=alt.X("estimate:Q", scale=scale, title=f"{metric.upper()} (ms)"), y=y,
        color=alt.Color("percentile:N", sort=["p50", "p90", "p99"]),
        shape=alt.Shape("percentile:N", sort=["p50", "p90", "p99"], legend=None))
    bars = base.mark_rule().encode(x=alt.X("low:Q", scale=scale), x2="high:Q", y=y,
                                   color=alt.Color("percentile:N", sort=["p50", "p90", "p99"]))
    ch = alt.layer(bars, pts).properties(width=320, height=max(60, 28 * len(names)))
    if column:
        ch = ch.facet(row=alt.Row(f"{column}:N", title=None), data=d)
    return ch.properties(title=title or f"{metric.upper()} per tenant: p50/p90/p99 with 95% bootstrap intervals")



#: One colour per policy, the same in every chart of the book (keys: the policy's registry name
#: or the reference grid's label; values: Tableau-10 colours). Display labels map to the same
#: colour through :data:`POLICY_LABELS`.
POLICY_COLOURS = {
    "fcfs": "#4c78a8", "rpm_quota": "#e45756", "vtc": "#f58518", "vtc_derived": "#b279a2",
    "lcf": "#eeca3b", "residency": "#54a24b", "slot_cap": "#72b7b2", "rr": "#9d755d",
    "vtc_predict": "#ff9da6", "priority": "#79706e", "weighted": "#bab0ac", "sjf": "#d67195",
    "aging": "#8cd17d",
}
#: Display labels of the policies as the chapters name them in tables and legends.
POLICY_LABELS = {
    "fcfs": "FCFS", "rpm_quota": "equal quota", "vtc": "VTC 1/2", "vtc_derived": "VTC derived",
    "lcf": "LCF", "residency": "charge dt/B", "slot_cap": "slot cap", "rr": "round robin",
    "vtc_predict": "VTC predict", "priority": "priority", "weighted": "weighted", "sjf": "SJF",
    "aging": "aging",
}


def policy_colour(name: str) -> str:
    """The book's colour of a policy, by registry name, grid label or display label."""
    if name in POLICY_COLOURS:
        return POLICY_COLOURS[name]
    for key, label in POLICY_LABELS.items():
        if name == label:
            return POLICY_COLOURS[key]
    raise KeyError(f"no colour for policy {name!r}; known: {sorted(POLICY_COLOURS)} "
                   f"or labels {sorted(POLICY_LABELS.values())}")


def policy_scale(domain):
    """An altair colour scale giving each policy in ``domain`` (names or labels, in legend order)
    its book colour: ``alt.Color("policy:N", scale=policy_scale(order), sort=order)``."""
    import altair as alt
    domain = list(domain)
    return alt.Scale(domain=domain, range=[policy_colour(d) for d in domain])


def share_chart(shares: pd.DataFrame, title: str = "Share per tenant (%)", color: str = "measure"):
    """Grouped bars of shares (%) per tenant.

    Parameters
    ----------
    shares : pandas.DataFrame
        Long: ``tenant``, ``pct`` and the ``color`` column (optionally ``scenario``, faceted by).
    title : str, default "Share per tenant (%)"
        The title.
    color : str, default "measure"
        The column whose values are the bars of a group (and their colours).

    Returns
    -------
    altair.Chart
        The chart (a layered or faceted one); altair is imported here.
    """
    import altair as alt
    d = shares.copy()
    d["pct"] = d["pct"].astype(float).round(3)
    names = list(dict.fromkeys(d["tenant"]))
    ch = alt.Chart(d).mark_bar().encode(
        x=alt.X("tenant:N", sort=names, title=None), xOffset=alt.XOffset(f"{color}:N"),
        y=alt.Y("pct:Q", title="%"), color=alt.Color(f"{color}:N"))
    if "scenario" in d.columns:
        ch = ch.properties(width=160, height=160).facet(column=alt.Column("scenario:N", title=None))
        ch = ch.resolve_scale(x="independent")
    else:
        ch = ch.properties(width=220, height=180)
    return ch.properties(title=title)


def windowed_chart(windowed: pd.DataFrame, title: str = "Windowed Jain index"):
    """Jain over time (tokens and residency), one line per ``seed`` and a panel per ``scenario``.

    Parameters
    ----------
    windowed : pandas.DataFrame
        :func:`~fairlib.analysis.windowed_fairness` rows (``t_start_s``, ``jain_tokens``,
        ``jain_residency``), optionally with ``scenario``, ``seed``, ``backend`` columns.
    title : str, default "Windowed Jain index"
        The title.

    Returns
    -------
    altair.Chart
        The chart (a layered or faceted one); altair is imported here.
    """
    import altair as alt
    keep = [c for c in ("scenario", "seed", "backend") if c in windowed.columns]
    d = windowed[["t_start_s", "jain_tokens", "jain_residency"] + keep].melt(
        id_vars=["t_start_s"] + keep, var_name="over", value_name="jain").dropna(subset=["jain"])
    d["jain"] = d["jain"].astype(float).round(4)
    d["over"] = d["over"].map({"jain_tokens": "token-weighted service", "jain_residency": "residency"})
    enc: dict = {"x": alt.X("t_start_s:Q", title="window start (s)"),
           "y": alt.Y("jain:Q", scale=alt.Scale(domain=[0, 1]), title="Jain index"),
           "color": alt.Color("over:N", title=None)}
    if "seed" in d.columns:
        enc["detail"] = "seed:N"
    ch = alt.Chart(d).mark_line(point=True).encode(**enc).properties(width=220, height=150)
    if "scenario" in d.columns:
        ch = ch.facet(column=alt.Column("scenario:N", title=None))
    return ch.properties(title=title)


def goodput_chart(table: pd.DataFrame, color: str = "policy", title: Optional[str] = None,
                  scale=None, facet: Optional[str] = None):
    """SLO goodput (requests/s) and attainment (%) per tenant, one dot per ``color`` value (a
    policy by default, in the book's policy colours), rows ``scenario: tenant``. ``table``: index
    or columns ``scenario``, ``tenant``, ``color`` (and ``facet``), columns ``goodput_rps`` and
    ``slo_attainment_pct`` (:func:`fairlib.chapters.tenantbench.goodput_overview`, :func:`live_table`).

    Parameters
    ----------
    table : pandas.DataFrame
        As above (flat columns).
    color : str, default "policy"
        The column (or index level) whose values are the dots' colours.
    title : str, optional
        Default ``"SLO goodput and attainment per tenant"``.
    scale : altair.Scale, optional
        The colour scale (e.g. :func:`policy_scale`); default altair's.
    facet : str, optional
        A column to draw one panel row per value of.

    Returns
    -------
    altair.Chart
        The chart (a layered or faceted one); altair is imported here.

    Raises
    ------
    ValueError
        ``table`` has MultiIndex columns (flatten them first).
    """
    measures = {"goodput_rps": "goodput (requests/s)", "slo_attainment_pct": "SLO attainment (%)"}
    return dot_chart(table, measures, color, scale, facet,
                      title or "SLO goodput and attainment per tenant")


def dot_chart(table, measures: dict, color: str, scale=None, facet: Optional[str] = None,
               title: str = "", hollow: Optional[str] = None):
    """Dots per ``scenario: tenant`` row, one panel per measure (and per ``facet`` value); the
    ``hollow`` value of ``color`` is drawn as a larger open ring, so that it shows around a dot
    it coincides with."""
    import altair as alt
    d = table.reset_index() if any(n is not None for n in table.index.names) else table.copy()
    if isinstance(d.columns, pd.MultiIndex):
        raise ValueError("dot_chart: flatten the columns first")
    if "row" not in d.columns:
        d["row"] = d["scenario"].astype(str) + ": " + d["tenant"].astype(str)
    scen_rank = {n: i for i, n in enumerate(dict.fromkeys(d["scenario"]))}
    ten_rank = {k: i for i, k in enumerate(dict.fromkeys(zip(d["scenario"], d["tenant"])))}
    d["_rank"] = [(scen_rank[s], ten_rank[(s, t)]) for s, t in zip(d["scenario"], d["tenant"])]
    rows = list(dict.fromkeys(d.sort_values("_rank", kind="mergesort")["row"]))
    keep = ["row", color] + ([facet] if facet else [])
    long = d[keep + list(measures)].melt(id_vars=keep, var_name="measure", value_name="value")
    long["measure"] = long["measure"].map(measures)
    long = long.dropna(subset=["value"])
    long["value"] = long["value"].astype(float).round(3)
    order = list(dict.fromkeys(d[color]))
    if scale is None and color == "policy":
        try:
            scale = policy_scale(order)
        except KeyError:                 # a label the book has no colour for (e.g. "server")
            scale = None
    col = alt.Color(f"{color}:N", sort=order, title=color, **({"scale": scale} if scale is not None else {}))
    enc = {"x": alt.X("value:Q", title=None), "y": alt.Y("row:N", sort=rows, title=None), "color": col}
    base = alt.Chart()
    if hollow is None:
        ch = base.mark_point(filled=True, size=45, opacity=0.85).encode(**enc)
    else:
        ring = alt.datum[color] == hollow
        ch = alt.layer(base.transform_filter(~ring).mark_point(filled=True, size=35, opacity=1).encode(**enc),
                       base.transform_filter(ring).mark_point(filled=False, size=110, strokeWidth=1.6,
                                                              opacity=1).encode(**enc))
    n_rows = max(len(set(g)) for _, g in d.groupby(facet)["row"]) if facet else len(rows)
    ch = ch.properties(width=200, height=max(60, 16 * n_rows))
    kw: dict = {"column": alt.Column("measure:N", sort=list(measures.values()), title=None)}
    if facet:
        kw["row"] = alt.Row(f"{facet}:N", sort=list(dict.fromkeys(d[facet])), title=None)
    return ch.facet(data=long, **kw).resolve_scale(
        x="independent", y="independent" if facet else "shared").properties(title=title)
