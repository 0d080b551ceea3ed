"""The static-batch engine mode (DriftSched's batch-synchronous worker), hand-computed, and on the
independent reference (random agreement cases include static batches: tests/sim_harness.py)."""
import math

import pandas as pd
import pytest

import fairlib
from reference_sim import reference_simulate
from sim_harness import compiled_simulate


def table(rows):
    return pd.DataFrame(rows, columns=["arrival_ms", "tenant", "prompt_tokens", "output_tokens"])


ENGINE = dict(iter_base_ms=10.0, iter_slope_ms=1.0, prefill_ms_per_token=0.1, max_batch=2)


@pytest.mark.parametrize("sim", [compiled_simulate, reference_simulate])
def test_nothing_joins_a_running_batch_and_a_free_worker_waits_to_fill(sim):
    # r0 waits alone (fill window to 5 ms); r1 arrives at 2: two waiting = max_batch, both enter.
    # The batch runs until r0's third token; r2 and r3 arrive meanwhile and wait for the next batch.
    req = table([(0.0, 0, 10, 3), (2.0, 0, 10, 1), (3.0, 0, 10, 2), (4.0, 0, 10, 1)])
    r, _, run = sim(req, n_tenants=1, batching="static", fill_wait_ms=5.0, **ENGINE)
    dt2 = 10 + 2 * 1 + 0.1 * 20         # two prompts of 10 prefilled, B = 2: 14 ms
    dt1 = 10 + 1                        # one sequence left: 11 ms
    assert r["admitted_ms"] == [2.0, 2.0, 2.0 + dt2 + 2 * dt1, 2.0 + dt2 + 2 * dt1]
    assert r["finish_ms"][1] == pytest.approx(2.0 + dt2)
    assert r["finish_ms"][0] == pytest.approx(2.0 + dt2 + 2 * dt1)            # batch 1 ends: 38
    assert r["finish_ms"][3] == pytest.approx(38.0 + dt2)                      # 52
    assert r["finish_ms"][2] == pytest.approx(38.0 + dt2 + dt1)                # batch 2 ends: 63
    assert run["busy_ms"] == pytest.approx(2 * dt2 + 3 * dt1)


@pytest.mark.parametrize("sim", [compiled_simulate, reference_simulate])
def test_the_fill_wait_expires(sim):
    req = table([(0.0, 0, 10, 1), (100.0, 0, 10, 1)])
    r, _, _ = sim(req, n_tenants=1, batching="static", fill_wait_ms=5.0, **ENGINE)
    assert r["admitted_ms"] == [5.0, 105.0]                 # alone, after the 5-ms wait
    r, _, _ = sim(req, n_tenants=1, batching="static", fill_wait_ms=0.0, **ENGINE)
    assert r["admitted_ms"] == [0.0, 100.0]
    r, _, _ = sim(req, n_tenants=1, **ENGINE)                # continuous: at once
    assert r["admitted_ms"] == [0.0, 100.0]


def test_a_policy_picks_who_enters_the_batch():
    # sjf: while the first batch runs, three wait; the two shortest estimates enter the next one
    req = table([(0.0, 0, 5, 4), (1.0, 0, 5, 1), (2.0, 0, 5, 1), (3.0, 0, 5, 1)])
    req["est_output_tokens"] = [4, 30, 2, 3]
    eng = fairlib.Engine(**{**ENGINE, "max_batch": 2}, batching="static", fill_wait_ms=0.0)
    res = fairlib.simulate(req, eng, "sjf", n_tenants=1)
    adm = res.requests["admitted_ms"].to_numpy()
    assert adm[0] == 0.0 and adm[2] == adm[3] > 0 and adm[1] > adm[2]


def test_the_engine_states_its_mode():
    with pytest.raises(ValueError, match="batching"):
        fairlib.Engine(batching="chunky")
    with pytest.raises(ValueError, match="fill_wait_ms"):
        fairlib.Engine(batching="static", fill_wait_ms=-1)
    assert "batching" not in fairlib.Engine().to_dict()          # the six fields continuous engines had
    d = fairlib.Engine(batching="static").to_dict()
    assert d["batching"] == "static" and d["fill_wait_ms"] == 10.0 and fairlib.Engine(**d) == \
        fairlib.Engine(batching="static")
    assert math.isclose(fairlib.Engine(batching="static").kernel_params()[7], 10.0)
