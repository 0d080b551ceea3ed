"""How fast can fairlib's load generator send, open loop, on this machine?

Against ``fairlib serve`` with a fast engine (iter_base 1 ms, no per-sequence or prefill cost,
max_batch 256: the server is not the bottleneck for short streams), send Poisson arrivals of
short requests (8 prompt words, 4 output tokens, 4 tenants) for ``--duration-s`` at increasing
rates, with 1 and 2 client processes, and find the highest rate whose p99 schedule lag (actual
minus intended send time) stays within 5 ms with every request answered. Also reports the
client's CPU per request (process CPU time, parent + workers, over requests sent) and the
server's, and the achieved send rate.

Client and server share this machine's cores (two here), so the numbers are this machine's, not
the client's alone: a faster server or a separate machine would raise them.

    python benchmarks/loadgen.py                       # 10 s per rate, workers 1 and 2
    python benchmarks/loadgen.py --duration-s 5 --rates 100,200,400 --workers 1 --out loadgen.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fairlib.client import EndpointConfig, build_schedule, run  # noqa: E402
from fairlib.serve import ServerProcess  # noqa: E402

LAG_P99_MS = 5.0
SERVER_ARGS = ["--iter-base-ms", 1.0, "--iter-slope-ms", 0.0, "--prefill-ms-per-token", 0.0, "--max-batch", 256, "--spin-ms", 0,
               "--tenants", 8]


def schedule_for(rate: float, duration_s: float, seed: int = 0):
    rng = np.random.default_rng([seed, int(rate * 1000)])
    n = max(2, int(rng.poisson(rate * duration_s)))
    arrivals = np.sort(rng.uniform(0.0, duration_s * 1e3, n))
    df = pd.DataFrame({"arrival_ms": arrivals, "tenant": np.arange(n) % 4, "prompt_tokens": 8, "output_tokens": 4})
    return build_schedule(df, seed=seed)


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process from /proc (Linux); NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return math.nan


def client_cpu_s() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def one_rate(srv, rate: float, workers: int, duration_s: float, tmp: Path) -> dict:
    sched = schedule_for(rate, duration_s)
    cfg = EndpointConfig(base_url=srv.base_url, model="fairlib-sim", timeout_s=60)
    out = tmp / f"r{rate:g}-w{workers}"
    srv_cpu0, cli_cpu0 = proc_cpu_s(srv.proc.pid), client_cpu_s()
    s = run(sched, cfg, out, workers=workers, lag_threshold_ms=LAG_P99_MS, scrape_metrics=False,
            collect_env=False, overwrite=True)
    srv_cpu, cli_cpu = proc_cpu_s(srv.proc.pid) - srv_cpu0, client_cpu_s() - cli_cpu0
    lag = s["schedule_lag_ms"]
    n_sent = max(s["n_sent"], 1)
    ok = s["n_ok"] == s["n_planned"] and lag["p99"] is not None and lag["p99"] <= LAG_P99_MS
    return {"workers": workers, "rate_rps": rate, "requests": s["n_planned"], "ok": s["n_ok"],
            "lag_p50_ms": lag["p50"], "lag_p99_ms": lag["p99"], "lag_max_ms": lag["max"],
            "requested_rps": s["requested_rate_rps"], "achieved_rps": s["achieved_rate_rps"],
            "client_cpu_ms_per_request": 1e3 * cli_cpu / n_sent,
            "client_cpu_util": cli_cpu / max(s["duration_s"] or duration_s, 1e-9),
            "server_cpu_ms_per_request": 1e3 * srv_cpu / n_sent,
            "sustained": bool(ok)}


def sweep(srv, workers: int, rates, duration_s: float, tmp: Path, refine: int, log) -> list:
    rows, best, fail = [], None, None
    rates = list(rates)
    while rates:
        r = rates.pop(0)
        row = one_rate(srv, r, workers, duration_s, tmp)
        rows.append(row)
        log(row)
        if row["sustained"]:
            best = r
            if not rates and r < 100_000:
                rates.append(2 * r)   # past the list: keep doubling until the client falls behind
        else:
            fail = r
            break
    for _ in range(refine if best is not None and fail is not None else 0):
        mid = round(math.sqrt(best * fail))
        if mid in (best, fail):
            break
        row = one_rate(srv, mid, workers, duration_s, tmp)
        rows.append(row)
        log(row)
        best, fail = (mid, fail) if row["sustained"] else (best, mid)
    return rows


def fmt(v, d=2):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else (f"{v:.{d}f}" if isinstance(v, float) else str(v))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration-s", type=float, default=10.0)
    p.add_argument("--rates", default="50,100,200,400,800,1600,3200")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--refine", type=int, default=2, help="bisection steps between the last sustained and first failed rate")
    p.add_argument("--out", help="also write the rows as JSON here")
    a = p.parse_args(argv)
    rates = [float(x) for x in a.rates.split(",")]
    header = ("workers", "rate_rps", "requests", "ok", "lag_p50_ms", "lag_p99_ms", "achieved_rps",
              "client_cpu_ms_per_request", "server_cpu_ms_per_request", "sustained")

    def log(row):
        print("  " + "  ".join(f"{k}={fmt(row[k])}" for k in header), flush=True)

    results = {}
    t0 = time.time()
    load0 = os.getloadavg()
    with ServerProcess(SERVER_ARGS) as srv, tempfile.TemporaryDirectory() as tmp:
        for w in [int(x) for x in a.workers.split(",")]:
            print(f"workers={w}", flush=True)
            results[w] = sweep(srv, w, rates, a.duration_s, Path(tmp), a.refine, log)
        server_stats = srv.stats()
    print()
    print(f"fairlib load generator vs fairlib serve (iter_base 1 ms, max_batch 256), Poisson arrivals, "
          f"8-word prompts, 4 output tokens, {a.duration_s:g} s per rate, {os.cpu_count()} CPUs; "
          f"sustained = every request answered and p99 schedule lag <= {LAG_P99_MS:g} ms")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for w, rows in results.items():
        for row in sorted(rows, key=lambda r: r["rate_rps"]):
            print("| " + " | ".join(fmt(row[k]) for k in header) + " |")
    print()
    summary = {}
    for w, rows in results.items():
        good = [r for r in rows if r["sustained"]]
        best = max(good, key=lambda r: r["rate_rps"]) if good else None
        # marginal client CPU per request: the slope of CPU time against requests over the rates tried
        # (excludes fixed costs such as starting worker processes)
        n = np.array([r["requests"] for r in rows], float)
        cpu = np.array([r["client_cpu_ms_per_request"] * r["requests"] for r in rows], float)
        marginal = float(np.polyfit(n, cpu, 1)[0]) if len(rows) >= 2 and np.ptp(n) > 0 else None
        summary[w] = {"best": best, "client_cpu_ms_per_request_marginal": marginal}
        if best:
            print(f"workers={w}: highest sustained rate {best['rate_rps']:g} requests/s (p99 lag "
                  f"{best['lag_p99_ms']:.2f} ms, achieved {best['achieved_rps']:.1f} req/s); client CPU "
                  f"{best['client_cpu_ms_per_request']:.2f} ms/request at that rate ({fmt(marginal)} ms/request "
                  f"marginal over the sweep), server CPU {best['server_cpu_ms_per_request']:.2f} ms/request")
        else:
            print(f"workers={w}: no rate sustained (client CPU {fmt(marginal)} ms/request marginal)")
    print(f"load average (1 min) at start {load0[0]:.2f}, at end {os.getloadavg()[0]:.2f}: other work on this "
          f"machine competes with client and server")
    lag = server_stats["emission_lag_ms"]
    print(f"server timing error over the whole benchmark: emission lag p50 {fmt(lag.get('p50'), 3)} ms, "
          f"p99 {fmt(lag.get('p99'), 3)} ms, max {fmt(lag.get('max'), 3)} ms ({time.time() - t0:.0f} s in all)")
    if a.out:
        Path(a.out).write_text(json.dumps({"rows": results, "best": summary, "server_emission_lag_ms": lag,
                                           "duration_s": a.duration_s, "cpus": os.cpu_count(),
                                           "loadavg_start": load0, "loadavg_end": os.getloadavg(),
                                           "lag_p99_threshold_ms": LAG_P99_MS}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
