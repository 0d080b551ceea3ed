"""Runs the chapters repeat: one scenario, several policies, several seeds, one tidy table."""
from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence, Union

import numpy as np
import pandas as pd

from fairlib import sweep as sw
from fairlib.analysis.indices import jain_index, max_min_ratio
from fairlib.chapters import grid
from fairlib.sim.engine import SEED000_ENGINE
from fairlib.sim.simulate import simulate
from fairlib.traces import KINDS, SERVICES, load_azure_trace, trace_lengths
from fairlib.workload import Constant, Empirical, Scenario, TenantSpec

__all__ = ["policy_runs", "share_summary", "component_split", "grid_slice", "first_crossing", "azure_scenario",
           "counter_shares", "batch_summary", "window_shares"]


def policy_runs(scenario_for_seed: Callable, policies: Mapping[str, tuple], seeds, horizon_ms=None, *,
                batch_stats: bool = False) -> pd.DataFrame:
    """Simulate every (policy, seed); one row per (policy, seed, tenant).

    scenario_for_seed(seed) -> Scenario; policies: label -> (policy name, params dict).
    Columns: policy, seed, tenant, name, share, machine_ms, prefill_ms, decode_ms, decode_tokens,
    requests_admitted, requests_finished, requests_rejected, mean_output (the realised length of
    the admitted requests), max_min, jain, busy_ms, decode_tokens_run, share_sum.
    batch_stats: also ``iterations`` (the run's engine iterations), ``mean_batch`` (running
    sequences per iteration, ``decode_tokens_run / iterations``: every running sequence emits one
    token per iteration) and ``horizon_ms`` (for :func:`batch_summary`)."""
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
            if batch_stats:
                it = res.run["iterations"]
                ten["iterations"] = it
                ten["mean_batch"] = res.run["decode_tokens"] / it if it else math.nan
                ten["horizon_ms"] = h
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


def batch_summary(runs: pd.DataFrame, engine) -> pd.DataFrame:
    """Per policy (rows in run order), over the seeds of :func:`policy_runs` run with
    ``batch_stats=True``: ``mean batch`` (running sequences per iteration, mean over seeds) and its
    ``mean batch sd``; ``exchange rate`` at that mean batch, ``engine.exchange_rate(B)`` =
    ``(iter_base + iter_slope B) / (B prefill)``, the prompt tokens one decode token is worth; and
    ``busy (%)``, the engine's busy time over the horizon (mean over seeds)."""
    if "mean_batch" not in runs.columns:
        raise ValueError("batch_summary: run policy_runs(..., batch_stats=True)")
    per_run = runs.groupby(["policy", "seed"], sort=False)[["mean_batch", "busy_ms", "horizon_ms"]].first()
    per_run["busy"] = 100.0 * per_run["busy_ms"] / per_run["horizon_ms"]
    g = per_run.groupby("policy", sort=False)
    out = pd.DataFrame({"mean batch": g["mean_batch"].mean(), "mean batch sd": g["mean_batch"].std(ddof=1)})
    out["exchange rate"] = [float(engine.exchange_rate(b)) for b in out["mean batch"]]
    out["busy (%)"] = g["busy"].mean()
    return out.loc[list(dict.fromkeys(runs["policy"]))]


def window_shares(scenario_for, windows_s: Sequence[float], seeds, policy: tuple = ("fcfs", {})) -> pd.DataFrame:
    """Machine shares (%) of one policy run for several windows: ``scenario_for(seed, duration_s)``
    -> Scenario, simulated until ``duration_s`` (the load window; requests still running are cut
    there, as a live run's are). One row per window (``window (s)``), columns the tenants' mean
    share over ``seeds``, ``max/min`` (mean of the runs' ratios) and each tenant's ``sd``."""
    rows = []
    for w in windows_s:
        r = policy_runs(lambda s, w=w: scenario_for(s, float(w)), {f"{w:g}": policy}, seeds)
        rows.append(share_summary(r))
    out = pd.concat(rows)
    out.index = pd.Index([float(w) for w in windows_s], name="window (s)")
    out.columns.name = None
    return out


def component_split(runs: pd.DataFrame, column: str) -> pd.DataFrame:
    """Each tenant's part of `column` (e.g. decode_ms) within its run, x / sum over the run's
    tenants, with the run's max/min of those parts: columns policy, seed, name, part, part_max_min."""
    out = runs[["policy", "seed", "name", column]].copy()
    total = out.groupby(["policy", "seed"])[column].transform("sum")
    out["part"] = out[column] / total
    g = out.groupby(["policy", "seed"])["part"]
    out["part_max_min"] = g.transform("max") / g.transform("min")
    return out


