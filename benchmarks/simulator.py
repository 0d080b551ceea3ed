"""Simulator speed: one 120-s seed-000 run per policy, against the plain-Python reference
(tests/reference_sim.py) timed in the same process: the compiled kernel alone (state built from a
validated table, then the run), ``fairlib.simulate()`` end to end (validation, run, result; its
tables are built when first read), and ``simulate()`` with both result tables read. Compile time
is measured separately in a fresh process with an empty numba cache.

    python benchmarks/simulator.py [--repeats N] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import fairlib  # noqa: E402
from fairlib.chapters import presets  # noqa: E402
from fairlib.sim.simulate import build_state, validate_requests  # noqa: E402
from fairlib.sim import loop  # noqa: E402
from fairlib.sim.state import DECODE_TOKENS, ITERATIONS  # noqa: E402
from reference_sim import reference_simulate  # noqa: E402

POLICIES = {"fcfs": {}, "rpm_quota": {"limit": 100}, "vtc": {}, "lcf": {}, "residency": {}, "slot_cap": {"cap": 6},
            "priority": {}, "weighted": {"w": [5, 3, 2, 1]}, "sjf": {}, "aging": {"rate": 0.01}}


def compile_seconds() -> float:
    """Wall time of the first simulate() per policy in a fresh process with an empty cache."""
    code = ("import time, fairlib; from fairlib.chapters import presets\n"
            "df = presets.seed000(seed=0, duration_s=1).requests(0); df['klass'] = df['tenant']\n"
            f"P = {POLICIES!r}\n"
            "t = time.perf_counter()\n"
            "for name, kw in P.items(): fairlib.simulate(df, fairlib.SEED000_ENGINE, name, 1000.0, **kw)\n"
            "print(time.perf_counter() - t)")
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def read_tables(res):
    """Read both result tables (built on first read)."""
    return res.requests, res.tenants


def best_of(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-compile", action="store_true", help="skip the compile-time measurement")
    args = ap.parse_args(argv)

    df = presets.seed000(seed=0).requests(0)
    df["klass"] = df["tenant"]
    eng = fairlib.SEED000_ENGINE
    table, n_t = validate_requests(df)
    rows = []
    for name, kw in POLICIES.items():
        pol = fairlib.make_policy(name, **kw)
        res = fairlib.simulate(df, eng, name, 120_000.0, **kw)          # warm (compiled or cached)

        def kernel():
            S, pf, pi = build_state(table, n_t, eng, pol)
            loop.run(S, eng.kernel_params(), pol.pid, pf, pi, 120_000.0)
            return S

        S = kernel()
        t_kernel = best_of(kernel, args.repeats)
        t_sim = best_of(lambda: fairlib.simulate(df, eng, name, 120_000.0, **kw), args.repeats)
        t_tab = best_of(lambda: read_tables(fairlib.simulate(df, eng, name, 120_000.0, **kw)), args.repeats)
        t_ref = best_of(lambda: reference_simulate(df, n_tenants=4, iter_base_ms=eng.iter_base_ms,
                                                   iter_slope_ms=eng.iter_slope_ms,
                                                   prefill_ms_per_token=eng.prefill_ms_per_token,
                                                   max_batch=eng.max_batch, policy=name, horizon_ms=120_000.0, **kw),
                        max(1, args.repeats // 2))
        seq_iters = int(S.si[DECODE_TOKENS])
        rows.append({"policy": name, "iterations": int(S.si[ITERATIONS]), "seq_iterations": seq_iters,
                     "kernel_ms": t_kernel * 1e3, "simulate_ms": t_sim * 1e3, "tables_ms": t_tab * 1e3,
                     "reference_ms": t_ref * 1e3,
                     "ratio_kernel": t_ref / t_kernel, "ratio_simulate": t_ref / t_sim, "ratio_tables": t_ref / t_tab,
                     "seq_iter_per_s": seq_iters / t_kernel})
        assert abs(res.tenants["machine_ms"].sum() - res.run["busy_ms"]) <= 1e-9 * res.run["busy_ms"]
    print(f"{'policy':10s} {'iters':>6s} {'seq-iters':>9s} {'kernel ms':>9s} {'simulate ms':>11s} "
          f"{'+tables ms':>10s} {'reference ms':>12s} {'x kernel':>8s} {'x simulate':>10s} {'x +tables':>9s} "
          f"{'Mseq-it/s':>9s}")
    for r in rows:
        print(f"{r['policy']:10s} {r['iterations']:6d} {r['seq_iterations']:9d} {r['kernel_ms']:9.2f} "
              f"{r['simulate_ms']:11.2f} {r['tables_ms']:10.2f} {r['reference_ms']:12.1f} {r['ratio_kernel']:8.1f} "
              f"{r['ratio_simulate']:10.1f} {r['ratio_tables']:9.1f} {r['seq_iter_per_s'] / 1e6:9.1f}")
    summary = {"rows": rows}
    for key in ("kernel", "simulate", "tables"):
        summary[f"geomean_{key}"] = float(np.exp(np.log([r[f"ratio_{key}"] for r in rows]).mean()))
    print(f"geometric mean speed-up over the reference: kernel {summary['geomean_kernel']:.1f}x, "
          f"simulate() {summary['geomean_simulate']:.1f}x, simulate() + tables read {summary['geomean_tables']:.1f}x")
    if not args.no_compile:
        summary["compile_s"] = compile_seconds()
        print(f"compile (fresh process, empty cache, all policies): {summary['compile_s']:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
