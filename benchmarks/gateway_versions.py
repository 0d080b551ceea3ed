"""The Python gateway's CPU per relayed stream, two checkouts side by side (before and after a change).

One stub (benchmarks/loadgen.py: one token per chunk, TTFT 20 ms, ITL 5 ms) on CPU 0 with the
client; one ``fairlib gateway`` (FCFS, slots enough that nobody waits) per variant, each pinned
to CPU 1 and started once; then ``--rounds`` rounds in which every variant gets the same trial in
turn (the load generator's client at ``--rate`` for ``--duration-s``). Per trial the gateway's
own CPU time (user + system, from /proc) over the streams answered; per variant the median over
the rounds, and its ratio to the first variant's (the baseline, measured in the same run). A
machine that is slower now than an hour ago moves every variant alike; alternating rounds keep
drift from favouring one.

A variant is ``NAME=CHECKOUT[:FLAG ...]``: the checkout's ``fairlib`` (its directory put first on
PYTHONPATH) with the gateway flags after the colon::

    git worktree add /tmp/before HEAD~1
    python benchmarks/gateway_versions.py before=/tmp/before after=. "after-uvloop=.:--event-loop uvloop"
    python benchmarks/gateway_versions.py before=/tmp/before after=. --output-tokens 512 --rate 100
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import loadgen  # noqa: E402  (the stub, its start and stop)

GATEWAY_TRIAL = Path(__file__).resolve().parent / "gateway.py"     # its "trial": one client run, a ROW line


def parse_variant(text: str) -> tuple:
    """``NAME=CHECKOUT[:FLAGS]`` -> ``(name, checkout path, [flags])``; errors name the variant."""
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise SystemExit(f"variant {text!r}: expected NAME=CHECKOUT[:FLAGS], e.g. before=/tmp/before")
    tree, _, flags = rest.partition(":")
    path = Path(tree).resolve()
    if not (path / "fairlib" / "__init__.py").is_file():
        raise SystemExit(f"variant {name!r}: {path} holds no fairlib/ (a checkout of this repository?)")
    return name, path, shlex.split(flags)


def start_gateway(tree: Path, flags: list, stub_url: str, cpu) -> tuple:
    """``(Popen, base URL)`` of the checkout's gateway, pinned to ``cpu``."""
    env = dict(os.environ, PYTHONPATH=str(tree),
               NUMBA_CACHE_DIR=os.environ.get("NUMBA_CACHE_DIR", str(ROOT / ".cache" / "numba")))
    cmd = [sys.executable, "-m", "fairlib", "gateway", "--upstream", stub_url, "--policy", "fcfs",
           "--max-inflight", "4096", "--no-events", "--access-log", "off", "--port", "0", *flags]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tree,
                         preexec_fn=loadgen._die_with_parent)
    if cpu is not None:
        os.sched_setaffinity(p.pid, {cpu})
    seen = []
    for line in p.stdout:
        seen.append(line)
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+/v1)", line)
        if m:       # its later lines read on, so that a full pipe never stalls it mid-trial
            threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
            return p, m.group(1)
    p.wait()
    raise RuntimeError(f"the gateway of {tree} did not start:\n{''.join(seen[-20:])}")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (/proc/PID/stat, clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def trial(url: str, a, cpu) -> dict:
    cmd = [sys.executable, str(GATEWAY_TRIAL), "trial", "--url", url, "--rate", str(a.rate), "--duration-s",
           str(a.duration_s), "--output-tokens", str(a.output_tokens)] + (["--cpu", str(cpu)] if cpu is not None else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.duration_s * 20 + 120)
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("ROW ")]
    if p.returncode != 0 or not rows:
        raise RuntimeError(f"trial failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(rows[-1][4:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+", help="NAME=CHECKOUT[:FLAGS]; the first is the baseline")
    ap.add_argument("--rate", type=float, default=250.0, help="streams per second (default 250)")
    ap.add_argument("--output-tokens", type=int, default=16, help="tokens per stream (default 16)")
    ap.add_argument("--duration-s", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", help="also write every trial as JSON here")
    a = ap.parse_args(argv)
    variants = [parse_variant(v) for v in a.variants]
    if len({v[0] for v in variants}) != len(variants):
        raise SystemExit("variants: each NAME once")
    pin = len(os.sched_getaffinity(0)) >= 2
    client_cpu, proxy_cpu = (0, 1) if pin else (None, None)
    stub, stub_url = loadgen.start_stub(cpu=client_cpu)
    gws: dict = {}
    rows: dict = {v[0]: [] for v in variants}
    try:
        for name, tree, flags in variants:
            gws[name] = start_gateway(tree, flags, stub_url, proxy_cpu)
        for r in range(a.rounds):
            for name, (proc, url) in gws.items():
                c0 = cpu_s(proc.pid)
                row = trial(url, a, client_cpu)
                row["gateway_cpu_ms_per_stream"] = 1e3 * (cpu_s(proc.pid) - c0) / max(1, row["ok"])
                rows[name].append(row)
                print(f"round {r}  {name:16s} {row['gateway_cpu_ms_per_stream']:7.3f} ms CPU/stream  TTFT p50 "
                      f"{row['ttft_p50_ms']:6.2f} p99 {row['ttft_p99_ms']:7.2f} ms  ok {row['ok']}/{row['requests']}",
                      flush=True)
    finally:
        for proc, _ in gws.values():
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        loadgen.stop_stub(stub)
    base = statistics.median(x["gateway_cpu_ms_per_stream"] for x in rows[variants[0][0]])
    print(f"\n{a.output_tokens}-token streams at {a.rate:g}/s, {a.rounds} rounds; gateway on CPU {proxy_cpu}")
    print("variant            CPU ms per stream (median, min-max)   ratio to " + variants[0][0])
    for name, _, _ in variants:
        xs = sorted(x["gateway_cpu_ms_per_stream"] for x in rows[name])
        print(f"{name:18s} {statistics.median(xs):8.3f} ({xs[0]:.3f}-{xs[-1]:.3f}) {statistics.median(xs) / base:21.2f}")
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