# --- the reference grid, read or recomputed (chapters 2 and 3) ------------------------------
@functools.lru_cache(maxsize=4)
def _saved_grid(path: str, mtime_ns: int):
    return grid.load_grid(path, with_meta=True)


def _snap(values, reference, what: str, strict: bool) -> list:
    """Each value replaced by the reference value it equals within 1e-9 (relative); a value with
    no such match raises when ``strict`` (the saved grid holds only its own points), else stays."""
    out = []
    for v in values:
        hit = [r for r in reference if math.isclose(float(v), float(r), rel_tol=1e-9, abs_tol=1e-12)]
        if hit:
            out.append(hit[0])
        elif strict:
            raise ValueError(f"grid_slice: {what} {v!r} is not a point of the saved grid "
                             f"(its {what}s: {[round(float(r), 4) for r in reference]}); "
                             f"pass use_saved=False to compute it")
        else:
            out.append(float(v))
    return out


def grid_slice(floods: Optional[Sequence[float]] = None, spreads: Optional[Sequence[float]] = None,
               seeds: Optional[Sequence[int]] = None, policies: Optional[Sequence[str]] = None, *,
               use_saved: bool = True, duration_s: float = 120.0, path: Union[str, Path, None] = None,
               executor="serial") -> pd.DataFrame:
    """Rows of the reference grid (:func:`fairlib.chapters.grid.reference_grid`) for some floods, spreads,
    seeds and policy labels (None: all of the grid's), in grid order (floods, spreads, seeds, then
    policies in the order of :func:`fairlib.chapters.grid.reference_policies`), with a fresh index.

    use_saved: read them from the saved grid (``path``, default ``data/grid_seed000.csv.gz``);
        every value asked for must be one of its points and ``duration_s`` its duration.
        False: run them now with :func:`fairlib.sweep.sweep` (``executor``, default serial) at
        ``duration_s``; values equal to a grid point (within 1e-9) are taken as that point, so a
        recomputed slice of the grid compares with the saved one bit for bit.
    """
    labels = [p.label for p in grid.reference_policies()]
    policies = labels if policies is None else list(policies)
    unknown = [p for p in policies if p not in labels]
    if unknown:
        raise ValueError(f"grid_slice: policies {unknown} are not in the reference grid ({labels})")
    order = [p for p in labels if p in policies]
    floods = list(grid.REFERENCE_FLOODS if floods is None else floods)
    spreads = list(grid.REFERENCE_SPREADS if spreads is None else spreads)
    seeds = [int(s) for s in (grid.REFERENCE_SEEDS if seeds is None else seeds)]
    if not floods or not spreads or not seeds or not order:
        raise ValueError("grid_slice: floods, spreads, seeds and policies must not be empty")
    if use_saved:
        p = Path(grid.GRID_FILE if path is None else path)
        if not p.exists():
            raise FileNotFoundError(f"{p}: no saved grid; pass use_saved=False to compute the slice")
        table, meta = _saved_grid(str(p), os.stat(p).st_mtime_ns)
        saved_duration = meta.get("parameters", {}).get("duration_s")
        if saved_duration is not None and not math.isclose(float(saved_duration), float(duration_s)):
            raise ValueError(f"grid_slice: the saved grid ran {saved_duration:g} s, not {duration_s:g} s; "
                             f"pass use_saved=False to compute the slice at {duration_s:g} s")
        f_all = sorted(table["flood"].unique())
        s_all = sorted(table["spread"].unique())
        floods = _snap(floods, f_all, "flood", strict=True)
        spreads = _snap(spreads, s_all, "spread", strict=True)
        missing = sorted(set(seeds) - set(table["seed"].unique()))
        if missing:
            raise ValueError(f"grid_slice: seeds {missing} are not in the saved grid; pass use_saved=False")
        keep = (table["flood"].isin(floods) & table["spread"].isin(spreads) & table["seed"].isin(seeds)
                & table["policy"].isin(order))
        return table[keep].reset_index(drop=True)
    floods = _snap(floods, grid.REFERENCE_FLOODS, "flood", strict=False)
    spreads = _snap(spreads, grid.REFERENCE_SPREADS, "spread", strict=False)
    specs = [p for p in grid.reference_policies() if p.label in order]
    build = functools.partial(grid.grid_scenario, duration_s=float(duration_s))
    out = sw.sweep(build, {"flood": sorted(floods), "spread": sorted(spreads)}, specs, sorted(seeds),
                   executor=executor, progress=False)
    return out.reset_index(drop=True)


