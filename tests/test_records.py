"""fairlib.records: the simulator's records have the measured records' columns and meaning."""
import json
import math

import numpy as np
import pandas as pd
import pytest

import fairlib
from fairlib import records, scenarios
from fairlib.client import RECORD_FIELDS, EndpointConfig, load_records
from fairlib.records.rundir import load_summary
from fairlib.workload import Constant, Scenario, TenantSpec

TINY = pd.DataFrame({"arrival_ms": [0.0, 0.0, 5.0], "tenant": [0, 1, 0],
                     "prompt_tokens": [100, 50, 10], "output_tokens": [3, 2, 1]})
TINY_ENGINE = fairlib.Engine(10.0, 1.0, 0.1, max_batch=4)


def tiny_records(**kw):
    res, times = records.trace_simulation(TINY, TINY_ENGINE, "fcfs", tenant_names=["x", "y"], **kw)
    return res, times, records.from_simulation(res, None, 0, token_times=times)


def test_columns_are_the_measured_ones():
    _, _, rec = tiny_records()
    assert tuple(rec.columns) == records.RECORD_COLUMNS == tuple(RECORD_FIELDS)   # no extra columns


def test_hand_computed_token_times():
    # iteration 1: requests 0 and 1, P = 150, B = 2: dt = 10 + 2 + 15 = 27 ms
    # iteration 2: request 2 (arrived at 5) joins, P = 10, B = 3: dt = 10 + 3 + 1 = 14 -> 41 ms
    # iteration 3: request 0 alone: dt = 11 -> 52 ms
    res, times, rec = tiny_records()
    np.testing.assert_allclose(times[0], [27.0, 41.0, 52.0])
    np.testing.assert_allclose(times[1], [27.0, 41.0])
    np.testing.assert_allclose(times[2], [41.0])
    np.testing.assert_allclose(rec.loc[0, "chunk_times_s"], [0.027, 0.041, 0.052])
    assert rec.loc[0, "chunk_tokens"] == [1, 1, 1]
    assert rec["tenant_name"].tolist() == ["x", "y", "x"]
    assert rec.loc[0, "ttft_s"] == pytest.approx(0.027)
    assert rec.loc[0, "e2e_s"] == pytest.approx(0.052)
    assert rec.loc[0, "tpot_s"] == pytest.approx((0.052 - 0.027) / 2)
    assert rec.loc[2, "ttft_s"] == pytest.approx(0.036)       # sent at 5 ms, first token at 41 ms
    assert rec.loc[2, "e2e_s"] == pytest.approx(0.036)
    assert rec.loc[2, "tpot_s"] is None or math.isnan(rec.loc[2, "tpot_s"])   # one token: no TPOT
    assert (rec["error_class"] == "none").all() and (rec["http_status"] == 200).all()
    assert rec["intended_send_s"].tolist() == rec["actual_send_s"].tolist() == [0.0, 0.0, 0.005]
    assert rec.loc[1, "usage"] == {"prompt_tokens": 50, "completion_tokens": 2, "total_tokens": 52}
    assert rec.loc[2, "server_timings"]["queue_time_ms"] == pytest.approx(22.0)   # admitted at 27
    np.testing.assert_allclose(rec["last_token_s"].astype(float) * 1e3, res.requests["finish_ms"])
    np.testing.assert_allclose(rec["first_token_s"].astype(float) * 1e3, res.requests["first_token_ms"])


@pytest.mark.parametrize("policy,params", [("fcfs", {}), ("vtc", {}), ("residency", {}), ("priority", {}),
                                           ("rpm_quota", {"limit": 20}), ("slot_cap", {"cap": 3}),
                                           ("sjf", {}), ("aging", {"rate": 0.5})])
