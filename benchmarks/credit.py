"""The gateway's in-flight cap fixed at 16 (the old default) against ``--max-inflight auto`` (the
credit learned from the engine, fairlib/sim/credit.py), side by side in one run, on engines whose
batch differs from 16: ``fairlib serve`` with ``max_batch`` 40 and 8.

Per engine and setup: a fresh ``fairlib serve`` and a fresh ``fairlib gateway`` (policy ``vtc``,
two tenants), a heavy tenant backlogging it (``3 x max_batch`` clients in a closed loop, outputs of
32..96 tokens) and a victim sending one short request (16 tokens) every ``1 / --victim-rps``
seconds, open loop. After ``--warmup-s`` (the credit settles) the measured window of
``--duration-s``: output tokens per second of both tenants (the engine's throughput through the
gateway) and the victim's TTFT p99. The ratios are auto / fixed: throughput above 1 where the
fixed cap idled slots (max_batch 40), the victim's p99 below 1 where the fixed cap let the heavy
tenant queue inside the engine, in the engine's order, not the policy's (max_batch 8).

    python benchmarks/credit.py                              # max_batch 40 and 8, 20 s each
    python benchmarks/credit.py --batches 40 --duration-s 10 --out credit.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FID = "x-llm-d-inference-fairness-id"


async def _one(sess, url: str, tenant: str, n: int, ttfts: list, tokens: list, t_end: list) -> None:
    body = json.dumps({"model": "sim-model", "prompt": list(range(16)), "max_tokens": n, "ignore_eos": True,
                       "stream": True}).encode()
    t0 = time.perf_counter()
    first = None
    got = 0

    def on_data(chunk: bytes, t: float):
        nonlocal first, got
        k = chunk.count(b'"text"')
        if k and first is None:
            first = t
        got += k
    async with sess.post(url + "/completions", data=body,
                         headers={"Content-Type": "application/json", FID: tenant}) as r:
        if r.status != 200:
            raise RuntimeError(f"{tenant}: HTTP {r.status}: {(await r.read(4096))[:200]!r}")
        await r.stream(on_data)
    if first is not None:
        ttfts.append((t0, first - t0))
    tokens.append((time.perf_counter(), got))


async def _load(url: str, max_batch: int, victim_rps: float, warmup_s: float, duration_s: float) -> dict:
    from fairlib.client.http1 import HttpSession
    sess = HttpSession(timeout_s=300.0, connect_timeout_s=5.0)
    heavy_ttft, victim_ttft, tokens = [], [], []
    t_start = time.perf_counter()
    t_stop = t_start + warmup_s + duration_s

    async def heavy(i):
        k = 0
        while time.perf_counter() < t_stop:
            k += 1
            await _one(sess, url, "heavy", 32 + (7 * k + 13 * i) % 65, heavy_ttft, tokens, [])

    async def victim():
        tasks, t = [], t_start
        while t < t_stop:
            await asyncio.sleep(max(0.0, t - time.perf_counter()))
            tasks.append(asyncio.ensure_future(_one(sess, url, "victim", 16, victim_ttft, tokens, [])))
            t += 1.0 / victim_rps
        await asyncio.gather(*tasks)
    try:
        await asyncio.gather(victim(), *(heavy(i) for i in range(3 * max_batch)))
    finally:
        await sess.close()
    lo, hi = t_start + warmup_s, t_start + warmup_s + duration_s
    toks = sum(n for t, n in tokens if lo <= t < hi)
    v = np.array([d for t, d in victim_ttft if lo <= t < hi]) * 1e3
    return {"tokens_per_s": toks / duration_s, "victim_ttft_p99_ms": float(np.percentile(v, 99)),
            "victim_ttft_p50_ms": float(np.percentile(v, 50)), "victim_requests": int(v.size)}


def run_setup(max_batch: int, inflight: str, a, extra=()) -> dict:
    from fairlib.gateway import GatewayProcess
    from fairlib.serve import ServerProcess
    serve = ["--max-batch", str(max_batch), "--iter-base-ms", str(a.iter_base_ms), "--iter-slope-ms",
             str(a.iter_slope_ms), "--model", "sim-model"]
    with ServerProcess(serve, cpu=0 if a.pin else None) as srv, \
            GatewayProcess(["--upstream", srv.base_url, "--policy", a.policy, "--max-inflight", inflight,
                            "--no-events", *extra], cpu=1 if a.pin else None) as gw:
        res = asyncio.run(_load(gw.base_url, max_batch, a.victim_rps, a.warmup_s, a.duration_s))
        res["credit"] = gw.state()["upstreams"][0]["max_inflight"]
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="40,8", help="fairlib serve's max_batch, one setup pair each")
    p.add_argument("--fixed", default="16", help="the fixed cap compared with auto (default 16)")
    p.add_argument("--headrooms", default="1", help="auto's --credit-headroom values, one setup each (default 1)")
    p.add_argument("--policy", default="vtc")
    p.add_argument("--iter-base-ms", type=float, default=20.0)
    p.add_argument("--iter-slope-ms", type=float, default=0.5)
    p.add_argument("--victim-rps", type=float, default=4.0)
    p.add_argument("--warmup-s", type=float, default=10.0)
    p.add_argument("--duration-s", type=float, default=20.0)
    p.add_argument("--out", help="also write the rows as JSON here")
    a = p.parse_args(argv)
    import os
    a.pin = len(os.sched_getaffinity(0)) >= 2
    rows = []
    for m in (int(x) for x in a.batches.split(",")):
        fixed = run_setup(m, a.fixed, a)
        print(f"max_batch {m:3d}: fixed {a.fixed}: {fixed['tokens_per_s']:7.0f} tok/s, victim TTFT p50 "
              f"{fixed['victim_ttft_p50_ms']:6.1f} p99 {fixed['victim_ttft_p99_ms']:7.1f} ms", flush=True)
        for h in (int(x) for x in a.headrooms.split(",")):
            auto = run_setup(m, "auto", a, ("--credit-headroom", str(h)))
            row = {"max_batch": m, "headroom": h, "fixed": fixed, "auto": auto,
                   "throughput_ratio": auto["tokens_per_s"] / fixed["tokens_per_s"],
                   "victim_ttft_p99_ratio": auto["victim_ttft_p99_ms"] / fixed["victim_ttft_p99_ms"]}
            rows.append(row)
            print(f"max_batch {m:3d}: auto h={h} (credit {auto['credit']}): {auto['tokens_per_s']:7.0f} tok/s, victim "
                  f"TTFT p50 {auto['victim_ttft_p50_ms']:6.1f} p99 {auto['victim_ttft_p99_ms']:7.1f} ms | throughput "
                  f"{row['throughput_ratio']:.2f}x, victim p99 {row['victim_ttft_p99_ratio']:.2f}x", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