def first_crossing(x, y, z) -> float:
    """The first ``x`` at which ``y`` reaches ``z`` (``y - z`` turns from < 0 to >= 0), linearly
    interpolated between neighbouring points; ``x[0]`` if ``y >= z`` there already, NaN if ``y``
    never reaches ``z``. ``x`` increasing."""
    x, y, z = (np.asarray(a, dtype=np.float64) for a in (x, y, z))
    if not (x.ndim == 1 and x.shape == y.shape == z.shape and x.size >= 1):
        raise ValueError("first_crossing: x, y and z must be 1-D and of one length >= 1")
    if np.any(np.diff(x) <= 0) or not (np.all(np.isfinite(x)) and np.all(np.isfinite(y)) and np.all(np.isfinite(z))):
        raise ValueError("first_crossing: x must increase and all values be finite")
    d = y - z
    if d[0] >= 0:
        return float(x[0])
    up = np.nonzero(d >= 0)[0]
    if up.size == 0:
        return math.nan
    i = int(up[0])
    return float(x[i - 1] + (x[i] - x[i - 1]) * (-d[i - 1]) / (d[i] - d[i - 1]))


def azure_scenario(machine_ms_per_s: float = 750.0, duration_s: float = 120.0,
                   trace_dir: Union[str, Path, None] = None, prompt_tokens: Optional[int] = None,
                   engine=None, seed: int = 0):
    """The Azure LLM inference trace 2023 as two tenants, ``code`` (code completion) and ``conv``
    (conversation), on one replica (default the seed-000 engine), each offering
    ``machine_ms_per_s`` of machine per second (its rate follows from the cost of its mean
    request at ``max_batch``), Poisson arrivals.

    Lengths: from the committed quantile table (``trace_dir`` None: no raw file needed), or every
    request of the raw CSVs in ``trace_dir`` (:func:`fairlib.traces.load_azure_trace`). Prompt and
    output are drawn independently. ``prompt_tokens``: give every request this prompt instead
    (the trace's outputs alone)."""
    engine = SEED000_ENGINE if engine is None else engine
    tenants = []
    for kind in KINDS:
        if trace_dir is None:
            prompt, output = trace_lengths(kind, "quantiles")
        else:
            df = load_azure_trace(kind, path=trace_dir, download=False)
            prompt, output = Empirical(df["prompt_tokens"].to_numpy()), Empirical(df["output_tokens"].to_numpy())
        if prompt_tokens is not None:
            prompt = Constant(prompt_tokens)
        tenants.append(TenantSpec(kind, output=output, prompt=prompt, machine_ms_per_s=machine_ms_per_s))
    source = "the committed quantile table" if trace_dir is None else f"the raw trace in {trace_dir}"
    desc = (f"Azure LLM inference trace 2023 ({', '.join(SERVICES[k] for k in KINDS)}) from {source}; "
            f"{machine_ms_per_s:g} ms/s each" + ("" if prompt_tokens is None else f"; prompts {prompt_tokens}"))
    return Scenario(tuple(tenants), engine=engine, duration_s=duration_s, name="azure2023", description=desc, seed=seed)


def counter_shares(engine, prompt_tokens, output_tokens, wp: float = 1.0, wq: float = 2.0, batch=None) -> np.ndarray:
    """The machine shares a token counter (VTC) hands out to backlogged tenants, predicted: the
    counter keeps every tenant's priced tokens level, ``count_i * price_i`` equal with
    ``price_i = wp * prompt_i + wq * output_i``, while the machine bills ``count_i * cost_i``
    (``cost_i = engine.request_cost_ms(prompt_i, output_i, batch)``), so ``share_i`` is
    proportional to ``cost_i / price_i``. Equal shares exactly when ``wq / wp`` is the machine's
    exchange rate at ``batch`` (default ``engine.max_batch``)."""
    prompt = np.asarray(prompt_tokens, dtype=np.float64)
    output = np.asarray(output_tokens, dtype=np.float64)
    prompt, output = np.broadcast_arrays(prompt, output)
    if prompt.ndim != 1 or prompt.size == 0 or np.any(prompt < 0) or np.any(output < 0) \
            or not (np.all(np.isfinite(prompt)) and np.all(np.isfinite(output))):
        raise ValueError("counter_shares: prompt and output tokens must be finite, >= 0, one value per tenant")
    if not (wp >= 0 and wq >= 0 and wp + wq > 0):
        raise ValueError(f"counter_shares: weights must be >= 0 and not both 0, got wp={wp!r}, wq={wq!r}")
    price = wp * prompt + wq * output
    if np.any(price <= 0):
        raise ValueError("counter_shares: every tenant's request must have a positive price")
    ratio = np.asarray(engine.request_cost_ms(prompt, output, batch), dtype=np.float64) / price
    return ratio / ratio.sum()


