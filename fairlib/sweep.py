"""Sweeps: a grid of scenarios x seeds x policies, run in parallel, one tidy row per run.

    from fairlib import sweep
    from fairlib.chapters import presets
    table = sweep.sweep(presets.seed000, grid={"flood": [1, 2, 4]}, seeds=range(3),
                        policies=["fcfs", ("vtc", "vtc", {"wp": 1, "wq": 2})])

The book's reference grid (chapters 2-4) is ``fairlib.chapters.grid``.

Each grid point and seed builds one request table (``build(**point).requests(seed)``), and every
policy runs on that same table: the policies of one row group see identical requests. A run goes
through the lean path: the engine state is filled straight from the table's arrays and the
compiled loop (``fairlib.sim.loop.run``) runs it; the row is computed from the final state arrays,
without the per-request result table ``fairlib.simulate`` builds (the numbers are identical; see
tests/test_sweep.py).

Parallelism: the runs are cut into chunks of whole (grid point, seed) groups, about
``chunk_runs`` runs each, and the chunks go to a ``concurrent.futures.Executor``: a process pool
with ``os.cpu_count()`` workers by default, or the executor passed (a Dask ``distributed.Client``
is accepted as is: its ``get_executor()`` is used). The result never depends on the executor,
the chunking or the number of workers: rows come back sorted in grid order (grid points in
``itertools.product`` order, then seeds, then policies in the order given).

One row per run. Columns: the grid's parameters, ``seed``, ``policy`` (the label),
``policy_name``, ``policy_params`` (JSON of the parameters the run used), then

- ``requests``, ``rejected``, ``admitted``, ``finished``: request counts;
- ``busy_ms``, ``end_ms``, ``iterations``, ``decode_tokens`` (tokens emitted in the run);
- ``prefill_frac``: prefill time / busy time (the share of the machine spent on prefill);
- ``max_min`` and ``jain`` of the machine shares; ``counter_max_min``: max/min of the policy's
  own per-tenant counters at the end (NaN for a policy that keeps none);
- ``ttft_p50``, ``ttft_p99``, ``e2e_p50``, ``e2e_p99`` (ms): over the requests that finished
  (``np.percentile``, linear), all tenants together;
- per tenant ``<name>`` (the scenario's tenant names): ``share_<name>`` (machine share),
  ``decode_share_<name>`` (its part of all decode time), ``prefill_share_<name>`` (its prefill
  time / busy time: the part of the replica it burns on prefill), ``decode_tokens_<name>``.
"""
from __future__ import annotations

import itertools
import json
import math
import multiprocessing as mp
import os
import sys
import threading
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np
import pandas as pd

from fairlib import scenarios
from fairlib.analysis.indices import jain_index, max_min_ratio
from fairlib.sim import loop
from fairlib.sim.policies import make_policy
from fairlib.sim.simulate import RequestArrays
from fairlib.sim import state
from fairlib.workload import Scenario, TenantSpec

__all__ = ["PolicySpec", "ScenarioPoint", "scenario_policy", "sweep", "run_point", "summarize_state", "RUN_COLUMNS",
           "TENANT_COLUMNS"]

#: Per-run columns after the grid's parameters, in order (tenant columns follow).
RUN_COLUMNS = ("policy", "policy_name", "policy_params", "requests", "rejected", "admitted", "finished",
               "busy_ms", "end_ms", "iterations", "decode_tokens", "prefill_frac", "max_min", "jain",
               "counter_max_min", "ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99")
#: Per-tenant column prefixes: ``<prefix>_<tenant name>``.
TENANT_COLUMNS = ("share", "decode_share", "prefill_share", "decode_tokens")


