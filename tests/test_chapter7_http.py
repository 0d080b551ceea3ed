"""Chapter 7 end to end over HTTP: start ``fairlib serve`` (the engine model in real time: a test
double, not an engine), run the chapter with papermill on ``backend="http"`` against it, and check
the measured per-tenant tables against the simulator's for the same scenarios and seed.

The server runs the same engine model and policy (FCFS) as the simulation, and the client sends
the same schedule, so the two differ only by the HTTP path and timing noise: machine shares must
agree within a few points and TTFT medians within a tolerance that holds on a loaded 2-core
machine (a few ms of HTTP and scheduling overhead per request, plus jitter)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest

from fairlib import analysis as an
from fairlib.analysis import intervals
from fairlib.sim.engine import Engine
from fairlib import records, scenarios

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "07_measuring_a_real_engine.ipynb"
SCENARIOS = ["fair_share", "noisy_neighbor", "victim_baseline"]
DURATION_S = 8.0
SEED = 0

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def chapter_over_http(tmp_path_factory):
    from fairlib.serve import ServerProcess
    tmp = tmp_path_factory.mktemp("ch07http")
    runs_dir = tmp / "runs"
    out = tmp / "ch07_http.ipynb"
    env = dict(os.environ)
    env.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".cache" / "numba"))
    with ServerProcess(["--policy", "fcfs"]) as srv:
        cmd = [sys.executable, "-m", "papermill", str(NOTEBOOK), str(out), "--cwd", str(ROOT / "notebooks"),
               "-p", "backend", "http", "-r", "endpoint", srv.base_url, "-p", "duration_s", str(DURATION_S),
               "-y", f"seeds: [{SEED}]", "-y", "scenarios: " + json.dumps(SCENARIOS), "-r", "runs_dir", str(runs_dir),
               "-r", "server_policy", "fcfs", "-p", "n_boot", "100", "--no-progress-bar"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=170, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return out, runs_dir


def _sim(name):
    spec = scenarios.load(name, duration_s=DURATION_S)
    return an.analyze_run(records.simulate_run(spec, SEED), n_boot=100)


def test_the_chapter_ran_on_http(chapter_over_http):
    out, runs_dir = chapter_over_http
    nb = nbformat.read(out, as_version=4)
    texts = []
    for c in nb.cells:
        for o in c.get("outputs", []):
            assert o.get("output_type") != "error", o
            texts.append(o.get("text", "") if o.get("output_type") == "stream" else "")
    joined = "\n".join(texts)
    assert "runs on backend 'http'" in joined
    assert "noisy_neighbor: the interactive tenant's p99 TTFT" in joined        # victim degradation computed
    for name in SCENARIOS:
        d = runs_dir / name / "fcfs" / f"seed{SEED}"
        assert {"records.jsonl", "summary.json", "config.json", "env.json"} <= {p.name for p in d.iterdir()}


@pytest.mark.parametrize("name", SCENARIOS)
def test_measured_tables_agree_with_the_simulator(chapter_over_http, name):
    _, runs_dir = chapter_over_http
    measured = an.analyze_run(runs_dir / name / "fcfs" / f"seed{SEED}", n_boot=100)
    sim = _sim(name)
    assert measured.run.backend == "http" and sim.run.backend == "sim"
    # the same schedule: the same requests per tenant, all completed with their forced lengths
    m, s = an.tenant_table(measured), an.tenant_table(sim)
    assert list(m.index) == list(s.index)
    assert m["requests"].tolist() == s["requests"].tolist()
    assert (m["completed"] == m["requests"]).all(), measured.validity
    # machine shares rebuilt from the streams, and token-weighted service shares: within a few points
    for col in ("residency_share_pct", "residency_fitted_share_pct", "token_share_pct"):
        diff = (m[col] - s[col]).abs().max()
        assert diff <= 4.0, (col, m[col].round(2).tolist(), s[col].round(2).tolist())
    # TTFT medians: HTTP adds a few ms per request; queueing noise scales with the value
    tol = 30.0 + 0.3 * s["ttft_p50_ms"]
    assert ((m["ttft_p50_ms"] - s["ttft_p50_ms"]).abs() <= tol).all(), (m["ttft_p50_ms"].tolist(),
                                                                        s["ttft_p50_ms"].tolist())
    # the iteration cost fitted from the measured streams is the server's engine model
    fit = measured.cost_fit
    assert fit["prefill_ms_per_token"] == pytest.approx(0.06, rel=0.3)
    # At the ticks the streams show (B streams emitting, P prompt tokens starting in each) the
    # server sleeps to dt = 9 + 0.55 B + 0.06 P ms (Engine(): the server's engine model), so the
    # model predicts every tick, and the fitted line at the ticks' mean (B, P) is their mean
    # duration (least squares with an intercept passes through the means): the two differ by the
    # server's emission lag alone. Seen 0.96-1.03 of the prediction (2026-12-04, the three
    # scenarios, a busy machine); bound 10%. The bound this replaces, 5 < dt(B = 24) < 35 ms, passed
    # a 2x error and extrapolated to B = 24, which a run of small batches cannot carry
    # (victim_baseline, mean B 2.5: its fitted slope came out negative, dt(24) = -0.3 ms).
    B, P, dt = intervals.tick_table(intervals.build_intervals(measured.run.records, None, None))
    ok = (B > 0) & np.isfinite(dt) & (dt > 0)
    e = Engine()
    predicted = float(np.mean(e.iter_base_ms + e.iter_slope_ms * B[ok] + e.prefill_ms_per_token * P[ok]))
    fitted = fit["iter_base_ms"] + fit["iter_slope_ms"] * B[ok].mean() + fit["prefill_ms_per_token"] * P[ok].mean()
    assert fitted == pytest.approx(predicted, rel=0.10), (fit, predicted, float(B[ok].mean()))


def test_victim_degradation_agrees(chapter_over_http):
    _, runs_dir = chapter_over_http
    cont = records.load_run(runs_dir / "noisy_neighbor" / "fcfs" / f"seed{SEED}")
    base = records.load_run(runs_dir / "victim_baseline" / "fcfs" / f"seed{SEED}")
    vm = an.victim_degradation(cont, base, n_boot=100)
    vs = an.victim_degradation(_sim("noisy_neighbor").run, _sim("victim_baseline").run, n_boot=100)
    # the burst hurts the victim on both backends
    assert vm.loc["ttft_p50_ms", "ratio"] > 3 and vs.loc["ttft_p50_ms", "ratio"] > 3
    # by the factor the engine model predicts: the server runs the simulator's model on the same
    # schedule, so each measured TTFT is the simulated one plus the HTTP path's overhead d (the
    # client's send, the server's parse and first write), the same few ms alone and under
    # contention. d is measured on the baseline run (measured - simulated p50 alone: 5.5 ms on
    # 2026-12-04), and the predicted ratio (contention_sim + d) / (alone_sim + d) was the measured
    # one within 0.1% there (104.1 against 104.2; the simulated ratio, 124, is not: d weighs on a
    # 29-ms TTFT alone). Bound: 25% (|log| <= 0.22), for the queue's noise under contention; the
    # bound this replaces, |log(measured / simulated)| <= 0.7, passed a 2x error.
    m, s = vm.loc["ttft_p50_ms"], vs.loc["ttft_p50_ms"]
    d = m["alone"] - s["alone"]
    assert -2.0 <= d <= 30.0, (m.to_dict(), s.to_dict())         # a few ms (the tables above allow 30)
    predicted = (s["contention"] + d) / (s["alone"] + d)
    assert abs(np.log(m["ratio"] / predicted)) <= 0.22, (m.to_dict(), s.to_dict(), predicted)