# --- chapters 2 and 3: the quota's gap, VTC's counters, paired differences --------------------
__all__ += ["quota_decomposition", "gap_parts", "vtc_counters", "paired_difference", "shown", "MISSING"]

#: The four rows of :func:`quota_decomposition`'s second table, in order.
QUOTA_STEPS = ("predicted: equal counts x nominal cost", "equal counts x realised cost",
               "realised counts x nominal cost", "measured: realised counts x realised cost")


def quota_decomposition(runs: pd.DataFrame, policy: str, nominal_cost) -> tuple:
    """Why an equal request quota's measured split differs from ``cost_i / sum_j cost_j``.

    ``runs``: :func:`policy_runs` rows; ``policy``: the quota's label there; ``nominal_cost``:
    the cost (ms) of each tenant's mean request at the engine's batch, a Series by tenant name.
    Counts and machine time are means over the seeds. Returns two tables:

    - per tenant: ``admitted`` and ``finished`` requests, ``drawn output`` (mean output length of
      the admitted requests), ``decoded per admitted`` (tokens emitted / admitted: less when
      requests are still decoding at the end), ``nominal ms``, ``realised ms`` (machine time /
      admitted) and ``realised vs nominal (%)``;
    - per step (:data:`QUOTA_STEPS`): the shares (%) and ``max/min`` with the counts equal or as
      admitted, and the cost of a request nominal or realised (``count x cost`` normalised)."""
    q = runs[runs["policy"] == policy]
    if q.empty:
        raise ValueError(f"quota_decomposition: no runs of policy {policy!r}")
    names = list(dict.fromkeys(q["name"]))
    g = q.groupby("name", sort=False)
    count = g["requests_admitted"].mean().loc[names]
    machine = g["machine_ms"].mean().loc[names]
    nominal = pd.Series(nominal_cost, dtype=float).loc[names]
    realised = machine / count
    tenants = pd.DataFrame({
        "admitted": count, "finished": g["requests_finished"].mean().loc[names],
        "drawn output": g["mean_output"].mean().loc[names],
        "decoded per admitted": g["decode_tokens"].mean().loc[names] / count,
        "nominal ms": nominal, "realised ms": realised,
        "realised vs nominal (%)": (realised / nominal - 1.0) * 100.0})
    equal = pd.Series(1.0, index=names)
    rows = {}
    for step, (n, c) in zip(QUOTA_STEPS, [(equal, nominal), (equal, realised),
                                          (count, nominal), (count, realised)]):
        m = n * c
        rows[step] = list(m / m.sum() * 100.0) + [float(m.max() / m.min())]
    steps = pd.DataFrame.from_dict(rows, orient="index", columns=names + ["max/min"])
    return tenants.rename_axis("tenant"), steps.rename_axis("step")


def gap_parts(steps: pd.DataFrame) -> pd.Series:
    """Split the gap between the predicted and the measured max/min of
    :func:`quota_decomposition` into the part of the cost and the part of the count: each the
    mean of its effect taken first and taken second (the two parts add up to the gap)."""
    p, c, n, m = (float(steps.loc[s, "max/min"]) for s in QUOTA_STEPS)
    cost = ((p - c) + (n - m)) / 2.0
    count = ((p - n) + (c - m)) / 2.0
    gap = p - m
    return pd.Series({"gap": gap, "cost": cost, "count": count,
                      "cost (% of gap)": cost / gap * 100.0 if gap else math.nan,
                      "count (% of gap)": count / gap * 100.0 if gap else math.nan})


