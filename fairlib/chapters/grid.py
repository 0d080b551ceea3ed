"""The book's reference grid (chapters 2-4): seed 000 under floods and output-length spreads.

    table = grid.run_reference_grid()      # 12 floods x 12 spreads x 12 seeds x 9 policies
    table = grid.load_grid()               # ... or the saved one (data/grid_seed000.csv.gz)

``grid_scenario(flood, spread)`` is seed 000 with one tenant's offered load multiplied by
``flood`` and the four mean output lengths spread geometrically by ``spread``
(``fairlib.chapters.presets.spread_means``); the policies (``reference_policies``) include the
operator's equal request quota and VTC with derived weights. The saved table carries a sidecar
with the fairlib version and git commit that made it; the chapters recompute a slice and compare
it exactly.
"""
from __future__ import annotations

import gzip
import json
import math
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, Union

import pandas as pd

from fairlib import __version__
from fairlib.chapters.presets import SEED000_OUTPUT_MEANS, seed000
from fairlib.chapters.presets import operator_rpm_limit as limit
from fairlib.paths import data_dir, repo_root
from fairlib.sweep import PolicySpec, sweep
from fairlib.workload import Scenario

__all__ = ["DATA_DIR", "GRID_FILE", "SEED000_SPREAD", "REFERENCE_FLOODS", "REFERENCE_SPREADS",
           "REFERENCE_SEEDS", "FLOOD_TENANT", "grid_scenario", "operator_rpm_limit",
           "reference_policies", "reference_grid", "run_reference_grid", "save_grid", "load_grid"]



DATA_DIR = data_dir()


GRID_FILE = DATA_DIR / "grid_seed000.csv.gz"


# --- the reference grid (chapter 3) -------------------------------------------------------
#: The seed's own output-length spread: longest / shortest mean output (353.8 / 23.7 = 14.93).
SEED000_SPREAD = max(SEED000_OUTPUT_MEANS) / min(SEED000_OUTPUT_MEANS)


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
    if spread is not None and math.isclose(spread, SEED000_SPREAD, rel_tol=1e-12):
        spread = None
    return seed000(flood=flood, flood_tenant=flood_tenant, spread=spread, duration_s=duration_s)


def operator_rpm_limit(scenario: Scenario) -> int:
    """The equal requests/min quota an operator would set for ``scenario``: the machine's
    capacity in requests/min split equally, ``60000 / sum_i cost_i`` (``cost_i``: the mean
    request of tenant i at ``max_batch``), as ``presets.operator_rpm_limit`` rounds it
    (chapter 1 uses the same function)."""
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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # mtime=0 in the gzip header: the same table gives the same bytes
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
        gz.write(table.to_csv(index=False, float_format="%.17g", lineterminator="\n").encode())
    commit, dirty = _git_commit(repo_root())
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
                                f"fairlib.chapters.grid.run_reference_grid() and save_grid()) to make it")
    table = pd.read_csv(path)
    side = _sidecar_path(path)
    meta = json.loads(side.read_text()) if side.exists() else {}
    for col, dtype in meta.get("dtypes", {}).items():   # "1" was written for 1.0: restore float64
        if col in table.columns and dtype in ("float64", "int64", "bool") and str(table[col].dtype) != dtype:
            table[col] = table[col].astype(dtype)
    return (table, meta) if with_meta else table