def test_trace_reproduces_simulate_exactly(policy, params):
    spec = scenarios.load("slo_mix", duration_s=12)
    df = spec.requests(4)
    engine = fairlib.Engine(9.0, 0.55, 0.06, 8, kv_capacity_tokens=6000)
    ref = fairlib.simulate(df, engine, policy, None, tenant_names=list(spec.tenant_names), **params)
    got, times = records.trace_simulation(df, engine, policy, None, tenant_names=list(spec.tenant_names), **params)
    for c in ("admitted_ms", "first_token_ms", "finish_ms", "charged_ms", "generated", "preemptions", "rejected"):
        np.testing.assert_allclose(got.requests[c].to_numpy(float), ref.requests[c].to_numpy(float), rtol=1e-12,
                                   equal_nan=True, err_msg=c)
    np.testing.assert_allclose(got.tenants["machine_ms"], ref.tenants["machine_ms"], rtol=1e-12)
    assert [len(t) for t in times] == ref.requests["generated"].tolist()
    rec = records.from_simulation(got, spec, 4, token_times=times)
    fin = ~np.isnan(ref.requests["finish_ms"].to_numpy())
    np.testing.assert_allclose(rec["e2e_s"].to_numpy(float)[fin],
                               (ref.requests["finish_ms"] - ref.requests["arrival_ms"]).to_numpy()[fin] / 1e3)


def test_preempted_streams_have_gaps():
    spec = scenarios.load("fair_share", duration_s=10)
    engine = fairlib.Engine(9.0, 0.55, 0.06, 24, kv_capacity_tokens=3000)
    res, times = records.trace_simulation(spec.requests(0), engine, "fcfs", tenant_names=list(spec.tenant_names))
    pre = res.requests["preemptions"].to_numpy() > 0
    assert pre.any()
    all_ends = np.unique(np.concatenate(times))
    r = int(np.flatnonzero(pre)[0])
    span = all_ends[(all_ends >= times[r][0]) & (all_ends <= times[r][-1])]
    assert len(span) > len(times[r])            # iterations ran while it was out of the batch


def test_rejections_map_to_http_errors():
    df = pd.DataFrame({"arrival_ms": [0.0, 1.0, 2.0, 3.0], "tenant": [0, 0, 0, 0],
                       "prompt_tokens": [10, 500, 10, 10], "output_tokens": [2, 2, 2, 2]})
    eng = fairlib.Engine(10.0, 1.0, 0.1, 4, max_prefill_tokens=100)
    res, times = records.trace_simulation(df, eng, "rpm_quota", limit=2)
    rec = records.from_simulation(res, None, 0, token_times=times)
    assert rec["error_class"].tolist() == ["none", "http_4xx", "none", "http_429"]
    assert rec["http_status"].tolist() == [200, 400, 200, 429]
    assert rec.loc[1, "ttft_s"] is None or math.isnan(rec.loc[1, "ttft_s"])
    assert rec.loc[3, "chunk_times_s"] == []


def test_horizon_interrupts_in_flight_requests():
    res, times = records.trace_simulation(TINY, TINY_ENGINE, "fcfs", horizon_ms=30.0)
    rec = records.from_simulation(res, None, 0, token_times=times)
    # the second iteration starts at 27 < 30 and ends at 41: it still runs; the third does not
    assert rec["error_class"].tolist() == ["interrupted", "none", "none"]
    assert rec.loc[0, "chunk_times_s"] == pytest.approx([0.027, 0.041])
    assert rec.loc[0, "ttft_s"] == pytest.approx(0.027)
    assert rec.loc[0, "e2e_s"] is None or math.isnan(rec.loc[0, "e2e_s"])


def test_from_simulation_replays_when_not_given_token_times():
    spec = scenarios.load("noisy_neighbor", duration_s=8)
    res = fairlib.simulate(spec.requests(1), spec.engine, "vtc", None, tenant_names=list(spec.tenant_names))
    a = records.from_simulation(res, spec, 1)
    b = records.simulate_records(spec, 1, "vtc")
    pd.testing.assert_frame_equal(a, b)