def vtc_counters(scenario_for_seed: Callable, seeds, params: Optional[Mapping] = None,
                 policy: str = "vtc") -> pd.DataFrame:
    """A counter policy's own per-tenant counters at the end of each run (priced tokens for VTC:
    ``wp`` per prompt token admitted, ``wq`` per output token, lifts included). One row per seed:
    the tenants' counters, ``max/min`` and ``max - min``."""
    seeds = list(seeds)
    if not seeds:
        raise ValueError("vtc_counters: no seeds")
    rows = {}
    for seed in seeds:
        sc = scenario_for_seed(seed)
        res = simulate(sc.requests(seed), sc.engine, policy, sc.duration_s * 1000.0,
                       tenant_names=list(sc.tenant_names), **dict(params or {}))
        if res.counters is None:
            raise ValueError(f"vtc_counters: policy {policy!r} keeps no counters")
        c = np.asarray(res.counters, dtype=np.float64)
        rows[seed] = list(c) + [float(c.max() / c.min()), float(c.max() - c.min())]
    cols = list(scenario_for_seed(next(iter(seeds))).tenant_names) + ["max/min", "max - min"]
    return pd.DataFrame.from_dict(rows, orient="index", columns=cols).rename_axis("seed")


def paired_difference(a: pd.Series, b: pd.Series) -> pd.Series:
    """``a - b`` over paired runs (same index, e.g. seeds): mean, standard deviation, standard
    error of the mean, min, max, how many runs have ``a > b`` and how many runs there are."""
    d = (a - b).dropna()
    n = int(d.size)
    sd = float(d.std(ddof=1)) if n > 1 else math.nan
    if n == 0:
        return pd.Series({"mean": math.nan, "sd": math.nan, "se": math.nan, "min": math.nan,
                          "max": math.nan, "a > b": 0, "runs": 0})
    return pd.Series({"mean": math.fsum(d) / n, "sd": sd, "se": sd / math.sqrt(n),
                      "min": float(d.min()), "max": float(d.max()),
                      "a > b": int((d > 0).sum()), "runs": n})


#: How :func:`shown` writes a missing value (a policy without a counter, a row nothing asserts).
MISSING = "—"


def _rounded(value, digits: int):
    """One cell rounded to ``digits`` (0: a whole number); text, booleans and missing values kept."""
    if value is None or isinstance(value, (str, bool, np.bool_)):
        return value
    f = float(value)
    if math.isnan(f):
        return value
    return int(round(f)) if digits == 0 else round(f, digits)


def shown(table: pd.DataFrame, digits: int = 3, rows: Optional[Mapping] = None) -> pd.DataFrame:
    """A table (e.g. :func:`fairlib.chapters.published.compare`) rounded for display: numeric columns and
    the numbers in the ``tolerance`` column (which also holds text) to ``digits``. ``rows``
    ({row label: digits}) rounds those rows otherwise: the numeric columns then become text, each
    row with its own decimals. ``digits`` 0 alone gives whole numbers (int).
    A missing value (None, NaN) is shown as :data:`MISSING`, "—" (the other numbers of a
    float column with a missing value become text with ``digits`` decimals)."""
    per_row = [dict(rows or {}).get(label, digits) for label in table.index]
    if rows is None and digits != 0:
        out = table.round(digits)
    else:
        out = table.copy()
        for col in out.columns:
            if pd.api.types.is_numeric_dtype(out[col]) and not pd.api.types.is_bool_dtype(out[col]):
                cells = [_rounded(v, d) for v, d in zip(out[col], per_row)]
                if rows is not None:    # text with each row's decimals: 3.050 beside 95040
                    cells = [c if isinstance(c, int) or c != c else f"{c:.{d}f}"
                             for c, d in zip(cells, per_row)]
                out[col] = pd.Series(cells, index=out.index, dtype=object)
    if "tolerance" in out.columns:
        out["tolerance"] = pd.Series([_rounded(t, d) for t, d in zip(out["tolerance"], per_row)],
                                     index=out.index, dtype=object)
    for col in out.columns:
        missing = out[col].isna()
        if missing.any():
            if pd.api.types.is_float_dtype(out[col]):   # keep the digits of the numbers
                out[col] = pd.Series([MISSING if m else f"{v:.{d}f}" for v, m, d
                                      in zip(out[col], missing, per_row)],
                                     index=out.index, dtype=object)
            else:
                out[col] = out[col].astype(object).where(~missing, MISSING)
    return out
