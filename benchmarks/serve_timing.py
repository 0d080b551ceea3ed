"""``fairlib serve``'s own timing error: how late its tokens leave against the engine model.

Runs ``fairlib serve`` (dt = 8 + 0.5 B ms, max_batch 32) under a steady open-loop load from the
client (Poisson, 20 requests/s of 60-token streams, ~15 streams running) and reads back the
server's two lags (``/fairlib/stats``): the *emission lag* (the moment the driver hands an
iteration's tokens to the request handlers, minus the iteration's intended end on the model
clock) and the *write lag* (the moment each token chunk is written to its socket, minus the
same intended end; it adds the handlers' turn in the event loop, ~0.05 ms per running stream).
Once with the default 1 ms spin before each iteration end, once without spinning.

    python benchmarks/serve_timing.py [--duration-s 10]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fairlib.client import EndpointConfig, build_schedule, run  # noqa: E402
from fairlib.serve import ServerProcess  # noqa: E402


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration-s", type=float, default=10.0)
    p.add_argument("--spins", default="1,0")
    a = p.parse_args(argv)
    rng = np.random.default_rng(0)
    n = int(20 * a.duration_s)
    df = pd.DataFrame({"arrival_ms": np.sort(rng.uniform(0, a.duration_s * 1e3, n)), "tenant": rng.integers(0, 4, n),
                       "prompt_tokens": rng.integers(20, 200, n), "output_tokens": 60})
    sched = build_schedule(df, seed=0)
    print(f"{n} requests over {a.duration_s:g} s, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print("| spin_ms | iterations | emission lag p50 / p90 / p99 / max (ms) | write lag p50 / p90 / p99 / max (ms) "
          "| server CPU (s) |")
    print("|---|---|---|---|---|")
    for spin in a.spins.split(","):
        args = ["--iter-base-ms", 8, "--iter-slope-ms", 0.5, "--prefill-ms-per-token", 0.02, "--max-batch", 32,
                "--spin-ms", spin]
        with ServerProcess(args) as srv, tempfile.TemporaryDirectory() as tmp:
            c0 = proc_cpu_s(srv.proc.pid)
            s = run(sched, EndpointConfig(base_url=srv.base_url, model="fairlib-sim"), Path(tmp) / "r",
                    scrape_metrics=False, collect_env=False)
            cpu = proc_cpu_s(srv.proc.pid) - c0
            st = srv.stats()
        e, w = st["emission_lag_ms"], st["write_lag_ms"]
        f = (lambda d: " / ".join(f"{d[k]:.3f}" for k in ("p50", "p90", "p99", "max")))
        print(f"| {spin} | {st['iterations']} | {f(e)} | {f(w)} | {cpu:.2f} |   ({s['n_ok']}/{n} ok)", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
