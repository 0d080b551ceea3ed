"""Sweeps: a grid of scenarios x seeds x policies, run in parallel, one tidy row per run.

    from fairlib import presets, sweep
    table = sweep.sweep(presets.seed000, grid={"flood": [1, 2, 4]}, seeds=range(3),
                        policies=["fcfs", ("vtc", "vtc", {"wp": 1, "wq": 2})])

    table = sweep.run_reference_grid()            # the book's reference grid (chapter 3)
    table = sweep.load_grid()                     # ... or the saved one (data/grid_seed000.csv.gz)

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
import os
import subprocess
import sys
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np
import pandas as pd

from .policies import make_policy
from .sim import loop
from .simulate import RequestArrays
from .sim.state import (ARRIVAL, BUSY_MS, DECODE_TOKENS, FINISH, FINISHED, FIRST, ITERATIONS, STATUS, T_ADMITTED,
                        T_DECODE, T_FINISHED, T_MACHINE, T_NOW, T_PREFILL, T_REJECTED, T_TOKENS)
from .workload import Scenario

__all__ = ["PolicySpec", "sweep", "run_scenario", "summarize", "reference_grid", "reference_policies",
           "run_reference_grid", "save_grid", "load_grid", "grid_scenario", "operator_rpm_limit",
           "REFERENCE_FLOODS", "REFERENCE_SPREADS", "REFERENCE_SEEDS", "SEED000_SPREAD", "FLOOD_TENANT",
           "GRID_FILE", "RUN_COLUMNS", "TENANT_COLUMNS"]

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
GRID_FILE = DATA_DIR / "grid_seed000.csv.gz"

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


def _ratio(v: np.ndarray) -> float:
    """max/min as fairlib.metrics.max_min_ratio: NaN if all are 0, inf if only some are."""
    if v.size == 0 or not np.all(np.isfinite(v)):
        return math.nan
    hi, lo = v.max(), v.min()
    if hi == 0:
        return math.nan
    if lo <= 0:
        return math.inf if lo == 0 else math.nan
    return float(hi / lo)


def _jain(v: np.ndarray) -> float:
    """Jain's index as fairlib.metrics.jain_index: (sum y)^2 / (n sum y^2), y scaled by its max.
    Sums with ``math.fsum`` (exactly rounded, so the same bits on every CPU; ``np.dot`` goes
    through BLAS, whose kernel and summation order depend on the processor)."""
    if v.size == 0 or not np.all(np.isfinite(v)) or v.max() == 0:
        return math.nan
    y = [float(x) for x in v / v.max()]
    return math.fsum(y) ** 2 / (len(y) * math.fsum(x * x for x in y))


def summarize(S, n: int, names: Sequence[str], counters: Optional[np.ndarray]) -> dict:
    """The sweep's row (without the grid and policy columns) from a run's final state arrays
    (fairlib/sim/state.py). ``counters``: the policy's per-tenant counters, or None."""
    RF, RI, TF, TI = S.RF, S.RI, S.TF, S.TI
    machine = TF[T_MACHINE]
    total = machine.sum()
    busy = float(S.sf[BUSY_MS])
    share = machine / total if total > 0 else np.full(machine.size, np.nan)
    decode = TF[T_DECODE]
    dtotal = decode.sum()
    done = RI[STATUS, :n] == FINISHED
    arrival = RF[ARRIVAL, :n][done]
    if arrival.size:
        lat = np.percentile(np.stack([RF[FIRST, :n][done] - arrival, RF[FINISH, :n][done] - arrival]),
                            [50.0, 99.0], axis=1)   # lat[q, metric]
        ttft, e2e = (float(lat[0, 0]), float(lat[1, 0])), (float(lat[0, 1]), float(lat[1, 1]))
    else:
        ttft = e2e = (math.nan, math.nan)
    row = {
        "requests": int(n), "rejected": int(TI[T_REJECTED].sum()), "admitted": int(TI[T_ADMITTED].sum()),
        "finished": int(TI[T_FINISHED].sum()),
        "busy_ms": busy, "end_ms": float(S.sf[T_NOW]), "iterations": int(S.si[ITERATIONS]),
        "decode_tokens": int(S.si[DECODE_TOKENS]),
        "prefill_frac": float(TF[T_PREFILL].sum() / busy) if busy > 0 else math.nan,
        "max_min": _ratio(share), "jain": _jain(share),
        "counter_max_min": _ratio(np.asarray(counters, float)) if counters is not None else math.nan,
        "ttft_p50": ttft[0], "ttft_p99": ttft[1], "e2e_p50": e2e[0], "e2e_p99": e2e[1],
    }
    for i, name in enumerate(names):
        row[f"share_{name}"] = float(share[i])
    for i, name in enumerate(names):
        row[f"decode_share_{name}"] = float(decode[i] / dtotal) if dtotal > 0 else math.nan
    for i, name in enumerate(names):
        row[f"prefill_share_{name}"] = float(TF[T_PREFILL, i] / busy) if busy > 0 else math.nan
    for i, name in enumerate(names):
        row[f"decode_tokens_{name}"] = int(TI[T_TOKENS, i])
    return row


