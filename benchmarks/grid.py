"""Benchmark: the full reference grid (fairlib.chapters.grid.reference_grid: 12 floods x 12 spreads x
12 seeds = 1,728 configurations of the seed-000 scenario, 120 s each, x 9 policies = 15,552 runs),
then the plain-Python reference (tests/reference_sim.py) on a sample of the same runs, measured
in this process against the compiled lean path on the same runs.

    python benchmarks/grid.py                 # run, print, save data/grid_seed000.csv.gz + .json
    python benchmarks/grid.py --no-save       # only print
    python benchmarks/grid.py --seeds 2       # a smaller grid (first 2 seeds), not saved by default

Prints the wall time (warm: the kernel is loaded before the clock starts), runs/s, and the
reference ratio (reference time / compiled time per run on the sample).
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".cache" / "numba"))

import fairlib  # noqa: E402
from fairlib import sweep  # noqa: E402
from fairlib.chapters import grid
from fairlib.sim import loop  # noqa: E402
from fairlib.sim.policies import make_policy  # noqa: E402
from fairlib.sim.simulate import RequestArrays  # noqa: E402


def sample_runs(spec, k, seed=0):
    """k runs of the grid, drawn without replacement (deterministic): (point, seed, PolicySpec)."""
    keys = list(spec["grid"])
    import itertools
    configs = [(dict(zip(keys, vals)), s) for vals in itertools.product(*spec["grid"].values()) for s in spec["seeds"]]
    runs = [(c, p) for c in configs for p in spec["policies"]]
    idx = np.random.default_rng(seed).choice(len(runs), size=min(k, len(runs)), replace=False)
    return [(runs[i][0][0], runs[i][0][1], runs[i][1]) for i in sorted(idx)]


def compare_reference(spec, k):
    """Time the plain-Python reference and the compiled lean path on the same k runs; check that
    they agree (machine shares to rtol 1e-9). Returns (ref_s, compiled_s, max_rel_diff)."""
    from reference_sim import reference_simulate
    ref_s = comp_s = 0.0
    worst = 0.0
    for point, seed, ps in sample_runs(spec, k):
        sc = spec["build"](**point)
        df = sc.requests(seed)
        params = ps.resolve(sc)
        eng = sc.engine
        h = sc.duration_s * 1000.0
        names = list(sc.tenant_names)
        table = RequestArrays(df, len(names))
        pol = make_policy(ps.name, **params)
        t0 = time.perf_counter()
        S, pf, pi = table.state(eng, pol)
        loop.run(S, eng.kernel_params(), pol.pid, pf, pi, h)
        row = sweep.summarize_state(S, table.n, names, pol.counters(pf, len(names)))
        t1 = time.perf_counter()
        _, ten, _ = reference_simulate(df, n_tenants=len(names), iter_base_ms=eng.iter_base_ms,
                                       iter_slope_ms=eng.iter_slope_ms, prefill_ms_per_token=eng.prefill_ms_per_token,
                                       max_batch=eng.max_batch, policy=ps.name, horizon_ms=h, **params)
        t2 = time.perf_counter()
        comp_s += t1 - t0
        ref_s += t2 - t1
        mine = np.array([row[f"share_{n}"] for n in names])
        worst = max(worst, float(np.max(np.abs(mine - np.array(ten["share"])) / np.abs(np.array(ten["share"])))))
    return ref_s, comp_s, worst


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=None, help="process-pool workers (default: os.cpu_count())")
    ap.add_argument("--seeds", type=int, default=None, help="use only the first N seeds (a smaller grid)")
    ap.add_argument("--sample", type=int, default=20, help="runs timed against the plain-Python reference")
    ap.add_argument("--out", default=str(grid.GRID_FILE), help="where to save the table (.csv.gz)")
    ap.add_argument("--save", dest="save", action="store_true", default=None, help="save the table")
    ap.add_argument("--no-save", dest="save", action="store_false", help="do not save the table")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)

    spec = grid.reference_grid()
    if args.seeds is not None:
        spec["seeds"] = spec["seeds"][: args.seeds]
    save = args.save if args.save is not None else args.seeds is None
    n_configs = len(spec["grid"]["flood"]) * len(spec["grid"]["spread"]) * len(spec["seeds"])
    n_runs = n_configs * len(spec["policies"])
    workers = args.workers or os.cpu_count() or 1

    t0 = time.perf_counter()
    sweep._warm()
    warm_s = time.perf_counter() - t0
    print(f"fairlib {fairlib.__version__}; {os.cpu_count()} CPUs; kernel loaded in {warm_s:.1f} s")
    print(f"grid: {len(spec['grid']['flood'])} floods x {len(spec['grid']['spread'])} spreads x "
          f"{len(spec['seeds'])} seeds = {n_configs} configurations x {len(spec['policies'])} policies "
          f"= {n_runs} runs, {workers} worker(s)")

    def cpu():
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    c0, t0 = cpu(), time.perf_counter()
    table = sweep.sweep(spec["build"], spec["grid"], spec["policies"], spec["seeds"], max_workers=workers,
                        progress=False if args.no_progress else None)
    wall = time.perf_counter() - t0
    cpu_s = cpu() - c0          # this process and its (finished) workers
    load = os.getloadavg()[0]
    print(f"grid wall time: {wall:.1f} s  ({n_runs / wall:.0f} runs/s, {1000 * wall / n_runs:.2f} ms/run "
          f"wall); CPU time {cpu_s:.1f} s ({1000 * cpu_s / n_runs:.2f} ms/run), i.e. ~{cpu_s / workers:.1f} s "
          f"wall on {workers} idle cores; load average now {load:.1f}")

    ratio = None
    if args.sample > 0:
        ref_s, comp_s, worst = compare_reference(spec, args.sample)
        ratio = ref_s / comp_s
        print(f"plain-Python reference on {args.sample} runs of the grid: {ref_s:.1f} s "
              f"({ref_s / args.sample:.2f} s/run); compiled lean path on the same runs: {comp_s:.3f} s "
              f"({1000 * comp_s / args.sample:.2f} ms/run): ratio {ratio:.0f}x; "
              f"max relative share difference {worst:.1e}")
        print(f"the whole grid on the reference, one core, would take ~{ref_s / args.sample * n_runs / 3600:.1f} h")

    if save:
        meta = {
            "what": "fairlib.chapters.grid.reference_grid(): seed-000 scenario, flood x spread x seed x policy",
            "parameters": {
                "floods": list(spec["grid"]["flood"]), "spreads": list(spec["grid"]["spread"]),
                "seeds": list(spec["seeds"]), "flood_tenant": grid.FLOOD_TENANT,
                "flood_tenant_name": "agent" if grid.FLOOD_TENANT == 3 else str(grid.FLOOD_TENANT),
                "duration_s": 120.0, "horizon_ms": 120000.0,
                "policies": {p.label: {"name": p.name, "params": (p.params.__name__ if callable(p.params)
                                                                   else dict(p.params))}
                             for p in spec["policies"]},
                "policy_params_used": sorted(set(zip(table["policy"], table["policy_params"]))),
            },
            "benchmark": {"wall_s": round(wall, 3), "runs": n_runs, "runs_per_s": round(n_runs / wall, 1),
                          "cpu_s": round(cpu_s, 3), "load_average_1min": round(load, 2),
                          "workers": workers, "cpus": os.cpu_count(), "reference_sample_runs": args.sample,
                          "reference_ratio": None if ratio is None else round(ratio, 1),
                          "python": platform.python_version(), "numba": __import__("numba").__version__,
                          "machine": platform.machine()},
        }
        path = grid.save_grid(table, args.out, meta)
        print(f"saved {path} ({path.stat().st_size / 1e6:.1f} MB) and {grid._sidecar_path(path).name}")
    return table


if __name__ == "__main__":
    main()
