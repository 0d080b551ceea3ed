"""How fast can fairlib's load generator send, open loop, on one core?

The protocol of the field's load-generator benchmarks: constant-rate arrivals of 32-word prompts
with 16-token outputs against a stub that streams one token per chunk (vLLM's completions chunks,
TTFT 20 ms, ITL 5 ms, then the usage chunk and ``[DONE]``); the client is pinned to one core
(``os.sched_setaffinity``), the stub to another. A rate passes when the achieved send rate is at
least 99 % of it, the p99 schedule lag (actual minus intended send time) at most 5 ms, and every
request was answered in full. The rate ramps up (``--rates``) until one fails; the highest passing
rate is the result, the median over ``--repeats`` ramps. Each trial is a fresh client process
(``fairlib.client.run``, records written as in a real run), so ``--baseline PATH`` (another
checkout's root, e.g. ``git archive HEAD fairlib | tar -x -C /tmp/base``) is measured in the
same invocation, its ramps interleaved with the current client's: the machine's load hits both.

Each trial also reports, over its steady state (1 s after the first send to 0.5 s before the
last), the client's CPU utilisation and CPU per request, and the share of time it waited,
runnable, for its core (``/proc/self/task/*/schedstat``): other processes on that core, the
usual cause of a failed rate on a shared machine. The runner spins for the last ``spin_s`` (1 ms)
before each send, which fills idle time above ~500 requests/s: ``--spin-ms 0`` shows the work alone.

    python benchmarks/loadgen.py                                    # ramp, 3 repeats, 5 s per rate
    python benchmarks/loadgen.py --baseline /tmp/base --repeats 3 --out loadgen.json
    python benchmarks/loadgen.py --scrape --metrics-lines 20000 --metrics-delay-ms 1000   # a slow, long /metrics
    python benchmarks/loadgen.py trial --url URL --rate 800 --profile prof.out   # one trial, cProfile
    python benchmarks/loadgen.py stub --metrics-delay-ms 1000 --idle-close-ms 100  # the stub alone

The stub (``stub``) is a raw asyncio HTTP/1.1 server, cheap enough not to be the bottleneck; it
also serves ``/metrics`` (vLLM-like text of ``--metrics-lines`` lines, answered after
``--metrics-delay-ms``) and can close idle keep-alive connections (``--idle-close-ms``: a
connection idle longer than that is closed, unanswered, when the next request arrives on it, as
a server whose idle timeout crossed the request).
"""
from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAG_P99_MS = 5.0
MIN_ACHIEVED = 0.99
RATES = "250,500,750,1000,1250,1500,1750,2000,2500,3000,4000"


# --- the stub server --------------------------------------------------------------------------

def metrics_text(n_lines: int, model: str = "stub") -> str:
    """vLLM-like Prometheus text of about ``n_lines`` sample lines (histogram buckets mostly)."""
    lab = f'engine="0",model_name="{model}"'
    lines = ["# HELP vllm:num_requests_running Number of requests in model execution batches.",
             "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{lab}}} 3.0",
             f"vllm:num_requests_waiting{{{lab}}} 0.0", "process_cpu_seconds_total 1.5"]
    h = 0
    while len(lines) < n_lines:
        lines.append(f"# TYPE vllm:hist{h}_seconds histogram")
        for b in range(40):
            lines.append(f'vllm:hist{h}_seconds_bucket{{{lab},le="{0.001 * 1.5 ** b:.6g}"}} {float(b * 7)}')
        lines.append(f'vllm:hist{h}_seconds_bucket{{{lab},le="+Inf"}} 280.0')
        lines += [f"vllm:hist{h}_seconds_sum{{{lab}}} 12.5", f"vllm:hist{h}_seconds_count{{{lab}}} 280.0"]
        h += 1
    return "\n".join(lines[:max(n_lines, 5)]) + "\n"