# --- policies in a sweep --------------------------------------------------------------------
@dataclass(frozen=True)
class PolicySpec:
    """A policy in a sweep: a ``label`` (the row's ``policy``), a registry ``name`` and its
    parameters, either fixed (a mapping) or derived from the scenario (a callable ``scenario ->
    mapping``, e.g. a quota computed from the tenants' mean request cost). A callable must be
    picklable (a module-level function) to reach worker processes."""

    label: str
    name: str
    params: Union[Mapping[str, Any], Callable[[Scenario], Mapping[str, Any]]] = field(default_factory=dict)

    def resolve(self, scenario: Scenario) -> dict:
        p = self.params(scenario) if callable(self.params) else self.params
        return dict(p)


@dataclass(frozen=True)
class ScenarioPoint:
    """``build(**point)`` for a scenario file (``fairlib sweep``): the workload of scenario ``name``
    at a grid point's ``rho`` / ``rate_scale`` (``fairlib.scenarios.load``); picklable, so it
    reaches worker processes."""

    name: str
    capacity_file: Optional[str] = None
    duration_s: Optional[float] = None

    def __call__(self, rho: Optional[float] = None, rate_scale: Optional[float] = None) -> Scenario:
        return scenarios.load(self.name, rho=rho, rate_scale=rate_scale, capacity=self.capacity_file,
                              duration_s=self.duration_s).scenario


def _scenario_params(name: str, params: dict, scenario: Scenario) -> dict:
    return scenario.policy_params(name, dict(params))


def scenario_policy(name: str, params: Optional[Mapping] = None, label: Optional[str] = None) -> PolicySpec:
    """A policy whose parameters are ``params`` completed by the scenario's own (the tenants'
    weights: ``Scenario.policy_params``), as ``fairlib simulate`` runs it."""
    return PolicySpec(label or name, name, partial(_scenario_params, name, dict(params or {})))


def _as_spec(p) -> PolicySpec:
    if isinstance(p, PolicySpec):
        return p
    if isinstance(p, str):
        return PolicySpec(p, p, {})
    if isinstance(p, tuple) and len(p) in (2, 3):
        if len(p) == 2:
            return PolicySpec(p[0], p[0], p[1]) if not isinstance(p[1], str) else PolicySpec(p[0], p[1], {})
        return PolicySpec(*p)
    raise ValueError(f"a policy in a sweep is a name, a (label, name[, params]) tuple or a PolicySpec; got {p!r}")


def _specs(policies) -> list:
    if isinstance(policies, Mapping):
        items = []
        for label, v in policies.items():
            if isinstance(v, str):
                items.append(PolicySpec(label, v, {}))
            elif isinstance(v, tuple) and len(v) == 2:
                items.append(PolicySpec(label, v[0], v[1]))
            else:
                raise ValueError(f"policies[{label!r}] must be a name or a (name, params) tuple, got {v!r}")
    else:
        items = [_as_spec(p) for p in policies]
    if not items:
        raise ValueError("a sweep needs at least one policy")
    labels = [s.label for s in items]
    if len(set(labels)) != len(labels):
        raise ValueError(f"policy labels must be distinct, got {labels}")
    return items


# --- one scenario, all policies: the lean path --------------------------------------------
def _json_params(params: dict) -> str:
    def plain(v):
        if isinstance(v, (np.integer,)):
            return int(v)
        if isinstance(v, (np.floating,)):
            return float(v)
        if isinstance(v, (list, tuple, np.ndarray)):
            return [plain(x) for x in v]
        return v
    return json.dumps({k: plain(v) for k, v in sorted(params.items())}, separators=(",", ":"))


def _index(f, v: np.ndarray) -> float:
    """``f`` (``jain_index`` or ``max_min_ratio``) of ``v``; NaN where it is undefined (no service
    at all, a NaN share)."""
    return f(v) if v.size and np.all(np.isfinite(v)) and np.all(v >= 0) and v.max() > 0 else math.nan


