"""Helpers for the methods page (book/methods.ipynb): the derivations of the seed-000 scenario's
reconstructed parameters, the output-length distributions in closed form, and a small
unequal-demand example.

Everything displayed from here is either an integer count, a closed-form value computed with
scalar ``math`` calls, or a mean the page rounds before showing it (see the book's rule on
portable results).
"""
from __future__ import annotations

import math
from fractions import Fraction
from statistics import NormalDist
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from fairlib.analysis.indices import demand_normalised_jain, jain_index, water_fill
from fairlib.chapters import published
from fairlib.chapters.presets import SEED000_OUTPUT_DISTS, SEED000_OUTPUT_MEANS, SEED000_TENANTS, seed000
from fairlib.sim.engine import SEED000_ENGINE, Engine

__all__ = ["rate_pairs", "rate_check", "exact_ratios", "engine_at_prefill", "seed000_at_prefill",
           "crossing", "means_from_shares", "share_model", "length_quantile", "length_ccdf",
           "length_table", "ccdf_table", "request_cost_by_tenant", "demand_example",
           "demand_table", "within_published", "params_text"]


# --- the cost model ------------------------------------------------------------------------
def rate_pairs(batches: Sequence[int], rates: Sequence[float]) -> pd.DataFrame:
    """``R(B) = a / B + b`` with ``a = iter_base / prefill`` and ``b = iter_slope / prefill``:
    each pair of published exchange rates gives one solution (a, b). One row per pair."""
    rows = []
    for i in range(len(batches)):
        for j in range(i + 1, len(batches)):
            bi, bj, ri, rj = batches[i], batches[j], rates[i], rates[j]
            a = (ri - rj) / (1.0 / bi - 1.0 / bj)
            rows.append({"from B": f"{bi} and {bj}", "iter_base / prefill": a,
                         "iter_slope / prefill": rj - a / bj})
    return pd.DataFrame(rows).set_index("from B")


def rate_check(engine: Engine, batches: Sequence[int], rates: Sequence[float]) -> pd.DataFrame:
    """The engine's exchange rate at each published batch next to the published (2-decimal)
    value; ``within rounding``: the difference is at most half a unit of the last digit."""
    model = [float(engine.exchange_rate(b)) for b in batches]
    out = pd.DataFrame({"B": list(batches), "published": list(rates), "model": model})
    out["difference"] = out["model"] - out["published"]
    out["within rounding"] = out["difference"].abs() <= 0.005 + 1e-12
    return out.set_index("B")


def exact_ratios(engine: Engine = SEED000_ENGINE) -> tuple:
    """``iter_base / prefill`` and ``iter_slope / prefill`` as exact fractions of the engine's
    decimal parameters (9 / 0.06 = 150, 0.55 / 0.06 = 55/6 for the seed-000 replica)."""
    p = Fraction(repr(engine.prefill_ms_per_token))
    return Fraction(repr(engine.iter_base_ms)) / p, Fraction(repr(engine.iter_slope_ms)) / p


def engine_at_prefill(prefill: float, base_ratio=150, slope_ratio=Fraction(55, 6),
                      max_batch: int = 24) -> Engine:
    """The engine with ``prefill_ms_per_token = prefill`` and the two ratios the published
    exchange rates fix: ``iter_base = base_ratio * prefill``, ``iter_slope = slope_ratio *
    prefill`` (the exchange rates are the same at every ``prefill``)."""
    return Engine(float(base_ratio) * prefill, float(slope_ratio) * prefill, prefill, max_batch)


def seed000_at_prefill(prefill: float = 0.06, duration_s: float = 120.0, **kw):
    """The seed-000 scenario on :func:`engine_at_prefill` (``prefill`` 0.06 is the book's
    replica); every tenant still offers 750 ms of machine per second."""
    return seed000(engine=engine_at_prefill(prefill), duration_s=duration_s, **kw)