def run_scenario(scenario: Scenario, seed: int, policies, horizon_ms: Optional[float] = None) -> list:
    """Run every policy on ``scenario.requests(seed)`` through the lean path; one row (dict) per
    policy, in order, without grid columns: ``policy``, ``policy_name``, ``policy_params`` and
    the columns :func:`summarize` gives."""
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
        row.update(summarize(S, table.n, names, pol.counters(pf, len(names))))
        rows.append(row)
    return rows


def _run_chunk(build, tasks, specs, horizon_ms):
    """Worker: tasks = [(index, point, seed)] -> [(index, rows)]."""
    out = []
    for index, point, seed in tasks:
        scenario = build(**point)
        out.append((index, run_scenario(scenario, seed, specs, horizon_ms)))
    return out


def _warm():
    """Load (or compile) the kernel in this process, so forked workers inherit it."""
    from .presets import seed000
    sc = seed000(duration_s=1.0)
    run_scenario(sc, 0, ["fcfs"], 100.0)


def _default_context():
    import multiprocessing as mp
    import threading
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
    points = [dict(zip(keys, vals)) for vals in itertools.product(*(list(grid[k]) for k in keys))]
    seeds = [int(s) for s in seeds]
    tasks = [(i, point, seed) for i, (point, seed) in enumerate(itertools.product(points, seeds))]
    n_runs = len(tasks) * len(specs)
    if chunk_runs is not None and (isinstance(chunk_runs, bool) or not float(chunk_runs).is_integer()
                                   or chunk_runs < 1):
        raise ValueError(f"sweep: chunk_runs must be an integer >= 1, got {chunk_runs!r}")

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

    results = {}
    bar = None
    if _show_progress(progress):
        from tqdm.auto import tqdm
        bar = tqdm(total=n_runs, unit="run", desc="sweep", smoothing=0.1)
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
        if own:
            pool.shutdown(wait=True, cancel_futures=True)

    records = []
    for index, point, seed in tasks:
        for row in results[index]:
            records.append({**point, "seed": seed, **row})
    df = pd.DataFrame.from_records(records)
    return df


@dataclass(frozen=True)
class _Fixed:
    scenario: Scenario

    def __call__(self):
        return self.scenario


# --- the reference grid (chapter 3) -------------------------------------------------------
def _seed000_means():
    from .presets import SEED000_OUTPUT_MEANS
    return SEED000_OUTPUT_MEANS