def summarize_state(S, n: int, names: Sequence[str], counters: Optional[np.ndarray]) -> dict:
    """The sweep's row (without the grid and policy columns) from a run's final state arrays
    (fairlib/sim/state.py). ``counters``: the policy's per-tenant counters, or None."""
    RF, RI, TF, TI = S.RF, S.RI, S.TF, S.TI
    machine = TF[state.T_MACHINE]
    total = machine.sum()
    busy = float(S.sf[state.BUSY_MS])
    share = machine / total if total > 0 else np.full(machine.size, np.nan)
    decode = TF[state.T_DECODE]
    dtotal = decode.sum()
    done = RI[state.STATUS, :n] == state.FINISHED
    arrival = RF[state.ARRIVAL, :n][done]
    if arrival.size:
        lat = np.percentile(np.stack([RF[state.FIRST, :n][done] - arrival,
                                      RF[state.FINISH, :n][done] - arrival]), [50.0, 99.0], axis=1)   # lat[q, metric]
        ttft, e2e = (float(lat[0, 0]), float(lat[1, 0])), (float(lat[0, 1]), float(lat[1, 1]))
    else:
        ttft = e2e = (math.nan, math.nan)
    row = {
        "requests": int(n), "rejected": int(TI[state.T_REJECTED].sum()),
        "admitted": int(TI[state.T_ADMITTED].sum()),
        "finished": int(TI[state.T_FINISHED].sum()),
        "busy_ms": busy, "end_ms": float(S.sf[state.T_NOW]), "iterations": int(S.si[state.ITERATIONS]),
        "decode_tokens": int(S.si[state.DECODE_TOKENS]),
        "prefill_frac": float(TF[state.T_PREFILL].sum() / busy) if busy > 0 else math.nan,
        "max_min": _index(max_min_ratio, share), "jain": _index(jain_index, share),
        "counter_max_min": _index(max_min_ratio, np.asarray(counters, float)) if counters is not None else math.nan,
        "ttft_p50": ttft[0], "ttft_p99": ttft[1], "e2e_p50": e2e[0], "e2e_p99": e2e[1],
    }
    for i, name in enumerate(names):
        row[f"share_{name}"] = float(share[i])
    for i, name in enumerate(names):
        row[f"decode_share_{name}"] = float(decode[i] / dtotal) if dtotal > 0 else math.nan
    for i, name in enumerate(names):
        row[f"prefill_share_{name}"] = float(TF[state.T_PREFILL, i] / busy) if busy > 0 else math.nan
    for i, name in enumerate(names):
        row[f"decode_tokens_{name}"] = int(TI[state.T_TOKENS, i])
    return row


def run_point(scenario: Scenario, seed: int, policies, horizon_ms: Optional[float] = None) -> list:
    """Run every policy on ``scenario.requests(seed)`` through the lean path; one row (dict) per
    policy, in order, without grid columns: ``policy``, ``policy_name``, ``policy_params`` and
    the columns :func:`summarize_state` gives."""
    specs = _specs(policies)
    df = scenario.requests(seed)
    names = [str(x) for x in scenario.tenant_names]
    table = RequestArrays(df, len(names))
    engine = scenario.engine
    E = engine.kernel_params()
    h = float(scenario.duration_s * 1000.0 if horizon_ms is None else horizon_ms)
    rows = []
    for spec in specs:
        params = spec.resolve(scenario)
        pol = make_policy(spec.name, **params)
        for col in pol.needs:   # what simulate() checks; a scenario's table has every column
            if col not in df.columns and not (col == "priority" and "klass" in df.columns):
                raise ValueError(f"policy {pol.name!r} needs the requests column {col!r}")
        S, pf, pi = table.state(engine, pol)
        loop.run(S, E, pol.pid, pf, pi, h)
        row = {"policy": spec.label, "policy_name": spec.name, "policy_params": _json_params(params)}
        row.update(summarize_state(S, table.n, names, pol.counters(pf, len(names))))
        rows.append(row)
    return rows


