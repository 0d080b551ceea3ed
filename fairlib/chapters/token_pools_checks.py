"""What chapter 6's claims rest on, measured: the engine's waiting queue under the flood, the
debt's effect apart from the horizon admission, and the live debt's decay read from its rule.

    queue_stats(run["requests"], duration_ms)    # the waiting line over time (experiment 1)
    horizon_runs(seeds)                          # experiment 2 with and without debt and horizon
    debt_decay(series, tenant, half_life_s, end_s)   # why a debt is still > 0 at a run's end

The queue is what waits for a slot: a request accepted and not yet in the running batch,
``arrival_ms <= t < admitted_ms``; a refused request never waits. Its length over ``[0, D]``:

    mean  = sum_r |[a_r, s_r) ∩ [0, D]| / D          (time-weighted)
    empty = |{t in [0, D]: no request waits}| / D
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pandas as pd

from fairlib.chapters import token_pools as tp

__all__ = ["queue_stats", "queue_table", "HORIZON_VARIANTS", "horizon_runs", "horizon_table",
           "debt_decay"]


def queue_stats(requests: pd.DataFrame, duration_ms: float) -> dict:
    """The waiting line of one run over ``[0, duration_ms]`` (the module's formulas): its
    time-weighted mean length, its largest, the share of the time it is empty (%), and the
    99th percentile of the time an accepted request waited (s)."""
    if not (isinstance(duration_ms, (int, float)) and math.isfinite(duration_ms) and duration_ms > 0):
        raise ValueError(f"duration_ms must be a finite number > 0, got {duration_ms!r}")
    for col in ("arrival_ms", "admitted_ms", "rejected"):
        if col not in requests:
            raise ValueError(f"requests has no column {col!r} (a simulate() requests table)")
    ok = ~requests["rejected"].to_numpy(bool)
    a = requests["arrival_ms"].to_numpy(float)[ok]
    s = requests["admitted_ms"].to_numpy(float)[ok]
    s = np.where(np.isnan(s), np.inf, s)                   # never dispatched: waits to the end
    lo, hi = np.clip(a, 0, duration_ms), np.clip(s, 0, duration_ms)
    mean = float(np.maximum(0.0, hi - lo).sum() / duration_ms)
    t = np.concatenate([lo, hi])
    step = np.concatenate([np.ones(len(lo)), -np.ones(len(hi))])
    order = np.lexsort((step, t))                          # at one instant: leave before join
    t, level = t[order], np.cumsum(step[order])
    spans = np.diff(np.concatenate([t, [duration_ms]]))
    empty = float(spans[level == 0].sum() + (t[0] if len(t) else duration_ms)) / duration_ms
    wait = (s - a)[np.isfinite(s)] / 1e3
    return {"mean queue": mean, "largest queue": float(level.max()) if len(level) else 0.0,
            "time empty (%)": 100.0 * empty,
            "p99 wait (s)": float(np.percentile(wait, 99)) if len(wait) else 0.0}


def queue_table(runs: Sequence[dict], duration_ms: float) -> pd.DataFrame:
    """:func:`queue_stats` per variant of experiment 1 (:func:`token_pools.flood_runs`), the mean
    over the seeds."""
    rows = [{"variant": r["variant"], "seed": r["seed"], **queue_stats(r["requests"], duration_ms)}
            for r in runs]
    return pd.DataFrame(rows).groupby("variant", sort=False).mean(numeric_only=True).drop(columns="seed")


#: experiment 2's pool with and without its debt term, with and without the horizon admission
#: (horizon_ms large enough that nothing is ever refused: every reservation fits)
HORIZON_VARIANTS: dict[str, dict[str, Any]] = {"horizon 5 s, debt 0.25 (the pool)": {"debt_weight": 0.25},
                    "horizon 5 s, no debt": {"debt_weight": 0.0},
                    "no horizon, debt 0.25": {"debt_weight": 0.25, "horizon_ms": 1e12},
                    "no horizon, no debt": {"debt_weight": 0.0, "horizon_ms": 1e12}}


def horizon_runs(seeds: Sequence[int] = tp.SEEDS) -> list:
    """Experiment 2 (:func:`token_pools.loss_run`) under each of :data:`HORIZON_VARIANTS`."""
    out = []
    for label, kw in HORIZON_VARIANTS.items():
        for s in seeds:
            r = tp.loss_run(s, "pool", **kw)
            out.append({**r, "variant": label})
    return out


def horizon_table(runs: Sequence[dict], tenant: str = "batch", tight: str = "coding") -> pd.DataFrame:
    """While one replica serves (mean over seeds): ``tenant``'s service, requests refused and
    median TTFT, and ``tight``'s answers within its SLO, per variant."""
    ph = tp.loss_phase_table(runs).xs("one replica", level="phase")
    out = pd.DataFrame({f"{tenant}: service": ph.xs(tenant, level="tenant")["service"],
                        f"{tenant}: 429 (%)": ph.xs(tenant, level="tenant")["429 (%)"],
                        f"{tenant}: TTFT p50 (s)": ph.xs(tenant, level="tenant")["TTFT p50 (s)"],
                        f"{tight}: within SLO (%)": ph.xs(tight, level="tenant")["within SLO (%)"]})
    out.attrs["per_seed"] = ph.attrs.get("per_seed")
    return out


def debt_decay(series: pd.DataFrame, tenant: str, half_life_s: float, horizon_s: float) -> dict:
    """Why ``tenant``'s debt at the end of a run is what it is, from the debt rule: it decays
    (``d 2^(-dt/h)``) only while the tenant is not in demand (nothing of it waits, nothing refused
    within the horizon). From one run's samples (``t_s``, ``tenant``, ``debt_ms``, ``waiting``,
    ``rejected``): the last instant it was in demand, its debt then, the debt the decay alone
    predicts at the end, and the measured one (s of machine time)."""
    s = series[series["tenant"] == tenant].sort_values("t_s")
    if s.empty:
        raise ValueError(f"no samples of tenant {tenant!r}; tenants: {sorted(series['tenant'].unique())}")
    t = s["t_s"].to_numpy(float)
    refused_at = t[np.flatnonzero(np.diff(s["rejected"].to_numpy(float), prepend=0.0) > 0)]
    waiting = t[s["waiting"].to_numpy(float) > 0]
    last = max(waiting.max() if len(waiting) else -np.inf,
               refused_at.max() + horizon_s if len(refused_at) else -np.inf)
    end = float(t[-1])
    debt = s.set_index("t_s")["debt_ms"] / 1e3
    last = min(last, end)
    d_last = float(debt.loc[:last].iloc[-1]) if np.isfinite(last) else float(debt.iloc[0])
    free = end - last if np.isfinite(last) else end - float(t[0])
    return {"last in demand (s)": last, "debt then (s)": d_last, "end (s)": end,
            "not in demand for (s)": free, "decay predicts (s)": d_last * 2.0 ** (-free / half_life_s),
            "measured at the end (s)": float(debt.iloc[-1])}
