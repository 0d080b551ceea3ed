"""The probe recovers ``fairlib serve``'s own engine parameters over HTTP.

The server runs dt = 8 + 1.5 B + 0.05 P ms with max_batch 16; the probe, seeing only token
timestamps, must find iter_base and iter_slope within 10 %, the prefill cost within 10 % and the
batch limit exactly (on a quiet machine all three land within ~1 %: the fit uses slopes through
tens of tokens, not single gaps). The whole probe takes ~10 s.
"""
import json

import numpy as np
import pytest

from fairlib import Engine, simulate
from fairlib.client import EndpointConfig
from fairlib.calibrate.probe import decode_point, linear_fit, load_probed_engine, probe
from fairlib.serve import ServerProcess

TRUE = {"iter_base_ms": 8.0, "iter_slope_ms": 1.5, "prefill_ms_per_token": 0.05, "max_batch": 16}


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    args = ["--iter-base-ms", 8, "--iter-slope-ms", 1.5, "--prefill-ms-per-token", 0.05, "--max-batch", 16]
    out = tmp_path_factory.mktemp("probe") / "probe.json"
    with ServerProcess(args) as srv:
        res = probe(EndpointConfig(base_url=srv.base_url, model="fairlib-sim", timeout_s=60),
                    batches=(1, 2, 4, 8, 12, 16, 20), decode_tokens=40,
                    prefill_lengths=(16, 512, 1024, 1536, 2048), prefill_repeats=4, out=out)
    return res, out


def test_probe_recovers_the_servers_parameters(result):
    res, _ = result
    e = res["engine"]
    assert e["iter_base_ms"] == pytest.approx(TRUE["iter_base_ms"], rel=0.10)
    assert e["iter_slope_ms"] == pytest.approx(TRUE["iter_slope_ms"], rel=0.10)
    assert e["prefill_ms_per_token"] == pytest.approx(TRUE["prefill_ms_per_token"], rel=0.10)
    assert e["max_batch"] == TRUE["max_batch"]
    assert res["fit"]["decode"]["r2"] > 0.99 and res["fit"]["prefill"]["r2"] > 0.99
    # B = 20 > max_batch: only 16 streams overlapped, the sweep stopped there and left it out of the fit
    last = res["points"]["decode"][-1]
    assert last["B"] == 20 and last["concurrent"] == 16 and 20 not in [p["B"] for p in res["points"]["decode"]
                                                                          if p["concurrent"] == p["B"]]
    assert res["capacity"]["max_batch_is_lower_bound"] is False
    true_tps = 1000 * 16 / (8 + 1.5 * 16)
    assert res["capacity"]["output_tokens_per_s"] == pytest.approx(true_tps, rel=0.05)
    assert res["capacity"]["measured_output_tokens_per_s"] == pytest.approx(true_tps, rel=0.05)
    assert res["fit"]["ttft_overhead_ms"] > -1.0          # the HTTP round trip, never negative
    assert res["endpoint"]["fairlib_serve"]["config"]["engine"]["iter_base_ms"] == 8.0
    print("probe recovered:", json.dumps(e))


def test_probe_file_loads_into_the_simulator(result):
    res, out = result
    eng = load_probed_engine(out)
    assert isinstance(eng, Engine) and eng.max_batch == 16
    assert eng.iter_base_ms == pytest.approx(res["engine"]["iter_base_ms"])
    saved = json.loads(out.read_text())
    assert {"engine", "fit", "capacity", "points", "endpoint", "params"} <= set(saved)
    import pandas as pd
    df = pd.DataFrame({"arrival_ms": [0.0], "tenant": [0], "prompt_tokens": [100], "output_tokens": [10]})
    r = simulate(df, eng, "fcfs", None, n_tenants=1)
    assert r.requests["first_token_ms"].iloc[0] == pytest.approx(float(eng.iteration_ms(1, 100)))


# --- the pieces, on synthetic timestamps ------------------------------------------------------

def rec(times, tokens=None):
    return {"error_class": "none", "chunk_times_s": list(times), "chunk_tokens": tokens or [1] * len(times)}


def test_decode_point_steady_window_and_multi_token_chunks():
    dt = 0.02
    a = rec(np.arange(0, 30) * dt)                   # enters one iteration before b
    b = rec(np.arange(1, 31) * dt + 0.0007)          # jittered receipt
    p = decode_point([a, b], 2)
    assert p["concurrent"] == 2 and p["dt_ms"] == pytest.approx(20.0, abs=1e-6)
    c = rec(np.arange(0, 15) * 2 * dt, [2] * 15)     # two tokens per chunk: still 20 ms per token
    assert decode_point([c], 1)["dt_ms"] == pytest.approx(20.0, abs=1e-6)


def test_decode_point_detects_a_full_batch():
    dt = 0.01
    first = [rec(np.arange(0, 10) * dt) for _ in range(2)]
    late = [rec((np.arange(0, 10) + 10) * dt)]       # started when the first two finished
    p = decode_point(first + late, 3)
    assert p["concurrent"] == 2


def test_linear_fit():
    f = linear_fit([1, 2, 4, 8], [9.5, 11, 14, 20])
    assert f["intercept"] == pytest.approx(8.0) and f["slope"] == pytest.approx(1.5) and f["r2"] == pytest.approx(1.0)
    assert linear_fit([1], [2])["slope"] is None
