"""What does the gateway's access log add to a stream? Before/after in one run.

The protocol of benchmarks/gateway.py (its stub, its client trial, the same pinning): at each rate
three paths are sent in turn, in an order that alternates per repeat: the stub directly, a
gateway with ``--access-log off`` (before: no line per request) and a gateway writing its JSON
line per request to a file (after). Per rate: the added TTFT p50 and p99 of each gateway (minus
direct) and the after/before ratio of the added p50 (issue 26: within 10%).

    python benchmarks/gateway_access_log.py                    # 100 and 250 streams/s, 5 s, 2 repeats
    python benchmarks/gateway_access_log.py --rates 250 --repeats 3
    python benchmarks/gateway_access_log.py --micro        # the CPU one line costs, in-process

The line is written after the answer's last byte (the handler's ``finally``), so it is never on
the path of that request's first token; what it can add to others is its CPU time, which
``--micro`` measures (on a machine too loaded for the end-to-end figures to mean anything).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gateway as bench  # noqa: E402  (benchmarks/gateway.py: the trial)
import loadgen  # noqa: E402


def micro(n: int = 100_000) -> dict:
    """The CPU time of one access-log line (the record built from a request's note, JSON-encoded
    and written to a file), median of 5 runs of ``n`` lines."""
    import asyncio
    import time

    from fairlib.gateway.access_log import GatewayLog, access_record
    from fairlib.gateway.core import Pending

    class Resp(dict):
        status = 200
        headers = {}

    class Gw:
        clock = staticmethod(time.perf_counter)

    loop = asyncio.new_event_loop()
    p = Pending(7, 0, 10.0, loop.create_future(), dispatched_ms=10.2, first_ms=31.0, counted=16)
    note = {"tenant": "t0", "api": "completions", "stream": True, "upstream": "http://127.0.0.1:8000/v1",
            "retried": False, "error": None, "prompt_tokens": 32, "p": p}
    with tempfile.TemporaryDirectory() as tmp:
        log = GatewayLog(str(Path(tmp) / "a.jsonl"))
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                log.access(access_record(Gw, note, Resp(), t0))
            times.append((time.perf_counter() - t0) / n * 1e6)
        log.close()
    loop.close()
    us = statistics.median(times)
    print(f"one access-log line: {us:.2f} us of CPU (median of 5 x {n}); against the gateway's added TTFT p50 of "
          f"0.5-1.4 ms (issue 26): {us / 500 * 100:.1f}% of 0.5 ms")
    return {"us_per_line": us}


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if "--micro" in argv:
        micro()
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration-s", type=float, default=5.0)
    p.add_argument("--rates", default="100,250")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", help="also write the rows as JSON here")
    a = p.parse_args(argv)
    from fairlib.gateway import GatewayProcess

    pin = len(os.sched_getaffinity(0)) >= 2
    client_cpu, gw_cpu = (0, 1) if pin else (None, None)
    stub, stub_url = loadgen.start_stub(cpu=client_cpu)
    tmp = tempfile.TemporaryDirectory()
    log = Path(tmp.name) / "access.jsonl"
    common = ["--upstream", stub_url, "--max-inflight", "4096", "--tenant-max-share", "1"]
    gws = {"before": GatewayProcess(common + ["--access-log", "off"], cpu=gw_cpu).start(),
           "after": GatewayProcess(common + ["--access-log", str(log)], cpu=gw_cpu).start()}
    rows = []
    try:
        for rep in range(a.repeats):
            for r in [float(x) for x in a.rates.split(",")]:
                order = ("direct", "before", "after") if rep % 2 == 0 else ("after", "before", "direct")
                got = {k: bench.run_trial(stub_url if k == "direct" else gws[k].base_url, r, a, client_cpu)
                       for k in order}
                row = {"repeat": rep, "rate_rps": r, **{k: got[k] for k in got}}
                for k in ("before", "after"):
                    row[f"added_ttft_p50_ms_{k}"] = got[k]["ttft_p50_ms"] - got["direct"]["ttft_p50_ms"]
                    row[f"added_ttft_p99_ms_{k}"] = got[k]["ttft_p99_ms"] - got["direct"]["ttft_p99_ms"]
                rows.append(row)
                print(f"repeat {rep + 1} rate {r:5.0f}/s  added TTFT p50: before {row['added_ttft_p50_ms_before']:.3f} "
                      f"ms, after {row['added_ttft_p50_ms_after']:.3f} ms  (p99 {row['added_ttft_p99_ms_before']:.2f} / "
                      f"{row['added_ttft_p99_ms_after']:.2f} ms)  ok {got['after']['ok']}/{got['after']['requests']}",
                      flush=True)
    finally:
        for g in gws.values():
            g.stop()
        loadgen.stop_stub(stub)
    lines = len(log.read_text().splitlines()) if log.exists() else 0
    tmp.cleanup()
    b = statistics.median(x["added_ttft_p50_ms_before"] for x in rows)
    f = statistics.median(x["added_ttft_p50_ms_after"] for x in rows)
    print(f"\nmedian added TTFT p50: before (no access log) {b:.3f} ms, after (a JSON line per request to a file) "
          f"{f:.3f} ms: {f - b:+.3f} ms ({(f / b - 1) * 100 if b > 0 else float('nan'):+.1f}%); {lines} lines written; "
          f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    if a.out:
        Path(a.out).write_text(json.dumps({"rows": rows, "before_ms": b, "after_ms": f}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