def test_simulate_run_defaults_to_the_scenarios_policy_and_drains():
    spec = scenarios.load("slo_mix", duration_s=8)
    run = records.simulate_run(spec, 0)
    assert run.config["policy"]["name"] == "priority"
    assert run.config["extra"]["scenario"]["name"] == "slo_mix"
    assert (run.records["error_class"] == "none").all()      # every request finished (no horizon)
    assert run.summary["valid"] and run.summary["schedule_lag_ms"]["p99"] == 0.0
    assert run.summary["n_ok"] == len(run.records)
    assert run.slos == {"interactive": (300.0, 40.0), "batch": (20000.0, 150.0)}
    assert run.duration_s == 8.0 and run.tenant_names == ["interactive", "batch"]
    sc = Scenario((TenantSpec("t", output=Constant(5), prompt=Constant(5), rate_rps=2.0),), duration_s=3)
    assert records.simulate_records(sc, 0)["tenant_name"].eq("t").all()   # a plain Scenario works too


def _same(a: pd.DataFrame, b: pd.DataFrame):
    assert list(a.columns) == list(b.columns)
    for c in a.columns:
        for x, y in zip(a[c], b[c]):
            if isinstance(x, float) and math.isnan(x):
                assert y is None or (isinstance(y, float) and math.isnan(y)), c
            elif isinstance(x, (list, dict)):
                assert x == y, c
            elif x is None:
                assert y is None or (isinstance(y, float) and math.isnan(y)), c
            else:
                assert x == y, (c, x, y)


def test_run_directory_round_trip(tmp_path):
    spec = scenarios.load("noisy_neighbor", duration_s=6)
    run = records.simulate_run(spec, 2)
    d = records.write_run_dir(run.records, tmp_path / "r", run.config, run.summary)
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "env.json", "records.jsonl", "summary.json"]
    back = load_records(d)
    _same(run.records, back)
    line = json.loads((d / "records.jsonl").read_text().splitlines()[0])
    assert set(line) == set(RECORD_FIELDS)
    assert load_summary(d)["valid"] is True
    loaded = records.load_run(d)
    assert loaded.name == "noisy_neighbor" and loaded.seed == 2 and loaded.backend == "sim"
    assert loaded.slos["interactive"] == (500.0, 50.0)
    with pytest.raises(FileExistsError):
        records.write_run_dir(run.records, d, run.config)
    records.write_run_dir(run.records, d, run.config, overwrite=True)   # summary computed when not given
    assert load_summary(d)["n_ok"] == len(run.records)


def test_load_run_rejects_a_non_run_directory(tmp_path):
    with pytest.raises(ValueError, match="records.jsonl"):
        records.load_run(tmp_path)


def _without_backend(config: dict) -> dict:
    out = {k: v for k, v in config.items() if k != "backend"}
    out["extra"] = {k: v for k, v in config["extra"].items() if k != "backend"}
    return out


def test_backend_is_what_the_run_records(tmp_path):
    run = records.simulate_run(scenarios.load("fair_share", duration_s=4), 0)
    cfg = _without_backend(run.config)
    # simulated, the config silent: the summary says "sim", and so does the simulator's result in memory
    d = records.write_run_dir(run.records, tmp_path / "sim", cfg, run.summary)
    assert run.summary["backend"] == "sim" and records.load_run(d).backend == "sim"
    assert records.Run(run.records, cfg, {}, sim=run.sim).backend == "sim"
    # measured: the client's config (its endpoint, no backend in extra) and summary (no backend)
    client_cfg = {"endpoint": EndpointConfig(base_url="http://127.0.0.1:9/v1", model="m").to_dict(),
                  "lag_threshold_ms": 10.0, "schedule": cfg["schedule"], "extra": {"scenario": cfg["extra"]["scenario"]}}
    summary = records.summarize(zip(run.records["intended_send_s"], run.records["actual_send_s"],
                                    run.records["error_class"]), n_planned=len(run.records), requested_rate_rps=None)
    assert "backend" not in summary
    d = records.write_run_dir(run.records, tmp_path / "http", client_cfg, summary)
    assert records.load_run(d).backend == "http"
    # nothing says: unknown, not a guess; records_summary does not guess either
    assert records.Run(run.records).backend == "unknown"
    assert records.records_summary(run.records, cfg)["backend"] == "unknown"
    d = records.write_run_dir(run.records, tmp_path / "bare", cfg)
    assert records.load_run(d).backend == "unknown"
    assert json.loads((d / "env.json").read_text())["backend"] == "unknown"