#: The seed's own output-length spread: longest / shortest mean output (353.8 / 23.7 = 14.93).
SEED000_SPREAD = max(_seed000_means()) / min(_seed000_means())
#: Flood levels: one tenant's offered load times k, k = 1.0 .. 6.5 step 0.5.
REFERENCE_FLOODS = tuple(1.0 + 0.5 * i for i in range(12))
#: Output-length spreads (longest / shortest mean), geometric from 1 (all equal) to the seed's
#: own 14.93 (the last is the seed's scenario exactly): ``S ** (i / 11)`` rounded to 12
#: significant digits, so the grid is the same on every CPU (``np.geomspace`` uses numpy's SIMD
#: ``exp``/``log``, whose last bit differs between AVX2 and AVX-512 processors).
REFERENCE_SPREADS = tuple(float(f"{SEED000_SPREAD ** (i / 11):.12g}") for i in range(12))
REFERENCE_SEEDS = tuple(range(12))
#: The flooded tenant: the agent (index 3), which reproduces the published flood sweep (FCFS
#: 1.17 -> 7.00, crossing VTC near k = 3.3) better than classify; see reference_grid().
FLOOD_TENANT = 3


def grid_scenario(flood: float = 1.0, spread: Optional[float] = None, duration_s: float = 120.0,
                  flood_tenant: int = FLOOD_TENANT) -> Scenario:
    """The seed-000 scenario at one grid point: ``presets.seed000(flood=flood,
    flood_tenant=flood_tenant, spread=spread)``; a spread equal to the seed's own
    (:data:`SEED000_SPREAD`) uses the published means as they are (``spread=None``)."""
    from .presets import seed000
    if spread is not None and math.isclose(spread, SEED000_SPREAD, rel_tol=1e-12):
        spread = None
    return seed000(flood=flood, flood_tenant=flood_tenant, spread=spread, duration_s=duration_s)


def operator_rpm_limit(scenario: Scenario) -> int:
    """The equal requests/min quota an operator would set for ``scenario``: the machine's
    capacity in requests/min split equally, ``60000 / sum_i cost_i`` (``cost_i``: the mean
    request of tenant i at ``max_batch``), as ``presets.operator_rpm_limit`` rounds it
    (chapter 1 uses the same function)."""
    from .presets import operator_rpm_limit as limit
    return int(limit(scenario))


def _rpm_params(scenario: Scenario) -> dict:
    return {"limit": operator_rpm_limit(scenario)}


def _derived_vtc_params(scenario: Scenario) -> dict:
    eng = scenario.engine
    return {"wp": 1.0, "wq": float(eng.exchange_rate(eng.max_batch))}