def crossing(x: Sequence[float], y: Sequence[float], target: float) -> float:
    """The ``x`` at which the piecewise-linear curve through ``(x, y)`` takes the value
    ``target`` (the first segment that brackets it; ``x`` increasing, ``y`` monotone), or NaN."""
    x = [float(v) for v in x]
    y = [float(v) for v in y]
    for i in range(len(x) - 1):
        lo, hi = sorted((y[i], y[i + 1]))
        if lo <= target <= hi and y[i + 1] != y[i]:
            return x[i] + (x[i + 1] - x[i]) * (target - y[i]) / (y[i + 1] - y[i])
    return math.nan


# --- output means from the published shares ----------------------------------------------
def means_from_shares(shares: Sequence[float], known: dict, policy: str,
                      engine: Engine = SEED000_ENGINE, prompt: int = 387, wp: float = 1.0,
                      wq: float = 2.0, batch: Optional[int] = None) -> dict:
    """Solve the mean outputs of the tenants not in ``known`` (index -> mean) from a published
    share table, relative to each known tenant in turn, with the steady-state model of a
    backlogged replica at batch ``B`` (default ``max_batch``): a request of ``m`` output tokens
    costs ``c(m) = prefill * prompt + m * per_seq(B)`` of machine.

    - ``policy="vtc"``: VTC equalises its counters ``N_i (wp * prompt + wq * m_i)``, so
      ``share_i`` is proportional to ``c(m_i) / (wp * prompt + wq * m_i)``;
    - ``policy="quota"``: an equal request quota admits the same number of requests from each
      tenant, so ``share_i`` is proportional to ``c(m_i)``.

    Returns ``{reference index: {tenant index: mean}}``."""
    pre = engine.prefill_ms_per_token * prompt
    c = float(engine.per_seq_ms(engine.max_batch if batch is None else batch))
    out = {}
    for ref, m_ref in known.items():
        sol = {}
        for i, s in enumerate(shares):
            if i in known:
                continue
            if policy == "vtc":
                t = s / shares[ref] * (pre + c * m_ref) / (wp * prompt + wq * m_ref)
                sol[i] = (t * wp * prompt - pre) / (c - wq * t)
            elif policy == "quota":
                t = s / shares[ref] * (pre + c * m_ref)
                sol[i] = (t - pre) / c
            else:
                raise ValueError(f"means_from_shares: policy must be 'vtc' or 'quota', "
                                 f"got {policy!r}")
        out[ref] = sol
    return out


def share_model(means: Sequence[float], policy: str, engine: Engine = SEED000_ENGINE,
                prompt: int = 387, wp: float = 1.0, wq: float = 2.0) -> np.ndarray:
    """The shares (fractions) the steady-state model of :func:`means_from_shares` predicts."""
    pre = engine.prefill_ms_per_token * prompt
    c = float(engine.per_seq_ms(engine.max_batch))
    if policy == "vtc":
        w = [(pre + c * m) / (wp * prompt + wq * m) for m in means]
    elif policy == "quota":
        w = [pre + c * m for m in means]
    else:
        raise ValueError(f"share_model: policy must be 'vtc' or 'quota', got {policy!r}")
    total = math.fsum(w)
    return np.array([v / total for v in w])


# --- output-length distributions in closed form -------------------------------------------
def _lognormal_mu(mean: float, sigma: float) -> float:
    return math.log(mean) - 0.5 * sigma * sigma


def length_quantile(dist: str, mean: float, q: float, sigma: float = 1.0) -> int:
    """The ``q`` quantile (smallest ``k`` with ``P(L <= k) >= q``) of the seed-000 output
    length ``L`` with nominal mean ``mean``: ``"geometric"`` (``p = 1/mean`` on 1, 2, ...),
    ``"lognormal"`` (``round(exp(N(mu, sigma)))`` clipped to >= 1, ``mu = ln mean -
    sigma^2 / 2``) or ``"constant"`` (``round(mean)``)."""
    if dist == "geometric":
        p = 1.0 / mean
        if p >= 1.0:
            return 1
        return max(1, math.ceil(math.log1p(-q) / math.log1p(-p) - 1e-12))
    if dist == "lognormal":
        x = math.exp(_lognormal_mu(mean, sigma) + sigma * NormalDist().inv_cdf(q))
        return max(1, math.ceil(x - 0.5))
    if dist == "constant":
        return max(1, int(math.floor(mean + 0.5)))
    raise ValueError(f"length_quantile: dist must be one of {SEED000_OUTPUT_DISTS}, got {dist!r}")