def _chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (Transfer-Encoding: chunked)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Conn(asyncio.Protocol):
    """One client connection of the stub: HTTP/1.1 keep-alive, one request at a time."""

    def __init__(self, stub):
        self.stub, self.tr, self.buf = stub, None, b""
        self.busy = self.closed = self.served = False
        self.keep, self.last = True, time.monotonic()

    def connection_made(self, tr):
        self.tr = tr
        self.stub.counts["connections"] += 1

    def connection_lost(self, exc):
        self.closed = True

    def data_received(self, data):
        idle = self.stub.idle_close_s
        if idle and self.served and not self.busy and not self.buf and time.monotonic() - self.last > idle:
            self.stub.counts["idle_closed"] += 1   # timed out just as this request arrived
            self.tr.close()
            return
        self.buf += data
        self.next_request()

    def next_request(self):
        if self.busy or self.closed:
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].decode("latin-1").split("\r\n")
        hdrs = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:])}
        n = int(hdrs.get("content-length", 0))
        if len(self.buf) < end + 4 + n:
            return
        body, self.buf = self.buf[end + 4:end + 4 + n], self.buf[end + 4 + n:]
        method, path = head[0].split(" ")[:2]
        self.busy, self.keep = True, hdrs.get("connection", "").lower() != "close"
        self.stub.route(self, method, path, body)

    def respond(self, status: str, ctype: str, body: bytes):
        self.tr.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n"
                      .encode() + body)
        self.finish()

    def finish(self):
        self.busy, self.served, self.last = False, True, time.monotonic()
        if not self.keep:
            self.tr.close()
        elif self.buf:
            self.next_request()


class Stub:
    """The stub's routes: ``POST /v1/completions`` (and chat), ``GET /metrics``, ``/v1/models``."""

    def __init__(self, ttft_s=0.02, itl_s=0.005, metrics_lines=1000, metrics_delay_s=0.0, idle_close_s=0.0,
                 model="stub"):
        self.ttft_s, self.itl_s, self.metrics_delay_s, self.idle_close_s = ttft_s, itl_s, metrics_delay_s, idle_close_s
        self.model, self.metrics = model, metrics_text(metrics_lines, model).encode()
        self.counts = {"connections": 0, "requests": 0, "metrics": 0, "idle_closed": 0}
        self.loop = None

    def route(self, conn, method, path, body):
        if method == "POST" and path.endswith("/completions"):
            self.counts["requests"] += 1
            self.stream(conn, json.loads(body), chat=path.endswith("/chat/completions"))
        elif path.endswith("/metrics"):
            self.counts["metrics"] += 1
            self.loop.call_later(self.metrics_delay_s, self.answer_metrics, conn)
        elif path.endswith("/models"):
            conn.respond("200 OK", "application/json",
                         json.dumps({"object": "list", "data": [{"id": self.model, "object": "model"}]}).encode())
        else:
            conn.respond("404 Not Found", "text/plain", b"not found")

    def answer_metrics(self, conn):
        if not conn.closed:
            conn.respond("200 OK", "text/plain; version=0.0.4", self.metrics)

    def stream(self, conn, body, chat):
        n = int(body.get("max_tokens") or 16)
        prompt = body.get("messages", [{}])[-1].get("content", "") if chat else body.get("prompt", "")
        p = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        rid = f"cmpl-{self.counts['requests']}"
        head = f'{{"id":"{rid}","object":"text_completion","created":1700000000,"model":"{self.model}","choices":[{{"index":0,"text":'
        finish = ["null"] * (n - 1) + ['"length"']
        frames = [_chunk(f'data: {head}" w{k}","logprobs":null,"finish_reason":{finish[k]},"stop_reason":null,'
                         f'"prompt_token_ids":null,"token_ids":null}}],"usage":null}}\n\n'.encode())
                  for k in range(n)]
        usage = (f'data: {{"id":"{rid}","object":"text_completion","created":1700000000,"model":"{self.model}",'
                 f'"choices":[],"usage":{{"prompt_tokens":{p},"total_tokens":{p + n},"completion_tokens":{n}}}}}\n\n')
        frames[-1] += _chunk(usage.encode()) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        conn.tr.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n")
        t0 = self.loop.time() + self.ttft_s
        self.loop.call_at(t0, self.token, conn, frames, 0, t0)

    def token(self, conn, frames, k, t0):
        if conn.closed:
            return
        conn.tr.write(frames[k])
        if k + 1 < len(frames):
            self.loop.call_at(t0 + (k + 1) * self.itl_s, self.token, conn, frames, k + 1, t0)
        else:
            conn.finish()

    async def serve(self, host="127.0.0.1", port=0, ready=None):
        self.loop = asyncio.get_running_loop()
        server = await self.loop.create_server(lambda: _Conn(self), host, port, backlog=4096)
        url = f"http://{host}:{server.sockets[0].getsockname()[1]}/v1"
        if ready is not None:
            ready(url)
        stop = asyncio.Event()
        for s in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(s, stop.set)
        async with server:
            await stop.wait()