def _slot_cap_params(scenario: Scenario) -> dict:
    return {"cap": scenario.engine.max_batch // len(scenario.tenants)}


def reference_policies() -> list:
    """The nine policies of the reference grid, as :class:`PolicySpec` objects (labels):
    ``fcfs``; ``rpm_quota`` (limit: :func:`operator_rpm_limit`); ``vtc`` (wp 1, wq 2, the
    shipped weights); ``vtc_derived`` (wp 1, wq = the machine's exchange rate at max_batch,
    15.4167 for seed 000); ``lcf``; ``residency`` (charge dt/B); ``slot_cap`` (cap =
    max_batch / n = 6); ``rr`` (round robin by request); ``vtc_predict`` (wp 1, wq 2, window 5)."""
    return [
        PolicySpec("fcfs", "fcfs"),
        PolicySpec("rpm_quota", "rpm_quota", _rpm_params),
        PolicySpec("vtc", "vtc", {"wp": 1.0, "wq": 2.0}),
        PolicySpec("vtc_derived", "vtc", _derived_vtc_params),
        PolicySpec("lcf", "lcf", {"wp": 1.0, "wq": 2.0}),
        PolicySpec("residency", "residency"),
        PolicySpec("slot_cap", "slot_cap", _slot_cap_params),
        PolicySpec("rr", "rr"),
        PolicySpec("vtc_predict", "vtc_predict", {"wp": 1.0, "wq": 2.0, "window": 5}),
    ]


def reference_grid() -> dict:
    """The reference grid: 12 floods x 12 spreads x 12 seeds = 1,728 configurations of the
    seed-000 scenario (120 s), times the nine :func:`reference_policies`: 15,552 runs.
    Returns the keyword arguments of :func:`sweep` (``build``, ``grid``, ``seeds``, ``policies``).

    The flooded tenant is the agent (index 3, :data:`FLOOD_TENANT`): flooding it reproduces the
    published flood sweep (means over the 12 seeds at the seed's spread: FCFS max/min 1.20 at
    k = 1 to 6.88 at k = 6.5, published 1.17 -> 7.00; FCFS crosses VTC at k = 2.87, published
    ~3.3). Flooding classify (index 0) overshoots: FCFS reaches 7.71 at k = 6.5 and crosses VTC
    at k = 2.45, outside the published figure's tolerance."""
    return {"build": grid_scenario, "grid": {"flood": list(REFERENCE_FLOODS), "spread": list(REFERENCE_SPREADS)},
            "seeds": list(REFERENCE_SEEDS), "policies": reference_policies()}


def run_reference_grid(executor=None, max_workers=None, progress=None, chunk_runs=None, **overrides) -> pd.DataFrame:
    """Run :func:`reference_grid` (``overrides`` replace its entries: e.g. ``seeds=[0]``)."""
    spec = {**reference_grid(), **overrides}
    return sweep(spec.pop("build"), spec.pop("grid"), spec.pop("policies"), spec.pop("seeds"),
                 executor=executor, max_workers=max_workers, progress=progress, chunk_runs=chunk_runs, **spec)


# --- saving and loading ---------------------------------------------------------------------
def _git_commit(root: Path) -> tuple:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip() != ""
        return head or None, dirty
    except (OSError, subprocess.SubprocessError):
        return None, None


def save_grid(table: pd.DataFrame, path: Union[str, Path] = GRID_FILE, meta: Optional[dict] = None) -> Path:
    """Write the table as gzip CSV (floats with 17 significant digits: an exact round trip) and a
    JSON sidecar (``<path minus .csv.gz>.json``) with the column dtypes and the code version that
    made it: fairlib.__version__, the git commit (and whether tracked files had uncommitted
    changes), the date, and ``meta`` (parameters, wall time...). :func:`load_grid` reads both."""
    from . import __version__
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # mtime=0 in the gzip header: the same table gives the same bytes
    import gzip
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
        gz.write(table.to_csv(index=False, float_format="%.17g", lineterminator="\n").encode())
    commit, dirty = _git_commit(Path(__file__).resolve().parent.parent)
    sidecar = {
        "file": path.name, "rows": int(len(table)), "columns": list(table.columns),
        "dtypes": {c: str(t) for c, t in table.dtypes.items()},
        "fairlib_version": __version__, "git_commit": commit, "git_dirty": dirty,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **(meta or {}),
    }
    side = _sidecar_path(path)
    side.write_text(json.dumps(sidecar, indent=2, default=str) + "\n")
    return path


def _sidecar_path(path: Path) -> Path:
    name = path.name
    for suffix in (".csv.gz", ".csv"):
        if name.endswith(suffix):
            return path.with_name(name[: -len(suffix)] + ".json")
    return path.with_suffix(".json")


def load_grid(path: Union[str, Path] = GRID_FILE, with_meta: bool = False):
    """The saved grid table (and its sidecar dict when ``with_meta``)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no saved grid; run `python benchmarks/grid.py` (or "
                                f"fairlib.sweep.run_reference_grid() and save_grid()) to make it")
    table = pd.read_csv(path)
    side = _sidecar_path(path)
    meta = json.loads(side.read_text()) if side.exists() else {}
    for col, dtype in meta.get("dtypes", {}).items():   # "1" was written for 1.0: restore float64
        if col in table.columns and dtype in ("float64", "int64", "bool") and str(table[col].dtype) != dtype:
            table[col] = table[col].astype(dtype)
    return (table, meta) if with_meta else table