def length_ccdf(dist: str, mean: float, k: int, sigma: float = 1.0) -> float:
    """``P(L > k)`` for an integer ``k >= 0`` (the distributions of :func:`length_quantile`)."""
    if dist == "geometric":
        return (1.0 - 1.0 / mean) ** k
    if dist == "lognormal":
        if k < 1:
            return 1.0          # lengths are clipped to >= 1 token
        z = (math.log(k + 0.5) - _lognormal_mu(mean, sigma)) / sigma
        return 0.5 * math.erfc(z / math.sqrt(2.0))
    if dist == "constant":
        return 1.0 if k < max(1, int(math.floor(mean + 0.5))) else 0.0
    raise ValueError(f"length_ccdf: dist must be one of {SEED000_OUTPUT_DISTS}, got {dist!r}")


def length_table(seeds: Sequence[int] = range(8), qs=(0.5, 0.9, 0.99),
                 duration_s: float = 120.0) -> pd.DataFrame:
    """Per output distribution and tenant: the nominal mean, the mean of the output lengths in
    the 120-s request tables of ``seeds`` (all requests, pooled), and the closed-form
    quantiles ``qs``."""
    rows = []
    for dist in SEED000_OUTPUT_DISTS:
        sc = seed000(output_dist=dist, duration_s=duration_s)
        tables = [sc.requests(s) for s in seeds]
        for i, (name, t) in enumerate(zip(sc.tenant_names, sc.tenants)):
            lengths = np.concatenate([r.loc[r["tenant"] == i, "output_tokens"].to_numpy()
                                      for r in tables])
            row = {"distribution": dist, "tenant": name, "nominal mean": t.output.mean,
                   "mean in the request tables": math.fsum(int(v) for v in lengths) / lengths.size,
                   "requests": int(lengths.size)}
            for q in qs:
                row[f"p{q * 100:g}"] = length_quantile(dist, SEED000_OUTPUT_MEANS[i], q)
            rows.append(row)
    return pd.DataFrame(rows).set_index(["distribution", "tenant"])


def ccdf_table(max_tokens: int = 3000, points_per_decade: int = 40) -> pd.DataFrame:
    """``P(L > k)`` for each distribution and tenant on integer ``k`` spaced about evenly on a
    log axis from 1 to ``max_tokens``, rounded to 6 digits (a chart's data)."""
    n = int(math.ceil(math.log10(max_tokens) * points_per_decade))
    ks = sorted({int(round(10 ** (i / points_per_decade))) for i in range(n + 1)})
    rows = []
    for dist in SEED000_OUTPUT_DISTS:
        for name, mean in zip(SEED000_TENANTS, SEED000_OUTPUT_MEANS):
            for k in ks:
                rows.append({"distribution": dist, "tenant": name, "tokens": k,
                             "P(L > tokens)": round(length_ccdf(dist, mean, k), 6)})
    return pd.DataFrame(rows)


# --- demand and water-filling -------------------------------------------------------------
def request_cost_by_tenant(scenario, seed: int, batch: Optional[int] = None) -> np.ndarray:
    """Each tenant's demand in machine ms: the cost at batch ``B`` (default ``max_batch``) of
    every request in the scenario's request table for ``seed``, summed per tenant in a fixed
    order (``math.fsum``)."""
    req = scenario.requests(seed)
    cost = scenario.engine.request_cost_ms(req["prompt_tokens"].to_numpy(),
                                           req["output_tokens"].to_numpy(), batch)
    ten = req["tenant"].to_numpy()
    return np.array([math.fsum(float(v) for v in cost[ten == i])
                     for i in range(len(scenario.tenants))])


