"""Runs the chapters repeat: one scenario, several policies, several seeds, one tidy table."""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import pandas as pd

from .metrics import jain_index, max_min_ratio
from .simulate import simulate

__all__ = ["policy_runs", "share_summary"]


def policy_runs(scenario_for_seed: Callable, policies: Mapping[str, tuple], seeds, horizon_ms=None) -> pd.DataFrame:
    """Simulate every (policy, seed); one row per (policy, seed, tenant).

    scenario_for_seed(seed) -> Scenario; policies: label -> (policy name, params dict).
    Columns: policy, seed, tenant, name, share, machine_ms, prefill_ms, decode_ms, decode_tokens,
    requests_admitted, requests_finished, requests_rejected, mean_output (the realised length of
    the admitted requests), max_min, jain, busy_ms, decode_tokens_run, share_sum."""
    rows = []
    for seed in seeds:
        sc = scenario_for_seed(seed)
        req = sc.requests(seed)
        h = sc.duration_s * 1000.0 if horizon_ms is None else horizon_ms
        for label, (name, params) in policies.items():
            res = simulate(req, sc.engine, name, h, tenant_names=list(sc.tenant_names), **params)
            ten = res.tenants.reset_index()
            admitted = res.requests[res.requests["admitted_ms"].notna()]
            ten["mean_output"] = admitted.groupby("tenant")["output_tokens"].mean().reindex(ten["tenant"]).to_numpy()
            ten["policy"], ten["seed"] = label, seed
            ten["max_min"] = max_min_ratio(ten["share"].to_numpy())
            ten["jain"] = jain_index(ten["share"].to_numpy())
            ten["busy_ms"] = res.run["busy_ms"]
            ten["decode_tokens_run"] = res.run["decode_tokens"]
            ten["share_sum"] = ten["share"].sum()
            rows.append(ten)
    out = pd.concat(rows, ignore_index=True)
    first = ["policy", "seed", "tenant", "name"]
    return out[first + [c for c in out.columns if c not in first]]


def share_summary(runs: pd.DataFrame, value: str = "share", scale: float = 100.0) -> pd.DataFrame:
    """Mean and standard deviation over seeds of `value` per policy and tenant (wide), plus max/min."""
    g = runs.groupby(["policy", "name"], sort=False)[value]
    mean = (g.mean() * scale).unstack("name")
    sd = (g.std(ddof=1) * scale).unstack("name")
    order = list(dict.fromkeys(runs["policy"]))
    names = list(dict.fromkeys(runs["name"]))
    mm = runs.groupby(["policy", "seed"], sort=False)["max_min"].first().groupby("policy", sort=False)
    out = mean.loc[order, names]
    out["max/min"] = mm.mean().loc[order]
    out["max/min sd"] = mm.std(ddof=1).loc[order]
    return out.join(sd.loc[order, names].add_suffix(" sd"))


def component_split(runs: pd.DataFrame, column: str) -> pd.DataFrame:
    """Each tenant's part of `column` (e.g. decode_ms) within its run, x / sum over the run's
    tenants, with the run's max/min of those parts: columns policy, seed, name, part, part_max_min."""
    out = runs[["policy", "seed", "name", column]].copy()
    total = out.groupby(["policy", "seed"])[column].transform("sum")
    out["part"] = out[column] / total
    g = out.groupby(["policy", "seed"])["part"]
    out["part_max_min"] = g.transform("max") / g.transform("min")
    return out
