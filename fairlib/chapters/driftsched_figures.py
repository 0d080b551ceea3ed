"""Chapter 5: the paper's five figures from a protocol's runs, the decode step fitted to its
Priority seconds, and where the figures hold as the protocol changes.

The paper's figures (``data/published_figures.toml``, ``ch5.*``) are for its whitespace variant
(counted in words) on its static-batch worker. :func:`paper_figures` computes them from one seed's
requests: the MAE and RMSE cut of the adaptive estimate against the static one (mean over the
five schedulers, as the paper averages over them), SJF's cut of the median and the 99th percentile
of end-to-end latency against FIFO, and Priority's mean latency for Premium and Batch.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from fairlib.chapters.driftsched import POLICIES, error_table, l4_engines, run_protocol
from fairlib.sim.engine import Engine

__all__ = ["FIGURES", "paper_figures", "figures_table", "fit_step_factor", "sjf_p99_grid"]

#: the computed figures, in the order of the published ones
FIGURES = ("MAE cut (%)", "RMSE cut (%)", "SJF p50 cut (%)", "SJF p99 cut (%)", "Premium (s)", "Batch (s)")


def _run(requests: pd.DataFrame, engine: Engine, label: str, counting: str = "words") -> pd.DataFrame:
    """``run_protocol`` under the paper's scheduler ``label`` (a key of POLICIES)."""
    policy, params = POLICIES[label]
    return run_protocol(requests, engine, policy, dict(params), counting=counting)


def _cut(a: float, b: float) -> float:
    """How much lower ``a`` is than ``b``, in % of ``b``: ``100 (1 - a / b)``."""
    return 100.0 * (1.0 - a / b)


def paper_figures(requests: pd.DataFrame, engine: Engine, policies: Sequence[str] = tuple(POLICIES),
                  counting: str = "words") -> dict:
    """What one seed's ``requests`` give on ``engine``, counted as ``counting``: the MAE and RMSE
    cuts (the mean over ``policies``, each run once), FIFO's and SJF's E2E p50 and p99 (s) and
    Priority's mean E2E for Premium and Batch (s); ``policies`` must hold FIFO, SJF and Priority."""
    need = {"FIFO", "SJF", "Priority"} - set(policies)
    if need:
        raise ValueError(f"policies must include FIFO, SJF and Priority (missing {sorted(need)})")
    runs = {p: _run(requests, engine, p, counting) for p in policies}
    errs = [error_table(o.assign(counting=counting, engine="e", policy=p, seed=0)).iloc[0]
            for p, o in runs.items()]
    fifo, sjf, prio = runs["FIFO"]["e2e_s"], runs["SJF"]["e2e_s"], runs["Priority"]
    return {"MAE cut (%)": float(np.mean([e["MAE cut (%)"] for e in errs])),
            "RMSE cut (%)": float(np.mean([e["RMSE cut (%)"] for e in errs])),
            "FIFO p50 (s)": float(fifo.quantile(0.5)), "FIFO p99 (s)": float(fifo.quantile(0.99)),
            "SJF p50 (s)": float(sjf.quantile(0.5)), "SJF p99 (s)": float(sjf.quantile(0.99)),
            "Premium (s)": float(prio.loc[prio["tier"] == 0, "e2e_s"].mean()),
            "Batch (s)": float(prio.loc[prio["tier"] == 2, "e2e_s"].mean())}


def _with_cuts(t: pd.DataFrame) -> pd.DataFrame:
    """SJF's cuts of p50 and p99 against FIFO (%) from the latencies of ``t``'s rows."""
    return t.assign(**{"SJF p50 cut (%)": _cut(t["SJF p50 (s)"], t["FIFO p50 (s)"]),
                       "SJF p99 cut (%)": _cut(t["SJF p99 (s)"], t["FIFO p99 (s)"])})


def figures_table(rows: Mapping[str, tuple], seeds: Sequence[int], make: Callable[[str, int], pd.DataFrame],
                  policies: Sequence[str] = tuple(POLICIES)) -> pd.DataFrame:
    """One row per setup: :data:`FIGURES` over ``seeds``, as the chapter aggregates them (the
    latencies' mean over the seeds, SJF's cuts from those means, the error cuts' mean) and each
    figure's sd over the seeds (``<figure> sd``, from the per-seed values). ``rows`` maps a setup's
    label to ``(protocol key, engine)``; ``make(key, seed)`` gives that protocol's requests."""
    out = {}
    for label, (key, engine) in rows.items():
        per = _with_cuts(pd.DataFrame([paper_figures(make(key, s), engine, policies) for s in seeds]))
        row = _with_cuts(per.mean().to_frame().T).iloc[0]
        for f in FIGURES:
            row[f + " sd"] = per[f].std() if len(per) > 1 else math.nan
        out[label] = row
    return pd.DataFrame(out).T


def fit_step_factor(requests: Sequence[pd.DataFrame], published: Sequence[float],
                    grid: Sequence[float] = tuple(np.round(np.arange(1.0, 1.61, 0.05), 2))) -> tuple:
    """``(factor, table)``: the decode-step factor of :func:`l4_engines` on the grid whose static
    worker gives Priority's Premium and Batch mean latencies (the mean over ``requests``, one frame
    per seed, counted in words) closest to ``published`` (Premium, Batch) in squared log error,
    ``sum_k log(computed_k / published_k)^2``; ``table``: per factor the two latencies and the error."""
    pub = np.asarray(published, float)
    if pub.shape != (2,) or not (pub > 0).all():
        raise ValueError(f"published must be Priority's (Premium, Batch) seconds > 0, got {published!r}")
    rows = []
    for f in grid:
        eng = l4_engines(float(f))["static"]
        lat = []
        for r in requests:
            o = _run(r, eng, "Priority")
            lat.append([o.loc[o["tier"] == 0, "e2e_s"].mean(), o.loc[o["tier"] == 2, "e2e_s"].mean()])
        m = np.mean(lat, axis=0)
        rows.append({"step factor": float(f), "Premium (s)": m[0], "Batch (s)": m[1],
                     "squared log error": float((np.log(m / pub) ** 2).sum())})
    table = pd.DataFrame(rows).set_index("step factor")
    return float(table["squared log error"].idxmin()), table


def sjf_p99_grid(make: Callable[[str, float], pd.DataFrame], prompts: Sequence[str], shares: Sequence[float],
                 engine: Engine, counting: str = "words") -> pd.DataFrame:
    """SJF's cut of the 99th percentile against FIFO (%) per prompt kind (rows) and share of answers
    at the cap (columns); ``make(prompts, share)`` gives the requests."""
    out = pd.DataFrame(index=pd.Index(list(prompts), name="prompts"),
                       columns=pd.Index([float(s) for s in shares], name="answers at the cap"), dtype=float)
    for p in prompts:
        for s in shares:
            r = make(p, s)
            fifo = _run(r, engine, "FIFO", counting)["e2e_s"]
            sjf = _run(r, engine, "SJF", counting)["e2e_s"]
            out.loc[p, float(s)] = _cut(sjf.quantile(0.99), fifo.quantile(0.99))
    return out