def demand_example(runs: pd.DataFrame, scenario_for_seed, names: Sequence[str]) -> pd.DataFrame:
    """Per run of a sweep (columns ``seed``, ``policy``, ``busy_ms``, ``share_<name>``): each
    tenant's service (machine ms), demand (:func:`request_cost_by_tenant`), the max-min fair
    allocation of the service among the demands (:func:`fairlib.analysis.indices.water_fill`), raw Jain
    of the service and demand-normalised Jain. One row per run and tenant."""
    rows = []
    demand = {}
    for _, r in runs.iterrows():
        seed = int(r["seed"])
        if seed not in demand:
            demand[seed] = request_cost_by_tenant(scenario_for_seed(seed), seed)
        d = demand[seed]
        service = np.array([r[f"share_{n}"] * r["busy_ms"] for n in names])
        fair = water_fill(d, math.fsum(float(v) for v in service))
        raw, norm = jain_index(service), demand_normalised_jain(service, d)
        for i, n in enumerate(names):
            rows.append({"policy": r["policy"], "seed": seed, "tenant": n,
                         "demand_ms": d[i], "service_ms": service[i], "fair_ms": fair[i],
                         "jain_raw": raw, "jain_demand": norm})
    return pd.DataFrame(rows)


def demand_table(per_tenant: pd.DataFrame, names: Sequence[str],
                 labels: Optional[dict] = None) -> pd.DataFrame:
    """The unequal-demand example (:func:`demand_example`) as one table. One row per policy (in
    run order, renamed by ``labels``): each tenant's mean share of the service delivered (%) and
    the mean raw and demand-normalised Jain over the runs. A last row ``water-filling``: the
    max-min fair shares (mean over the policies of each policy's mean) and both indices computed
    on those fair allocations run by run (demand-normalised Jain is 1 there by construction)."""
    names = list(names)
    d = per_tenant.copy()
    total = d.groupby(["policy", "seed"])["service_ms"].transform("sum")
    d["share"] = d["service_ms"] / total * 100
    d["fair share"] = d["fair_ms"] / total * 100
    order = list(dict.fromkeys(d["policy"]))
    by = d.groupby(["policy", "tenant"], sort=False)
    share = by["share"].mean().unstack("tenant").loc[order, names]
    jains = d.groupby("policy", sort=False)[["jain_raw", "jain_demand"]].mean().loc[order]
    out = pd.concat([share, jains], axis=1)
    out.columns = names + ["Jain (raw)", "Jain (demand-normalised)"]
    if labels:
        out.index = [labels.get(p, p) for p in out.index]
    fair = by["fair share"].mean().unstack("tenant").loc[order, names].mean()
    runs = [g.set_index("tenant").loc[names] for _, g in d.groupby(["policy", "seed"], sort=False)]
    raw = [jain_index(g["fair_ms"].to_numpy()) for g in runs]
    norm = [demand_normalised_jain(g["fair_ms"].to_numpy(), g["demand_ms"].to_numpy())
            for g in runs]
    out.loc["water-filling"] = [float(v) for v in fair] + [math.fsum(raw) / len(raw),
                                                           math.fsum(norm) / len(norm)]
    return out


# --- display ------------------------------------------------------------------------------
def within_published(table: pd.DataFrame, share_id: str, maxmin_id: str,
                     names: Sequence[str]) -> pd.Series:
    """For each row of a share table (columns ``names`` in %, and ``max/min``): how many of the
    published figures ``share_id`` (one share per tenant) and ``maxmin_id`` it reproduces within
    their tolerance (:func:`fairlib.chapters.published.compare`; figures without a tolerance are not
    counted)."""
    names = list(names)
    counts = []
    for _, row in table.iterrows():
        cmp = pd.concat([
            published.compare(share_id, row[names].to_numpy(float), labels=names),
            published.compare(maxmin_id, float(row["max/min"]), labels=["max/min"])])
        counts.append(int(published.asserted(cmp)["within"].sum()))
    return pd.Series(counts, index=table.index, dtype=int)


def params_text(params: dict) -> str:
    """A policy's parameters for a table: ``wp = 1, wq = 15.4167`` (6 significant digits),
    or an em dash when there are none."""
    if not params:
        return "\u2014"
    return ", ".join(f"{k} = {v:g}" if isinstance(v, float) else f"{k} = {v}"
                     for k, v in params.items())
