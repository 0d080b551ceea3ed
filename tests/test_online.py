"""The online engine (one iteration per call, requests submitted as they come) is the batch
simulator's own step: feeding a table request by request must reproduce `simulate` exactly."""
import copy

import numpy as np
import pandas as pd
import pytest

import fairlib
from fairlib.chapters import presets
from fairlib.sim.online import OnlineEngine
from fairlib.sim import loop
from sim_harness import random_params

PARAMS = {"fcfs": {}, "rpm_quota": {"limit": 30}, "vtc": {}, "lcf": {"wp": 1.0, "wq": 2.0}, "residency": {},
          "slot_cap": {"cap": 3}, "priority": {}, "weighted": {"w": [3, 1, 1, 1]}, "sjf": {}, "aging": {"rate": 0.5},
          "rr": {}, "vtc_predict": {"window": 3, "init": 4.0},
          "token_pool": {"classes": ["guaranteed", "elastic", "elastic", "spot"], "shares": [0.25, 0.3, 0.3, 0.0],
                         "slo_ms": [500.0, 5000.0, 30000.0, 60000.0], "decode_price_ms": 1.2,
                         "prefill_price_ms": 0.06, "replica_slots": 8, "pool_horizon_ms": 3000.0}}


def replay(df, engine, policy, params, n_tenants):
    eng = OnlineEngine(engine, policy, n_tenants=n_tenants, capacity=8, **params)
    i, n = 0, len(df)
    while True:
        while i < n and df.arrival_ms[i] <= eng.now_ms:
            eng.submit(int(df.tenant[i]), int(df.prompt_tokens[i]), int(df.output_tokens[i]), float(df.arrival_ms[i]),
                       est_output_tokens=int(df.est_output_tokens[i]), klass=int(df.klass[i]),
                       priority=int(df.priority[i]))
            i += 1
        if eng.has_work() and eng.step().code != loop.ENDED:
            continue
        if i >= n:
            return eng
        eng.advance(float(df.arrival_ms[i]))


def test_every_policy_is_replayed():
    assert set(PARAMS) == set(fairlib.POLICIES)


@pytest.mark.parametrize("policy", list(fairlib.POLICIES))
def test_online_replay_equals_batch(policy):
    params = PARAMS[policy]
    df = presets.seed000(seed=3, duration_s=15).requests(3)
    df["klass"] = df["tenant"]
    engine = fairlib.Engine(9.0, 0.55, 0.06, 8, kv_capacity_tokens=4000)
    ref = fairlib.simulate(df, engine, policy, None, n_tenants=4, **params)
    eng = replay(df, engine, policy, params, 4)
    got = {k: np.array([eng.request(r)[k] for r in range(len(df))], float)
           for k in ("admitted_ms", "first_token_ms", "finish_ms", "charged_ms", "preemptions")}
    for k, v in got.items():
        np.testing.assert_allclose(v, ref.requests[k].to_numpy(float), rtol=1e-12, equal_nan=True, err_msg=k)
    assert ref.requests["preemptions"].sum() > 0      # the KV limit really preempts here


def test_step_reports_tokens_and_finishes():
    eng = OnlineEngine(fairlib.Engine(10.0, 1.0, 0.1, 4), "fcfs")
    a = eng.submit(0, 100, 2, 0.0)
    b = eng.submit(0, 50, 1, 0.0)
    it = eng.step()                      # dt = 10 + 2 + 0.1 * 150 = 27
    assert it.code == loop.RAN and it.start_ms == 0.0 and it.end_ms == pytest.approx(27.0)
    assert sorted(it.ran) == [a, b] and sorted(it.first) == [a, b] and list(it.finished) == [b]
    it = eng.step()                      # dt = 10 + 1 = 11
    assert it.end_ms == pytest.approx(38.0) and list(it.finished) == [a] and len(it.first) == 0
    assert eng.step().code == loop.ENDED and not eng.has_work()


def test_rejections_are_reported_and_arrivals_never_go_back():
    eng = OnlineEngine(fairlib.Engine(10.0, 1.0, 0.1, 4, max_prefill_tokens=100), "fcfs")
    too_long = eng.submit(0, 200, 2, 5.0)
    ok = eng.submit(0, 10, 1, 1.0)                # earlier than the previous arrival: clamped to 5.0
    assert eng.S.RF[0, ok] == 5.0
    eng.advance(5.0)
    it = eng.step()
    assert list(it.rejected) == [too_long] and list(it.finished) == [ok]


def test_bad_submissions_name_the_field():
    eng = OnlineEngine(fairlib.Engine(), "fcfs", n_tenants=2)
    with pytest.raises(ValueError, match="prompt_tokens"):
        eng.submit(0, 0, 5)
    with pytest.raises(ValueError, match="tenant"):
        eng.submit(2, 5, 5)
    with pytest.raises(ValueError, match="priority"):
        OnlineEngine(fairlib.Engine(), "priority", priority_levels=range(0, 3)).submit(0, 5, 5, priority=7)
    with pytest.raises(ValueError, match="klass.*< 2"):
        OnlineEngine(fairlib.Engine(), "aging", n_classes=2).submit(0, 5, 5, klass=2)
    with pytest.raises(ValueError, match="n_classes"):
        OnlineEngine(fairlib.Engine(), "aging", n_classes=0)


@pytest.mark.parametrize("policy", list(fairlib.POLICIES))
def test_online_use_leaves_the_policy_object_unchanged(policy):
    """One policy object serves simulate(), then the online stepper, then simulate() again on the
    same table: the same result, no error. (Priority and Aging kept the online engine's limits on
    the object: afterwards a table with a priority outside -32..32 or a klass >= 4 was refused.)"""
    df = pd.DataFrame({"arrival_ms": np.arange(12) * 3.0, "tenant": np.arange(12) % 3,
                       "prompt_tokens": np.full(12, 10), "output_tokens": np.arange(12) % 4 + 1,
                       "est_output_tokens": np.arange(12) % 5 + 1, "klass": np.arange(12) % 6,
                       "priority": np.array([40, -40, 0, 1, 2, 3] * 2)})
    engine = fairlib.Engine(10.0, 1.0, 0.1, 2)
    pol = fairlib.make_policy(policy, **random_params(np.random.default_rng(0), policy, 3, 6))
    before = copy.deepcopy(pol.__dict__)
    first = fairlib.simulate(df, engine, pol, n_tenants=3)
    eng = OnlineEngine(engine, pol, n_tenants=3)
    eng.submit(1, 10, 2, 0.0, est_output_tokens=2, klass=0, priority=0)
    while eng.has_work():
        eng.step()
    assert eng.request(0)["finish_ms"] == pytest.approx(12.0 + 11.0)   # alone: 10 + 1 + 0.1 * 10, then 10 + 1
    second = fairlib.simulate(df, engine, pol, n_tenants=3)
    assert pol.__dict__ == before
    pd.testing.assert_frame_equal(first.requests, second.requests, check_exact=True)
    pd.testing.assert_frame_equal(first.tenants, second.tenants, check_exact=True)
    assert first.run == second.run
    if first.counters is not None:
        np.testing.assert_array_equal(first.counters, second.counters)
