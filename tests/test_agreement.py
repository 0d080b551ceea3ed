"""The compiled simulator (``fairlib.simulate``) agrees with the independent plain-Python
reference (``tests/reference_sim.py``) on every per-request time and charge and every per-tenant
total, to rtol 1e-9 (NaN equals NaN), over random workloads and every policy
(book/engine-model.md: "the test suite checks that both agree to rtol = 1e-9").

Three sources of workloads:
- a fixed list of numpy-seeded workloads (``sim_harness.random_case``), 30 seeds x every policy of
  the registry (``fairlib.sim.policies.POLICIES``; the harness derives its list from it);
- hypothesis (``sim_harness.workloads``), derandomised so CI is deterministic;
- the seed-000 preset over 120 s, as published and with classes, a small KV cache and a prefill
  budget.
"""
import functools

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fairlib.chapters.presets import seed000
from fairlib.sim.policies import POLICIES
from sim_harness import (HYPOTHESIS_PARAMS, POLICY_NAMES, RANDOM_PARAMS, assert_agree, compiled_result,
                         compiled_simulate, random_case, reference_simulate, workloads)

SEEDS = range(30)


@functools.lru_cache(maxsize=None)
def seeded_run(seed, policy):
    df, kw = random_case(seed, policy)
    return df, kw, reference_simulate(df, **kw), compiled_simulate(df, **kw)


def _describe(df, kw):
    return f"{len(df)} requests, " + ", ".join(f"{k}={v!r}" for k, v in kw.items())


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_seeded_workloads_agree(policy, seed):
    df, kw, ref, comp = seeded_run(seed, policy)
    assert_agree(ref, comp, context=f"seed {seed}: {_describe(df, kw)}")


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_seeded_workloads_cover_the_hard_cases(policy):
    """The fixed list really exercises what the agreement is about: exact arrival ties, idle
    gaps, engine rejections, preemptions (several of them), horizons that cut a run and, per
    policy, its own mechanism (rate-limit rejections, counters moving, caps binding...)."""
    seen = dict(ties=0, idle=0, rejected=0, preempted=0, cut=0, small_batch=0)
    for seed in SEEDS:
        df, kw, ref, _ = seeded_run(seed, policy)
        req = ref[0]
        a = df["arrival_ms"].to_numpy()
        seen["ties"] += bool(len(a) > 1 and np.any(np.diff(a) == 0))
        seen["idle"] += bool(len(a) > 1 and np.any(np.diff(a) >= 200))
        seen["rejected"] += any(req["rejected"])
        seen["preempted"] += sum(req["preemptions"]) > 0
        unfinished = [not r and np.isnan(f) for r, f in zip(req["rejected"], req["finish_ms"])]
        seen["cut"] += "horizon_ms" in kw and any(unfinished)
        seen["small_batch"] += kw["max_batch"] <= 6
    assert seen["ties"] >= 10 and seen["idle"] >= 5 and seen["small_batch"] >= 15, seen
    assert seen["rejected"] >= 5 and seen["preempted"] >= 3 and seen["cut"] >= 3, seen


def test_seeded_workloads_exercise_rate_limits_and_window_expiry():
    rejected = expired = 0
    for seed in SEEDS:
        df, kw, ref, _ = seeded_run(seed, "rpm_quota")
        if kw.get("max_prefill_tokens") is None and kw.get("kv_capacity_tokens") is None:
            rejected += any(ref[0]["rejected"])
        a = df["arrival_ms"].to_numpy()
        expired += bool(len(a) and a[-1] - a[0] > 60000 and not all(ref[0]["rejected"]))
    assert rejected >= 3 and expired >= 3, (rejected, expired)


# --- hypothesis -------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", POLICY_NAMES)
@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_hypothesis_workloads_agree(policy, data):
    df, kw = data.draw(workloads(policy), label="workload")
    ref = reference_simulate(df, **kw)
    comp = compiled_simulate(df, **kw)
    assert_agree(ref, comp, context=_describe(df, kw))


# --- the seed-000 preset ------------------------------------------------------------------------
SEED000_PARAMS = {
    "fcfs": {}, "rpm_quota": {"limit": 400}, "vtc": {}, "lcf": {"wp": 1.0, "wq": 2.0},
    "residency": {}, "slot_cap": {"cap": 8}, "priority": {}, "weighted": {"w": [5, 3, 2, 1]},
    "sjf": {}, "aging": {"rate": 5.0}, "rr": {}, "vtc_predict": {},
    "token_pool": {"classes": ["guaranteed", "elastic", "elastic", "spot"], "shares": [0.25, 0.3, 0.3, 0.0],
                   "slo_ms": [500.0, 5000.0, 30000.0, 60000.0], "decode_price_ms": 0.925,
                   "prefill_price_ms": 0.06, "replica_slots": 24, "pool_horizon_ms": 5000.0, "half_life_ms": 10000.0},
}


