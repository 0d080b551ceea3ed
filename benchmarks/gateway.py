"""What does the fairness gateway add to a stream, and how many streams per second does one core hold?

The load generator's protocol (benchmarks/loadgen.py): constant-rate arrivals of 32-word prompts
with 16-token outputs from a stub that streams one token per chunk (TTFT 20 ms, ITL 5 ms). Each
rate is sent twice in one invocation, interleaved: to the stub directly, and through ``fairlib
gateway`` (FCFS, slots enough that nobody waits, so what is measured is the proxy's cost, not a
queue). The gateway is pinned to one core, the stub and the client share the other (as in the
direct runs). Per rate: the client's TTFT p50/p99 and inter-token p99 on each path and the
differences (gateway minus direct: what the gateway adds), the client's schedule lag, and whether
the rate holds: every request answered, the client itself keeping up (achieved >= 99% of the
rate, p99 schedule lag <= 5 ms on both paths) and added p99 TTFT <= 5 ms. The highest holding
rate is the result (median over ``--repeats`` ramps); ``--policy vtc`` measures another policy.

    python benchmarks/gateway.py                        # 100 ... 1000 streams/s, 5 s each, 2 repeats
    python benchmarks/gateway.py --rates 250,500 --repeats 1 --policy vtc
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import loadgen  # noqa: E402  (the stub and its start/stop, benchmarks/loadgen.py)

RATES = "100,250,500,750,1000,1250"
ADDED_TTFT_P99_MS = 5.0


def trial_main(a) -> int:
    """One client run at one rate (a fresh process, pinned): its latency figures as a ROW line."""
    import numpy as np
    import pandas as pd

    from fairlib.client import EndpointConfig, build_schedule, load_records, run
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
    n = max(2, int(round(a.rate * a.duration_s)))
    df = pd.DataFrame({"arrival_ms": [1e3 * i / a.rate for i in range(n)], "tenant": [i % 4 for i in range(n)],
                       "prompt_tokens": 32, "output_tokens": a.output_tokens})
    sched = build_schedule(df, seed=0, tenant_names=["t0", "t1", "t2", "t3"])
    cfg = EndpointConfig(base_url=a.url, model="stub", timeout_s=60, tenant_header="x-llm-d-inference-fairness-id")
    with tempfile.TemporaryDirectory() as tmp:
        s = run(sched, cfg, Path(tmp) / "r", lag_threshold_ms=loadgen.LAG_P99_MS, scrape_metrics=False,
                collect_env=False, overwrite=True)
        rec = load_records(Path(tmp) / "r")
    ok = (rec["error_class"] == "none").to_numpy()
    ttft = (rec["first_token_s"] - rec["actual_send_s"]).to_numpy(float)[ok] * 1e3
    gaps = np.concatenate([np.diff(np.asarray(c, float)) for c in rec["chunk_times_s"][ok] if c is not None
                           and len(c) > 1]) * 1e3
    lag = s["schedule_lag_ms"]
    row = {"rate_rps": a.rate, "requests": s["n_planned"], "ok": int(ok.sum()), "achieved_rps": s["achieved_rate_rps"],
           "lag_p99_ms": lag["p99"], "ttft_p50_ms": float(np.percentile(ttft, 50)),
           "ttft_p99_ms": float(np.percentile(ttft, 99)), "itl_p50_ms": float(np.percentile(gaps, 50)),
           "itl_p99_ms": float(np.percentile(gaps, 99)),
           "span_s": float(rec["end_s"].to_numpy(float)[ok].max() - rec["actual_send_s"].to_numpy(float)[ok].min()),
           "output_tokens": int(rec["completion_tokens"].to_numpy()[ok].sum())}
    row["client_ok"] = bool(row["ok"] == row["requests"] and (row["achieved_rps"] or 0) >= loadgen.MIN_ACHIEVED * a.rate
                            and lag["p99"] is not None and lag["p99"] <= loadgen.LAG_P99_MS)
    print("ROW " + json.dumps(row), flush=True)
    return 0


def run_trial(url, rate, a, cpu) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "trial", "--url", url, "--rate", str(rate),
           "--duration-s", str(a.duration_s)] + (["--cpu", str(cpu)] if cpu is not None else [])
    env = dict(os.environ, NUMBA_CACHE_DIR=os.environ.get("NUMBA_CACHE_DIR", str(ROOT / ".cache" / "numba")))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.duration_s * 10 + 120)
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("ROW ")]
    if p.returncode != 0 or not rows:
        raise RuntimeError(f"trial failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(rows[-1][4:])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["trial"]:
        p = argparse.ArgumentParser(prog="gateway.py trial")
        p.add_argument("--url", required=True)
        p.add_argument("--rate", type=float, required=True)
        p.add_argument("--duration-s", type=float, default=5.0)
        p.add_argument("--cpu", type=int)
        p.add_argument("--output-tokens", type=int, default=16)
        return trial_main(p.parse_args(argv[1:]))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration-s", type=float, default=5.0)
    p.add_argument("--rates", default=RATES)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--policy", default="fcfs")
    p.add_argument("--out", help="also write the rows as JSON here")
    a = p.parse_args(argv)
    from fairlib.gateway import GatewayProcess

    rates = [float(x) for x in a.rates.split(",")]
    pin = len(os.sched_getaffinity(0)) >= 2
    client_cpu, gw_cpu = (0, 1) if pin else (None, None)
    load0, t0 = os.getloadavg(), time.time()
    stub, stub_url = loadgen.start_stub(cpu=client_cpu)
    gw = GatewayProcess(["--upstream", stub_url, "--policy", a.policy, "--max-inflight", "4096", "--no-events",
                         "--access-log", "off"],
                        cpu=gw_cpu).start()
    rows, best = [], []
    try:
        for rep in range(a.repeats):
            held = 0.0
            for r in rates:
                pair = {}
                for path in (("direct", "gateway") if rep % 2 == 0 else ("gateway", "direct")):
                    pair[path] = run_trial(stub_url if path == "direct" else gw.base_url, r, a, client_cpu)
                d, g = pair["direct"], pair["gateway"]
                row = {"repeat": rep, "rate_rps": r, "direct": d, "gateway": g,
                       "added_ttft_p50_ms": g["ttft_p50_ms"] - d["ttft_p50_ms"],
                       "added_ttft_p99_ms": g["ttft_p99_ms"] - d["ttft_p99_ms"],
                       "added_itl_p99_ms": g["itl_p99_ms"] - d["itl_p99_ms"]}
                row["holds"] = bool(d["client_ok"] and g["client_ok"] and row["added_ttft_p99_ms"] <= ADDED_TTFT_P99_MS)
                row["client_limited"] = not (d["client_ok"] and g["client_ok"])
                rows.append(row)
                print(f"repeat {rep + 1} rate {r:6.0f}/s  added TTFT p50 {row['added_ttft_p50_ms']:6.2f} ms  "
                      f"p99 {row['added_ttft_p99_ms']:6.2f} ms  added ITL p99 {row['added_itl_p99_ms']:6.2f} ms  "
                      f"TTFT p50 direct {d['ttft_p50_ms']:.2f} / gateway {g['ttft_p50_ms']:.2f}  "
                      f"lag p99 {d['lag_p99_ms']:.2f} / {g['lag_p99_ms']:.2f}  ok {g['ok']}/{g['requests']}  "
                      f"{'holds' if row['holds'] else 'FAILS'}{' (client limited)' if row['client_limited'] else ''}",
                      flush=True)
                if not row["holds"]:
                    break
                held = r
            best.append(held)
    finally:
        gw.stop()
        loadgen.stop_stub(stub)
    load1 = os.getloadavg()
    print(f"\n16-token streams one token per chunk from a stub (TTFT 20 ms, ITL 5 ms), {a.duration_s:g} s per rate; "
          f"gateway ({a.policy}) on CPU {gw_cpu}, stub and client on CPU {client_cpu}; a rate holds when every "
          f"request is answered, the client keeps up on both paths and the added p99 TTFT <= {ADDED_TTFT_P99_MS:g} ms")
    print(f"highest holding rate per repeat {[int(b) for b in best]}, median {statistics.median(best):g} streams/s")
    print(f"load average (1 min) {load0[0]:.2f} at start, {load1[0]:.2f} at end ({time.time() - t0:.0f} s); "
          f"{os.cpu_count()} CPUs")
    if a.out:
        Path(a.out).write_text(json.dumps({"best": best, "rows": rows, "policy": a.policy,
                                           "loadavg_start": load0, "loadavg_end": load1}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