def _die_with_parent():
    """Linux: SIGTERM this process when its parent dies (prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def start_stub(args=(), cpu=None) -> tuple:
    """``(Popen, base_url)`` of the stub in a child process (pinned to ``cpu`` when given)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "stub", *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, preexec_fn=_die_with_parent)
    if cpu is not None:
        os.sched_setaffinity(proc.pid, {cpu})
    line = proc.stdout.readline()
    if not line.startswith("STUB "):
        proc.kill()
        raise RuntimeError(f"the stub did not start: {line!r}")
    return proc, line.split()[1]


def stop_stub(proc) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stub_main(a) -> int:
    stub = Stub(a.ttft_ms / 1e3, a.itl_ms / 1e3, a.metrics_lines, a.metrics_delay_ms / 1e3, a.idle_close_ms / 1e3)
    asyncio.run(stub.serve(port=a.port, ready=lambda url: print("STUB", url, flush=True)))
    print(json.dumps(stub.counts), file=sys.stderr, flush=True)
    return 0


# --- one trial: a fresh client process --------------------------------------------------------

def proc_cpu_s() -> float:
    """This process's CPU time plus its finished children's (the scraper, workers)."""
    import resource
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def runqueue_wait_s() -> float:
    """Seconds this process's threads waited, runnable, for a CPU (``/proc/.../schedstat``): the
    share of the lag that other processes on the client's core caused. NaN off Linux."""
    try:
        return sum(int(Path(f"/proc/self/task/{t}/schedstat").read_text().split()[1])
                   for t in os.listdir("/proc/self/task")) / 1e9
    except (OSError, IndexError, ValueError):
        return float("nan")


class Sampler:
    """Samples ``(unix time, process CPU s, run-queue wait s)`` every 50 ms in a thread, for the
    steady state of a trial: ``between(t1, t2)`` gives CPU and wait per second of that window."""

    def __init__(self):
        import threading
        self.rows, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.wait(0.05):
            t = os.times()
            self.rows.append((time.time(), t.user + t.system, runqueue_wait_s()))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def between(self, t1: float, t2: float) -> tuple:
        inside = [r for r in self.rows if t1 <= r[0] <= t2]
        if len(inside) < 2:
            return float("nan"), float("nan")
        (a, ca, wa), (b, cb, wb) = inside[0], inside[-1]
        return (cb - ca) / (b - a), (wb - wa) / (b - a)


