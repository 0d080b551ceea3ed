"""Is the gateway's memory flat over a long run? RSS after each of 10 rounds of 2,000 streams.

``fairlib gateway`` with its defaults (no event log, the access log on stderr) in front of
``fairlib serve`` (a fast engine model: 1 ms per decode step), both child processes; a client on
this process's event loop keeps ``--concurrency`` 16-token streams open (a new one as each ends),
four tenants. After each round: the gateway's RSS (``/proc/PID/status``). Issue 26: the RSS after
10 rounds within 20 MB of the RSS after the first (on main: +31 kB per request, the event log).

    python benchmarks/gateway_memory.py                  # 10 x 2,000 streams
    python benchmarks/gateway_memory.py --rounds 3 --per-round 500
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    raise KeyError("VmRSS")


async def round_of(url: str, n: int, concurrency: int) -> int:
    """``n`` streams, ``concurrency`` at a time; how many ended with [DONE]."""
    from fairlib.client.http1 import HttpSession
    body = json.dumps({"model": "sim-model", "prompt": list(range(32)), "max_tokens": 16, "ignore_eos": True,
                       "stream": True}).encode()
    done, left = 0, n
    async with HttpSession(timeout_s=60) as s:
        async def worker(k):
            nonlocal done, left
            while left > 0:
                left -= 1
                hdr = {"Content-Type": "application/json", "x-llm-d-inference-fairness-id": f"t{k % 4}"}
                async with s.post(url + "/completions", data=body, headers=hdr) as r:
                    raw = await r.read()
                done += r.status == 200 and raw.rstrip().endswith(b"data: [DONE]")
        await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return done


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--per-round", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--out")
    a = p.parse_args(argv)
    from fairlib.gateway import GatewayProcess
    from fairlib.serve import ServerProcess

    eng = ["--iter-base-ms", "1", "--iter-slope-ms", "0.02", "--max-batch", "64", "--model", "sim-model"]
    rows = []
    with ServerProcess(eng) as srv, GatewayProcess(["--upstream", srv.base_url]) as gw:
        start = rss_mb(gw.proc.pid)
        print(f"gateway RSS at start {start:.1f} MB", flush=True)
        for i in range(a.rounds):
            t0 = time.monotonic()
            ok = asyncio.run(round_of(gw.base_url, a.per_round, a.concurrency))
            rows.append({"round": i + 1, "ok": ok, "rss_mb": rss_mb(gw.proc.pid), "s": time.monotonic() - t0})
            print(f"round {i + 1}: {ok}/{a.per_round} streams whole in {rows[-1]['s']:.1f} s, gateway RSS "
                  f"{rows[-1]['rss_mb']:.1f} MB", flush=True)
    grew = rows[-1]["rss_mb"] - rows[0]["rss_mb"]
    print(f"\nRSS after round {len(rows)} minus after round 1: {grew:+.1f} MB "
          f"({'within' if grew <= 20 else 'OVER'} the 20 MB of issue 26), {grew * 1024 / max(1, (len(rows) - 1) * a.per_round):.2f} "
          f"kB per stream after the first round")
    if a.out:
        Path(a.out).write_text(json.dumps({"start_mb": start, "rows": rows, "grew_mb": grew}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