def test_the_harness_covers_exactly_the_registry():
    """Every registered policy is in the randomized agreement, property and error tests (they take
    their list from sim_harness.POLICY_NAMES) and has parameters to draw; nothing else is."""
    assert list(POLICY_NAMES) == list(POLICIES)
    assert set(RANDOM_PARAMS) == set(HYPOTHESIS_PARAMS) == set(SEED000_PARAMS) == set(POLICIES)


@functools.lru_cache(maxsize=None)
def seed000_table():
    scenario = seed000(seed=0)
    return scenario.requests(0), scenario.engine


def _engine_kw(engine):
    return dict(iter_base_ms=engine.iter_base_ms, iter_slope_ms=engine.iter_slope_ms,
                prefill_ms_per_token=engine.prefill_ms_per_token, max_batch=engine.max_batch)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_seed000_preset_agrees(policy):
    df, engine = seed000_table()
    kw = dict(n_tenants=4, policy=policy, horizon_ms=120_000.0, **_engine_kw(engine), **SEED000_PARAMS[policy])
    ref = reference_simulate(df, **kw)
    comp = compiled_simulate(df, **kw)
    assert ref[2]["iterations"] > 2000          # the whole two minutes, overloaded
    assert_agree(ref, comp, context=f"seed000 {policy}")


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_seed000_with_classes_and_a_small_kv_cache_agrees(policy):
    """The same table with one class and one priority per tenant (so weighted, priority and
    aging have something to order), a 9000-token KV cache and a 2000-token prefill budget."""
    df, engine = seed000_table()
    df = df.assign(klass=df["tenant"], priority=3 - df["tenant"])
    kw = dict(n_tenants=4, policy=policy, horizon_ms=120_000.0, **_engine_kw(engine),
              max_prefill_tokens=2000, kv_capacity_tokens=9000, **SEED000_PARAMS[policy])
    ref = reference_simulate(df, **kw)
    comp = compiled_simulate(df, **kw)
    assert sum(ref[0]["preemptions"]) > 0
    assert_agree(ref, comp, context=f"seed000 + classes + kv {policy}")


# --- valid inputs the reference runs must run compiled too ---------------------------------------
# Both tests fail on fairlib 0.1.0 with a MemoryError (the compiled side is wrong: the contract
# puts no bound on `limit` or on the number of distinct priority values, and the reference runs
# both cases).


def _engine_rejects(df, kw, i):
    p, o = int(df["prompt_tokens"][i]), int(df["output_tokens"][i])
    return (kw.get("max_prefill_tokens") is not None and p > kw["max_prefill_tokens"]) or \
        (kw.get("kv_capacity_tokens") is not None and p + o > kw["kv_capacity_tokens"])


def test_rpm_quota_with_a_limit_larger_than_the_table():
    """A limit no tenant can reach is legal (rpm_quota then never rejects: it is fcfs). The
    compiled policy sized its ring of accepted arrival times by the limit, n_tenants * limit
    float64 (RpmQuota.state): limit 10**12 asks for terabytes."""
    df, kw = random_case(3, "rpm_quota")
    kw = dict(kw, limit=10**12)
    ref = reference_simulate(df, **kw)
    assert not any(ref[0]["rejected"][i] for i in range(len(df)) if not _engine_rejects(df, kw, i))
    assert_agree(ref, compiled_simulate(df, **kw), context=_describe(df, kw))


def test_priority_with_many_distinct_priority_values():
    """Priorities are arbitrary integers (as in vLLM); a table where every request has its own
    value is legal, and the reference runs it in O(n log n). The compiled policy kept one waiting
    line per distinct value (Priority.lines), and the engine sizes every line for the whole table
    (state.allocate: heap = n_lines x n int64, 298 GiB here); select also scanned every line.
    Requests 100 ms apart, each alone on the engine: finish = arrival + dt."""
    n = 200_000
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"arrival_ms": np.arange(n) * 100.0, "tenant": np.zeros(n, np.int64),
                       "prompt_tokens": np.full(n, 5), "output_tokens": np.ones(n, np.int64),
                       "priority": rng.permutation(n)})
    res = compiled_result(df, n_tenants=1, iter_base_ms=9.0, iter_slope_ms=0.55, prefill_ms_per_token=0.06,
                          max_batch=4, policy="priority")
    dt = 9.0 + 0.55 + 0.06 * 5
    np.testing.assert_allclose(res.requests["finish_ms"], df["arrival_ms"] + dt, rtol=1e-12)
    assert res.run["iterations"] == n