def trial_main(a) -> int:
    sys.path.insert(0, str(Path(a.fairlib).resolve() if a.fairlib else ROOT))
    import pandas as pd

    from fairlib.client import EndpointConfig, build_schedule, run
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
    n = max(2, int(round(a.rate * a.duration_s)))
    df = pd.DataFrame({"arrival_ms": [1e3 * i / a.rate for i in range(n)], "tenant": [i % 4 for i in range(n)],
                       "prompt_tokens": 32, "output_tokens": 16})
    sched = build_schedule(df, seed=0)
    cfg = EndpointConfig(base_url=a.url, model="stub", timeout_s=60)
    with tempfile.TemporaryDirectory() as tmp:
        cpu0, t0, wait0 = proc_cpu_s(), time.perf_counter(), runqueue_wait_s()
        kw = dict(workers=a.workers, lag_threshold_ms=LAG_P99_MS, scrape_metrics=a.scrape, spin_s=a.spin_ms / 1e3,
                  metrics_interval_s=a.metrics_interval_s, collect_env=False, overwrite=True)
        with Sampler() as sampler:
            if a.profile:
                import cProfile
                prof = cProfile.Profile()
                s = prof.runcall(run, sched, cfg, Path(tmp) / "r", **kw)
                prof.dump_stats(a.profile)
            else:
                s = run(sched, cfg, Path(tmp) / "r", **kw)
        cpu, wall, wait = proc_cpu_s() - cpu0, time.perf_counter() - t0, runqueue_wait_s() - wait0
    # steady state: from 1 s after the first send to 0.5 s before the last
    busy, waiting = sampler.between(s["start_wall"] + 1.0, s["start_wall"] + a.duration_s - 0.5)
    lag, achieved = s["schedule_lag_ms"], s["achieved_rate_rps"] or 0.0
    row = {"rate_rps": a.rate, "requests": s["n_planned"], "ok": s["n_ok"], "achieved_rps": achieved,
           "lag_p50_ms": lag["p50"], "lag_p99_ms": lag["p99"], "lag_max_ms": lag["max"],
           "client_cpu_ms_per_request": 1e3 * cpu / max(s["n_sent"], 1), "client_cpu_util": cpu / wall,
           "steady_cpu_util": busy, "steady_cpu_ms_per_request": 1e3 * busy / a.rate,
           "runqueue_wait_share": wait / wall, "steady_runqueue_wait_share": waiting,
           "scrape": (s.get("server_metrics") or {}).get("samples") if a.scrape else None}
    row["passed"] = bool(s["n_ok"] == s["n_planned"] and achieved >= MIN_ACHIEVED * a.rate
                         and lag["p99"] is not None and lag["p99"] <= LAG_P99_MS)
    print("ROW " + json.dumps(row), flush=True)
    return 0