def _run_chunk(build, tasks, specs, horizon_ms):
    """Worker: tasks = [(index, point, seed)] -> [(index, rows)]."""
    out = []
    for index, point, seed in tasks:
        scenario = build(**point)
        out.append((index, run_point(scenario, seed, specs, horizon_ms)))
    return out


def _warm():
    """Load (or compile) the kernel in this process, so forked workers inherit it."""
    sc = Scenario((TenantSpec("warm", output=8, prompt=16, rate_rps=20.0),), duration_s=1.0)
    run_point(sc, 0, ["fcfs"], 100.0)


def _default_context():
    # fork is cheapest (workers inherit the loaded kernel) but unsafe once the parent runs threads
    if "fork" in mp.get_all_start_methods() and threading.active_count() == 1:
        return mp.get_context("fork")
    return mp.get_context("spawn")


def _show_progress(progress) -> bool:
    if progress is None:
        return bool(getattr(sys.stderr, "isatty", lambda: False)())
    return bool(progress)


def sweep(build: Union[Callable[..., Scenario], Scenario], grid: Optional[Mapping[str, Sequence]] = None,
          policies=("fcfs",), seeds: Sequence[int] = (0,), *, horizon_ms: Optional[float] = None,
          executor: Union[None, str, Executor, Any] = None, max_workers: Optional[int] = None,
          chunk_runs: Optional[int] = None, progress: Optional[bool] = None) -> pd.DataFrame:
    """Run ``policies`` on every grid point x seed; one row per run, in grid order.

    build: ``build(**point) -> Scenario`` for each point of ``grid`` (e.g. ``presets.seed000``), or a
        Scenario (then ``grid`` must be empty). Must be picklable (a module-level function, or a
        ``functools.partial`` of one) to reach worker processes.
    grid: ``{parameter: values}``; the points are ``itertools.product`` of the values, the last
        parameter varying fastest. None or {}: one point.
    policies: names, ``(label, name, params)`` tuples, :class:`PolicySpec` objects, or a mapping
        ``label -> (name, params)``; params may be a callable ``scenario -> params``.
    seeds: run seeds (``Scenario.requests(seed)``).
    horizon_ms: default: the scenario's duration.
    executor: None (a process pool of ``max_workers`` workers, default ``os.cpu_count()``;
        1 worker runs in this process), ``"serial"`` (this process), any
        ``concurrent.futures.Executor``, or an object with ``get_executor()`` (a Dask
        ``distributed.Client``). A pool the sweep makes it also shuts down; it forks (workers
        inherit the loaded kernel) when this process runs no other thread, else it spawns, and
        then ``build`` and parameter callables must be importable (not defined in a notebook).
    chunk_runs: about how many runs one task carries (whole grid point x seed groups); default:
        at most 200, and at least 4 tasks per worker when there are enough runs.
    progress: a tqdm bar over runs; None: only when stderr is a terminal.
    """
    specs = _specs(policies)
    build, points = _points(build, grid)
    seeds = [int(s) for s in seeds]
    tasks = [(i, point, seed) for i, (point, seed) in enumerate(itertools.product(points, seeds))]
    n_runs = len(tasks) * len(specs)
    if chunk_runs is not None and (isinstance(chunk_runs, bool) or not float(chunk_runs).is_integer()
                                   or chunk_runs < 1):
        raise ValueError(f"sweep: chunk_runs must be an integer >= 1, got {chunk_runs!r}")
    own, pool, max_workers = _executor(executor, max_workers)
    if pool is None:
        workers = 1
    else:
        workers = getattr(pool, "_max_workers", None) or max_workers or os.cpu_count() or 1
    per_task = len(specs)
    if chunk_runs is None:
        n_chunks = max(4 * workers, math.ceil(n_runs / 200))
        size = max(1, math.ceil(len(tasks) / max(1, n_chunks)))
    else:
        size = max(1, int(chunk_runs) // per_task)
    chunks = [tasks[i:i + size] for i in range(0, len(tasks), size)]
    results = _run_chunks(build, chunks, specs, horizon_ms, pool, own, n_runs if _show_progress(progress) else None)
    records = []
    for index, point, seed in tasks:
        for row in results[index]:
            records.append({**point, "seed": seed, **row})
    df = pd.DataFrame.from_records(records)
    return df


def _points(build, grid) -> tuple:
    """``(build, points)``: the checked builder (a fixed Scenario wrapped) and the grid's points,
    ``itertools.product`` of its values, the last parameter varying fastest."""
    grid = dict(grid or {})
    if isinstance(build, Scenario):
        if grid:
            raise ValueError("sweep: a fixed Scenario takes no grid; pass a function building one per point")
        build = _Fixed(build)
    if not callable(build):
        raise ValueError(f"sweep: build must be a callable returning a Scenario, or a Scenario; got {build!r}")
    for k, v in grid.items():
        if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
            raise ValueError(f"sweep: grid[{k!r}] must be a sequence of values, got {v!r}")
    if "seed" in grid:
        raise ValueError("sweep: 'seed' is the seeds argument, not a grid parameter")
    keys = list(grid)
    return build, [dict(zip(keys, vals)) for vals in itertools.product(*(list(grid[k]) for k in keys))]


def _executor(executor, max_workers) -> tuple:
    """``(own, pool, max_workers)``: the pool the runs go to (None: this process), whether the sweep
    made it (and shuts it down), and the worker count (a Dask client's cluster size when not given)."""
    pool: Optional[Executor]
    if isinstance(executor, str):
        if executor != "serial":
            raise ValueError(f"sweep: executor must be None, 'serial', an Executor or a Dask Client; got {executor!r}")
        own, pool = False, None
    elif executor is None:
        workers = (os.cpu_count() or 1) if max_workers is None else int(max_workers)
        if workers <= 1:
            own, pool = False, None
        else:
            _warm()
            own, pool = True, ProcessPoolExecutor(max_workers=workers, mp_context=_default_context())
    elif hasattr(executor, "get_executor") and not isinstance(executor, Executor):
        own, pool = False, executor.get_executor()
        if max_workers is None and hasattr(executor, "nthreads"):   # a Dask client: its cluster's size
            try:
                max_workers = max(1, sum(executor.nthreads().values()))
            except Exception:   # noqa: BLE001 - only a chunking hint
                max_workers = None
    elif isinstance(executor, Executor):
        own, pool = False, executor
    else:
        raise ValueError(f"sweep: executor must be None, 'serial', an Executor or a Dask Client; got {executor!r}")
    return own, pool, max_workers


def _run_chunks(build, chunks: list, specs, horizon_ms, pool, own: bool, bar_total: Optional[int]) -> dict:
    """Task index -> its rows, every chunk run in this process (``pool`` None) or on ``pool`` (shut
    down after when ``own``); a tqdm bar over ``bar_total`` runs when given."""
    per_task = len(specs)
    results = {}
    bar = None
    if bar_total is not None:
        from tqdm.auto import tqdm
        bar = tqdm(total=bar_total, unit="run", desc="sweep", smoothing=0.1)
    try:
        if pool is None:
            for chunk in chunks:
                for index, rows in _run_chunk(build, chunk, specs, horizon_ms):
                    results[index] = rows
                if bar is not None:
                    bar.update(len(chunk) * per_task)
        else:
            futures = {pool.submit(_run_chunk, build, chunk, specs, horizon_ms): len(chunk) for chunk in chunks}
            for fut in as_completed(futures):
                for index, rows in fut.result():
                    results[index] = rows
                if bar is not None:
                    bar.update(futures[fut] * per_task)
    finally:
        if bar is not None:
            bar.close()
        if own and pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    return results


@dataclass(frozen=True)
class _Fixed:
    scenario: Scenario

    def __call__(self):
        return self.scenario