def run_trial(url, rate, a, fairlib=None, cpu=None) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "trial", "--url", url, "--rate", str(rate),
           "--duration-s", str(a.duration_s), "--workers", str(a.workers),
           "--metrics-interval-s", str(a.metrics_interval_s), "--spin-ms", str(a.spin_ms)]
    cmd += ["--scrape"] if a.scrape else []
    cmd += ["--fairlib", fairlib] if fairlib else []
    cmd += ["--cpu", str(cpu)] if cpu is not None else []
    env = dict(os.environ, NUMBA_CACHE_DIR=os.environ.get("NUMBA_CACHE_DIR", str(ROOT / ".cache" / "numba")))
    env.pop("PYTHONPATH", None)   # the trial puts the client's checkout first itself
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.duration_s * 10 + 120)
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("ROW ")]
    if p.returncode != 0 or not rows:
        raise RuntimeError(f"trial failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(rows[-1][4:])


# --- the ramp ---------------------------------------------------------------------------------

def ramp(url, rates, a, fairlib, cpu, log) -> tuple:
    """Trials at increasing rates until one fails: ``(highest passing rate or 0, rows)``."""
    best, rows = 0.0, []
    for r in rates:
        row = run_trial(url, r, a, fairlib, cpu)
        rows.append(row)
        log(row)
        if not row["passed"]:
            break
        best = r
    return best, rows


def fmt(v, d=2):
    return "-" if v is None else (f"{v:.{d}f}" if isinstance(v, float) else str(v))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["stub"]:
        p = argparse.ArgumentParser(prog="loadgen.py stub")
        p.add_argument("--port", type=int, default=0)
        p.add_argument("--ttft-ms", type=float, default=20.0)
        p.add_argument("--itl-ms", type=float, default=5.0)
        p.add_argument("--metrics-lines", type=int, default=1000)
        p.add_argument("--metrics-delay-ms", type=float, default=0.0)
        p.add_argument("--idle-close-ms", type=float, default=0.0)
        return stub_main(p.parse_args(argv[1:]))
    if argv[:1] == ["trial"]:
        p = argparse.ArgumentParser(prog="loadgen.py trial")
        p.add_argument("--url", required=True)
        p.add_argument("--rate", type=float, required=True)
        p.add_argument("--duration-s", type=float, default=5.0)
        p.add_argument("--workers", type=int, default=1)
        p.add_argument("--scrape", action="store_true")
        p.add_argument("--metrics-interval-s", type=float, default=1.0)
        p.add_argument("--fairlib", help="root of the checkout whose client to run (default: this one)")
        p.add_argument("--cpu", type=int)
        p.add_argument("--profile", help="write a cProfile of the run here")
        p.add_argument("--spin-ms", type=float, default=1.0, help="run()'s spin_s, in ms")
        return trial_main(p.parse_args(argv[1:]))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration-s", type=float, default=5.0)
    p.add_argument("--rates", default=RATES)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--scrape", action="store_true", help="scrape the stub's /metrics during each trial")
    p.add_argument("--metrics-interval-s", type=float, default=1.0)
    p.add_argument("--metrics-lines", type=int, default=1000, help="the stub's /metrics text, in lines")
    p.add_argument("--metrics-delay-ms", type=float, default=0.0, help="the stub's /metrics answers this late")
    p.add_argument("--spin-ms", type=float, default=1.0,
                   help="run()'s spin before each send, in ms (0: sleep only; the CPU figures then are the work alone)")
    p.add_argument("--baseline", help="root of another checkout whose client is measured alongside")
    p.add_argument("--client-cpu", type=int, default=0)
    p.add_argument("--stub-cpu", type=int, default=1)
    p.add_argument("--out", help="also write the rows as JSON here")
    a = p.parse_args(argv)
    rates = [float(x) for x in a.rates.split(",")]
    pin = len(os.sched_getaffinity(0)) >= 2
    cpu, stub_cpu = (a.client_cpu, a.stub_cpu) if pin else (None, None)
    variants = {"current": None, **({"baseline": a.baseline} if a.baseline else {})}
    load0, t0 = os.getloadavg(), time.time()
    best = {v: [] for v in variants}
    rows = {v: [] for v in variants}
    proc, url = start_stub(["--metrics-lines", a.metrics_lines, "--metrics-delay-ms", a.metrics_delay_ms], cpu=stub_cpu)
    try:
        for rep in range(a.repeats):
            order = list(variants) if rep % 2 == 0 else list(variants)[::-1]
            for v in order:
                print(f"repeat {rep + 1}, {v}", flush=True)
                b, rs = ramp(url, rates, a, variants[v], cpu, lambda r: print(
                    "  " + "  ".join(f"{k}={fmt(r[k])}" for k in (
                        "rate_rps", "achieved_rps", "lag_p50_ms", "lag_p99_ms", "steady_cpu_util",
                        "steady_cpu_ms_per_request", "steady_runqueue_wait_share", "ok", "passed")), flush=True))
                best[v].append(b)
                rows[v] += [{**r, "repeat": rep} for r in rs]
    finally:
        stop_stub(proc)
    load1 = os.getloadavg()
    print(f"\nconstant rate, 32-word prompts, 16 tokens one per chunk, TTFT 20 ms, ITL 5 ms, {a.duration_s:g} s per "
          f"rate; client on CPU {cpu}, stub on CPU {stub_cpu}; pass = achieved >= {MIN_ACHIEVED:.0%} of the rate, "
          f"p99 lag <= {LAG_P99_MS:g} ms, all answered; spin {a.spin_ms:g} ms{'; /metrics scraped' if a.scrape else ''}")
    for v in variants:
        print(f"{v}: highest passing rate per repeat {[int(b) for b in best[v]]}, median "
              f"{statistics.median(best[v]):g} requests/s")
    print(f"load average (1 min) {load0[0]:.2f} at start, {load1[0]:.2f} at end ({time.time() - t0:.0f} s); "
          f"{os.cpu_count()} CPUs")
    if a.out:
        Path(a.out).write_text(json.dumps({"best": best, "rows": rows, "loadavg_start": load0, "loadavg_end": load1,
                                           "duration_s": a.duration_s, "scrape": a.scrape, "spin_ms": a.spin_ms},
                                          indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
