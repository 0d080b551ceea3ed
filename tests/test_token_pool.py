"""The token pool's rules (fairlib/sim/policies/token_pool.py, fairlib/pools.py), each on a case
computed by hand, driven through ``PolicyGate`` (the gateway's core: the same compiled hooks the
simulator runs); the capacity formulas; the gateway-in-front-of-replicas simulator."""

import numpy as np
import pandas as pd
import pytest

import fairlib
from fairlib import pools
from fairlib.sim.cluster import simulate_gateway
from fairlib.sim.gate import PolicyGate, replay, replay_samples
from fairlib.sim.state import AUX

G, E, S = "guaranteed", "elastic", "spot"


def pool_gate(classes, shares, replica_slots=4, u=1.0, p=0.0, H=1000.0, h=1000.0, slo=None, replicas=1, kv=None):
    params = dict(classes=classes, shares=shares, decode_price_ms=u, prefill_price_ms=p, pool_horizon_ms=H,
                  half_life_ms=h, replicas=replicas, kv_tokens=kv, replica_slots=replica_slots)
    if slo is not None:
        params["slo_ms"] = slo
    return PolicyGate("token_pool", n_tenants=len(classes), slots=replica_slots * max(replicas, 1),
                      prefill_ms_per_token=p, record=True, **params)


def state(g):
    return g.policy.pool_state(g.pf, g.n_tenants)


# --- admission ------------------------------------------------------------------------------------
def test_admission_by_hand():
    """Shares 0.3 / 0.5 / spot, u = 1 ms per token, H = 1000 ms, R = 1: caps 300 and 500 ms."""
    g = pool_gate([G, E, S], [0.3, 0.5, 0.0])
    assert g.arrive(2, 1, 0.0, 250) == (0, True)      # spot: W + c = 250 <= 1000 - 0 (nobody active)
    assert g.arrive(1, 1, 0.0, 400) == (1, True)      # elastic within: 0 + 400 <= 500
    assert g.arrive(2, 1, 0.0, 250) == (2, True)      # spot: 650 + 250 <= 1000 - (500 - 400) = 900
    assert g.arrive(2, 1, 0.0, 10) == (3, False)      # 900 + 10 > 900
    assert g.retry_after_s(2, 0.0) == pytest.approx(0.010)      # (910 - 900) / R ms
    assert g.arrive(0, 1, 0.0, 300) == (4, True)      # guaranteed within its 300, the pool over its 1000
    assert g.arrive(0, 1, 0.0, 1) == (5, False)       # beyond: 1200 + 1 > 1000 - 100
    assert g.retry_after_s(0, 0.0) == pytest.approx(0.301)
    assert g.arrive(1, 1, 0.0, 100) == (6, True)      # elastic within: 400 + 100 <= 500
    st = state(g)
    np.testing.assert_allclose(st["reserved_ms"], [300.0, 500.0, 500.0])
    np.testing.assert_allclose(st["cap_ms"], [300.0, 500.0, 0.0])


def test_the_reservation_prices_prompt_and_output():
    """c = p P + u Ê: 0.5 * 100 + 2 * 50 = 150 ms against a cap of 0.15 * 1000 = 150."""
    g = pool_gate([E, E], [0.15, 0.85], u=2.0, p=0.5)
    assert g.arrive(0, 100, 0.0, 50)[1]
    assert state(g)["reserved_ms"][0] == pytest.approx(150.0)
    assert g.arrive(0, 1, 0.0, 1)[1]                  # a burst of 2.5 ms into the idle tenant's capacity
    assert state(g)["reserved_ms"][0] == pytest.approx(152.5)


def test_an_idle_tenants_entitlement_is_lent_an_active_ones_is_not():
    """Elastic b (share 0.6) idle: spot may use the whole horizon; once b has a request accepted
    within the last H, its unused entitlement is held back from spot."""
    g = pool_gate([S, E], [0.0, 0.6], H=1000.0)
    assert g.arrive(0, 1, 0.0, 900)[1]                # 900 <= 1000: b is idle
    g2 = pool_gate([S, E], [0.0, 0.6], H=1000.0)
    assert g2.arrive(1, 1, 0.0, 100)[1]               # b active: free 600 - 100 = 500
    assert not g2.arrive(0, 1, 0.0, 401)[1]           # 100 + 401 > 1000 - 500
    assert g2.arrive(0, 1, 0.0, 400)[1]               # 100 + 400 <= 500
    g3 = pool_gate([S, E], [0.0, 0.6], H=1000.0)
    a, _ = g3.arrive(1, 1, 0.0, 100)
    g3.admit(0.0)
    g3.observe([a], [1], [True], 1.0, 1.0)            # b's request served and gone: Q_b = 0
    assert not g3.arrive(0, 1, 999.0, 401 + 100)[1]    # accepted 999 ms ago: still active
    assert g3.arrive(0, 1, 1001.0, 1000)[1]           # 1001 ms: idle, everything lendable


def test_guaranteed_is_never_refused_within_its_entitlement_even_under_a_flood():
    g = pool_gate([G, S], [0.2, 0.0], H=1000.0)
    while g.arrive(1, 1, 0.0, 50)[1]:
        pass
    assert sum(state(g)["reserved_ms"]) > 700
    for _ in range(4):                                # 4 x 50 = its whole 200
        assert g.arrive(0, 1, 0.0, 50)[1]
    assert not g.arrive(0, 1, 0.0, 50)[1]             # the fifth is a burst: no headroom left


def test_capacity_loss_halves_the_caps_from_the_time_it_happens():
    """Y waits from 0 on (one slot, X's request runs): at the change to one replica at 100 ms
    d_Y = 0.5 * 2 * 100 = 100 (at R = 2); by 150 ms 100 + 0.5 * 1 * 50 = 125 (at R = 1)."""
    g = pool_gate([E, E], [0.5, 0.5], H=1000.0, h=1e9, replicas=2, replica_slots=1)
    np.testing.assert_allclose(state(g)["cap_ms"], [1000.0, 1000.0])
    x, _ = g.arrive(0, 1, 0.0, 5)
    g.arrive(1, 1, 0.0, 5)
    assert g.admit(0.0, open_slots=1) == [x]
    g.set_replicas(1, 100.0)
    assert state(g)["replicas"] == 1.0
    np.testing.assert_allclose(state(g)["cap_ms"], [500.0, 500.0])
    np.testing.assert_allclose(g.counters(), [0.0, 100.0])
    g.arrive(0, 1, 150.0, 1)
    np.testing.assert_allclose(g.counters(), [0.0, 125.0])
    again = replay(g.spec, g.log)                     # the change is in the log
    np.testing.assert_array_equal(again.counters(), g.counters())


def test_a_request_the_pool_could_never_fund_gets_no_retry_after():
    g = pool_gate([E, S], [0.5, 0.0], H=100.0, kv=50)
    assert not g.arrive(1, 1, 0.0, 101)[1]            # c = 101 > R H = 100
    assert g.retry_after_s(1, 0.0) is None
    assert not g.arrive(0, 30, 0.0, 21)[1]            # 51 KV tokens > 50
    assert g.retry_after_s(0, 0.0) is None


def test_the_holdback_never_stops_an_idle_pool():
    """A guaranteed share of 1.0 holds every slot; an elastic request still runs when nothing
    else does (the holdback is capped at N - 1 slots), and only then."""
    g = pool_gate([G, E], [1.0, 0.0], replica_slots=2, H=1e6)
    a, _ = g.arrive(1, 1, 0.0, 1)
    b, _ = g.arrive(1, 1, 0.0, 1)
    assert g.admit(0.0) == [a]


# --- dispatch ----------------------------------------------------------------------------------
def test_unused_guaranteed_slots_are_held_back():
    """4 slots, guaranteed share 0.5 -> ceil(2) slots held: elastic gets 2 of 4 while g is idle."""
    g = pool_gate([G, E], [0.5, 0.5], H=1e6)
    for _ in range(4):
        g.arrive(1, 1, 0.0, 1)
    assert len(g.admit(0.0)) == 2                     # n + 1 + 2 <= 4 holds for n = 0, 1
    a, _ = g.arrive(0, 1, 1.0, 1)
    assert g.admit(1.0) == [a]                        # within its 2 slots: at once


def test_priority_class_then_urgency_then_debt():
    # class: a spot request that waited long still goes after an elastic one that just arrived
    g = pool_gate([S, E], [0.0, 0.5], replica_slots=1, H=1e6, slo=[10.0, 1e6])
    s, _ = g.arrive(0, 1, 0.0, 1)
    e, _ = g.arrive(1, 1, 500.0, 1)
    assert g.admit(500.0) == [e]
    # urgency: same class, SLO 100 ms vs 10 s, same arrival: at t = 50 w = 3.5 vs 3.005
    g = pool_gate([E, E], [0.5, 0.5], replica_slots=1, H=1e6, slo=[10000.0, 100.0])
    a, _ = g.arrive(0, 1, 0.0, 1)
    b, _ = g.arrive(1, 1, 0.0, 1)
    assert g.admit(50.0) == [b]
    assert pools.priority("elastic", 50.0, 100.0, 0.0, 0.5, 1000.0) == pytest.approx(3.5)
    assert pools.priority("elastic", 50.0, 10000.0, 0.0, 0.5, 1000.0) == pytest.approx(3.005)
    assert pools.priority("guaranteed", 1e9, 1.0, -1e9, 0.5, 1.0) == pytest.approx(10.0)   # 10 + 1 - 1
    assert pools.priority("spot", 1e9, 1.0, 1e9, 0.0, 1.0) == pytest.approx(1.0)
    assert pools.priority("elastic", 0.0, 100.0, 1e9, 0.5, 1.0, debt_weight=0.0) == 3.0


def test_debt_accrues_while_backlogged_and_decays_with_the_half_life():
    """Two elastic tenants of share 0.5, one slot, u = 1 ms per token, h = 100 ms, no SLO.
    x (X) runs 0..20 in two 10-ms steps while y (Y) waits; x2 (X) arrives at 10.
    t=10 (x2's arrival): X had nothing waiting: d_X = 0; Y waited: d_Y = 0.5*10 - 0 = 5.
    t=20 (x done, a slot): X waited (x2), got 10 within reservation: d_X = 0.5*10 - 10 = -5;
      d_Y = 5 + 5 = 10. Priorities: 3 + 0 + (-5 / 50) vs 3 + 0 + 10 / 50: y goes first.
    t=30 (y done): X waited, got nothing: d_X = -5 + 5 = 0; Y waited for nothing: 10 * 2^(-0.1).
    t=140 (an arrival): nobody waited since 30: d_Y = 10 * 2^(-0.1) * 2^(-1.1)."""
    g = pool_gate([E, E], [0.5, 0.5], replica_slots=1, H=1e6, h=100.0)
    x, _ = g.arrive(0, 1, 0.0, 100)
    y, _ = g.arrive(1, 1, 0.0, 100)
    assert g.admit(0.0) == [x]
    g.observe([x], [1], [False], 10.0, 10.0)
    x2, _ = g.arrive(0, 1, 10.0, 100)
    np.testing.assert_allclose(g.counters(), [0.0, 5.0])
    g.observe([x], [1], [True], 10.0, 20.0)
    assert g.admit(20.0) == [y]
    np.testing.assert_allclose(g.counters(), [-5.0, 10.0])
    g.observe([y], [1], [True], 10.0, 30.0)
    assert g.admit(30.0) == [x2]
    np.testing.assert_allclose(g.counters(), [0.0, 10.0 * 2 ** -0.1])
    # a reading brought forward by the same rule agrees with the kernel's own at the next hook
    ahead = state_at(g, 140.0)
    g.observe([x2], [1], [True], 10.0, 40.0)
    g.arrive(1, 1, 140.0, 1)
    np.testing.assert_allclose(g.counters(), [0.0, 10.0 * 2 ** -1.2])
    np.testing.assert_allclose(ahead["debt_ms"], g.counters())


def test_a_refused_tenant_is_in_demand_and_accrues_debt():
    """Shares 0.5 / 0.5, H = 100, u = 1. B holds its 50; A holds its 50 and asks 10 more:
    W + c = 110 > 100 - 0, refused at t = 0. Both requests run; at t = 10 nothing waits, but A
    was refused within H: d_A = 0.5 * 1 * 10 - 0 = 5; B decays from 0."""
    g = pool_gate([E, E], [0.5, 0.5], H=100.0, h=1e9)
    g.arrive(1, 1, 0.0, 50)
    g.arrive(0, 1, 0.0, 50)
    assert not g.arrive(0, 1, 0.0, 10)[1]
    assert len(g.admit(0.0)) == 2
    g.arrive(1, 1, 10.0, 1)
    np.testing.assert_allclose(g.counters(), [5.0, 0.0])
    assert state_at(g, 30.0)["debt_ms"][0] == pytest.approx(15.0)     # refused at 0: in demand to 100


def state_at(g, t):
    return g.policy.pool_state(g.pf, g.n_tenants, t, g.waiting_of())


def test_debt_lifts_a_tenant_over_a_tighter_slo():
    """A (SLO 100 ms) runs a1 0..1000 ms while a2 and B's b1 wait. At t = 1000: d_A = 0.5*1000 -
    1000 = -500, d_B = 0.5*1000 = 500 (h = 1000: d / (e h) = -1 and +1). w_A = 3 + 1 - 1 = 3,
    w_B = 3 + 1000/10000 + 1 = 4.1: B goes first (without the debt A would: 4 against 3.1)."""
    g = pool_gate([E, E], [0.5, 0.5], replica_slots=1, H=1e6, h=1000.0, slo=[100.0, 10000.0])
    a1, _ = g.arrive(0, 1, 0.0, 10000)
    b1, _ = g.arrive(1, 1, 0.0, 1)
    a2, _ = g.arrive(0, 1, 0.0, 1)
    assert g.admit(0.0) == [a1]
    g.observe([a1], [1], [True], 1000.0, 1000.0)
    assert g.admit(1000.0) == [b1]
    np.testing.assert_allclose(g.counters(), [-500.0, 500.0])


# --- settlement --------------------------------------------------------------------------------
def test_settlement_returns_the_unused_reservation_and_books_overrun_as_debt():
    g = pool_gate([E], [1.0], replica_slots=2, H=1e6, h=1e9)
    a, _ = g.arrive(0, 1, 0.0, 10)                    # reserves 10 ms, in the queue
    assert state(g)["reserved_ms"][0] == 10.0
    assert g.admit(0.0) == [a]                        # dispatched: it runs with its rest of 10
    assert state(g)["reserved_ms"][0] == 0.0
    g.observe([a], [1], [False], 4.0, 4.0)
    assert g.S.RF[AUX, a] == pytest.approx(6.0)
    g.observe([a], [1], [True], 4.0, 8.0)             # finished with 2 ms unused: dropped, not owed
    assert g.S.RF[AUX, a] == 0.0
    assert g.counters()[0] == 0.0
    g2 = pool_gate([E], [0.5], replica_slots=1, H=1e6, h=1e9)
    b, _ = g2.arrive(0, 1, 10.0, 2)                   # reserves 2 ms, uses 4 + 4: overrun 6
    c, _ = g2.arrive(0, 1, 10.0, 2)                   # waits: the tenant is in demand from 10 on
    assert g2.admit(10.0) == [b]
    g2.observe([b], [1], [False], 4.0, 14.0)
    assert g2.S.RF[AUX, b] == 0.0
    g2.observe([b], [1], [True], 4.0, 18.0)
    assert g2.admit(18.0) == [c]
    # (10, 18]: owed 0.5 * 1 * 8 = 4, served 8 (the overrun counts as service): d = 4 - 8
    assert g2.counters()[0] == pytest.approx(-4.0)


def test_a_withdrawn_request_leaves_the_queue():
    g = pool_gate([E, E], [0.5, 0.5], replica_slots=1, H=1000.0)
    a, _ = g.arrive(0, 1, 0.0, 300)
    b, _ = g.arrive(0, 1, 0.0, 200)                   # waits
    g.admit(0.0)
    assert state(g)["reserved_ms"][0] == 200.0        # b's, waiting; a runs
    assert g.withdraw(b, 1.0) == "waiting"
    assert state(g)["reserved_ms"][0] == 0.0
    assert g.withdraw(a, 2.0) == "in_flight"
    assert g.arrive(0, 1, 3.0, 500)[1]                # the whole cap free


# --- validation ----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, match", [
    ({"classes": ["gold"]}, "classes"),
    ({"shares": [0.7, 0.6]}, r"add up to 1.3, .*: tenant 0 0.7, tenant 1 0.6"),
    ({"classes": ["spot", "elastic"], "shares": [0.2, 0.5]}, r"shares\[0\] \(tenant 0, spot\) must be 0"),
    ({"shares": [1.5, 0.0]}, r"shares\[0\] = 1.5"),
    ({"shares": [0.5]}, "shares"),
    ({"decode_price_ms": 0.0}, "decode_price_ms"),
    ({"pool_horizon_ms": -1.0}, "pool_horizon_ms"),
    ({"debt_weight": -0.5}, "debt_weight"),
])
def test_bad_parameters_name_the_field(bad, match):
    p = dict(classes=["guaranteed", "elastic"], shares=[0.5, 0.5], decode_price_ms=1.0, replica_slots=4)
    p.update(bad)
    with pytest.raises(ValueError, match=match):
        fairlib.make_policy("token_pool", **p)


def test_the_simulator_needs_the_estimate_column():
    df = pd.DataFrame({"arrival_ms": [0.0], "tenant": [0], "prompt_tokens": [1], "output_tokens": [1]})
    with pytest.raises(ValueError, match="est_output_tokens"):
        fairlib.simulate(df, policy="token_pool", classes=["elastic"], shares=[1.0], decode_price_ms=1.0,
                         replica_slots=4)


# --- capacity ----------------------------------------------------------------------------------
def test_replica_capacity_by_hand():
    """dt = 10 + 1 B + 0.1 P, r = 8. Mix P = 100, O = 50: KV 2000 -> 2000 / 125 = 16 >= 8, so
    concurrency binds, B = 8, u = 18 / 8 = 2.25, c = 10 + 112.5 = 122.5 ms, 8.163 req/s.
    KV 500 -> B = 4: KV binds, u = 14 / 4 = 3.5, c = 10 + 175 = 185 ms."""
    eng = fairlib.Engine(10.0, 1.0, 0.1, 8)
    c = pools.replica_capacity(eng, 100, 50, kv_tokens=2000)
    assert c["binds"] == "concurrency" and c["batch"] == 8
    assert c["machine_ms_per_request"] == pytest.approx(122.5)
    assert c["requests_per_s"] == pytest.approx(1000 / 122.5)
    assert c["output_tokens_per_s"] == pytest.approx(50 * 1000 / 122.5)
    c = pools.replica_capacity(eng, 100, 50, kv_tokens=500)
    assert c["binds"] == "kv" and c["batch"] == pytest.approx(4.0)
    assert c["machine_ms_per_request"] == pytest.approx(185.0)


def test_pool_params_take_the_prices_from_the_engine():
    eng = fairlib.Engine(9.0, 0.55, 0.06, 24)
    p = pools.pool_params(eng, [G, E], [0.3, 0.5], [1000, 5000])
    assert p["decode_price_ms"] == pytest.approx((9 + 0.55 * 24) / 24)
    assert p["prefill_price_ms"] == 0.06 and p["replica_slots"] == 24
    fairlib.make_policy("token_pool", **p)


# --- the gateway in front of simulated replicas ----------------------------------------------------
def _table(n=300, seed=1):
    rng = np.random.default_rng(seed)
    t = np.floor(np.cumsum(rng.exponential(40.0, n)))
    return pd.DataFrame({"arrival_ms": t, "tenant": rng.integers(0, 3, n), "prompt_tokens": rng.integers(8, 400, n),
                         "output_tokens": rng.integers(1, 120, n), "est_output_tokens": rng.integers(1, 120, n)})


def test_one_replica_behind_an_fcfs_gateway_is_the_engine_model():
    """The gateway dispatches at arrival, the replica takes them at its next iteration: what the
    engine model does with its own queue. Costs in 1/16 ms so the times agree to the last bit."""
    df = _table()
    eng = fairlib.Engine(4.0, 0.5, 0.0625, 6)
    ref = fairlib.simulate(df, eng, "fcfs", None, n_tenants=3)
    got = simulate_gateway(df, eng, 1, "fcfs", n_tenants=3, sample_ms=None).requests
    for col in ("first_token_ms", "finish_ms"):
        np.testing.assert_array_equal(got[col].to_numpy(), ref.requests[col].to_numpy(), err_msg=col)
    np.testing.assert_allclose(got["charged_ms"], ref.requests["charged_ms"], rtol=1e-12)


def test_two_replicas_conserve_machine_time_and_respect_a_drain():
    """Every charge adds up to the replicas' busy time; a drained replica gets nothing new."""
    df = _table(400)
    eng = fairlib.Engine(4.0, 0.5, 0.0625, 4)
    params = pools.pool_params(eng, [G, E, S], [0.3, 0.5, 0.0], [500, 5000, 60000], horizon_ms=3000, replicas=2)
    run = simulate_gateway(df, eng, 2, "token_pool", params, events=[(3000.0, 1, "down"), (9000.0, 1, "up")],
                           n_tenants=3, sample_ms=500.0)
    req = run.requests
    sent_to_1 = req[(req["replica"] == 1)]["dispatched_ms"]
    assert not ((sent_to_1 > 3000.0) & (sent_to_1 < 9000.0)).any()
    assert (sent_to_1 >= 9000.0).any()
    busy = run.gate.S.sf[1]                                  # BUSY_MS: the observed steps' times
    assert req["charged_ms"].sum() == pytest.approx(busy, rel=1e-9)
    done = req[~req["rejected"]]
    assert done["finish_ms"].notna().all() and (done["generated"] == done["output_tokens"]).all()
    smp = run.samples
    assert set(smp[(smp["t_ms"] > 3000) & (smp["t_ms"] < 9000)]["replicas"]) == {1}


@pytest.mark.parametrize("policy", ["token_pool", "fcfs"])
def test_a_replayed_log_samples_what_the_run_sampled(policy):
    """``replay_samples`` of the gate's log (what the live chapter reads from a gateway) gives the
    run's own samples: the same charges, waiting lines, rejections, replicas, reservations and
    debts at every instant (two independent paths: the cluster's event loop, the log)."""
    df = _table(400)
    eng = fairlib.Engine(4.0, 0.5, 0.0625, 4)
    params = (pools.pool_params(eng, [G, E, S], [0.3, 0.5, 0.0], [500, 5000, 60000], horizon_ms=3000, replicas=2)
              if policy == "token_pool" else {})
    run = simulate_gateway(df, eng, 2, policy, params, events=[(3000.0, 1, "down"), (9000.0, 1, "up")],
                           horizon_ms=15000.0, n_tenants=3, sample_ms=500.0, record=True)
    gate, smp = replay_samples(run.gate.spec, run.gate.log, 500.0, end_ms=15000.0, replicas=2)
    want = run.samples           # fcfs ignores the replica count, its log still says when it changed
    pd.testing.assert_frame_equal(smp.reset_index(drop=True), want.reset_index(drop=True), check_exact=True)
    assert policy == "fcfs" or smp["debt_ms"].max() > 0 and smp["rejected"].max() > 0
    # from an offset: the same rows
    _, late = replay_samples(run.gate.spec, run.gate.log, 500.0, start_ms=6000.0, end_ms=15000.0, replicas=2)
    pd.testing.assert_frame_equal(late.reset_index(drop=True),
                                  want[want["t_ms"] >= 6000.0].reset_index(drop=True), check_exact=True)
    with pytest.raises(ValueError, match="sample_ms"):
        replay_samples(run.gate.spec, run.gate.log, 0)


def test_bad_replica_events_name_the_field():
    df = _table(5)
    with pytest.raises(ValueError, match="replica"):
        simulate_gateway(df, fairlib.Engine(), 2, events=[(1.0, 2, "down")])
    with pytest.raises(ValueError, match="down"):
        simulate_gateway(df, fairlib.Engine(), 2, events=[(1.0, 0, "off")])


def test_kv_capacity_from_vllm_metrics():
    """vLLM states its cache in an info sample's labels: 1,234 blocks of 16 tokens hold 19,744."""
    text = ("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
            "# TYPE vllm:cache_config_info gauge\n"
            'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="False",'
            'gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="1234",swap_space="4"} 1.0\n'
            'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0\n')
    assert pools.kv_capacity_from_metrics(text) == {"num_gpu_blocks": 1234, "block_size": 16, "tokens": 19744}
    with pytest.raises(ValueError, match="no vllm:cache_config_info"):
        pools.kv_capacity_from_metrics("vllm:num_requests_running 0\n")
    with pytest.raises(ValueError, match=r"no label\(s\) \['num_gpu_blocks'\]"):
        pools.kv_capacity_from_metrics('vllm:cache_config_info{block_size="16"} 1.0\n')
    with pytest.raises(ValueError, match="must be integers"):
        pools.kv_capacity_from_metrics('vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n')


def test_a_limit_counted_after_the_response_lets_a_burst_through():
    """Limit 100 machine-ms per 1 s window, each request costs u O = 10 x 5 = 50: the four sent at
    once all pass (nothing is counted until one finishes, at 50 ms), the window counts 200 (2x
    the limit); one at 500 ms is refused until the next window (Retry-After 500 ms); one at 1 s
    passes. ``simulate_gateway`` applies it in front of the gate."""
    from fairlib.sim.limiters import CountAfterResponse

    eng = fairlib.Engine(10.0, 0.0, 0.0, 4)
    df = pd.DataFrame({"arrival_ms": [0.0, 0.0, 0.0, 0.0, 500.0, 1000.0], "tenant": [0] * 6,
                       "prompt_tokens": [3] * 6, "output_tokens": [5] * 6})
    lim = CountAfterResponse([100.0], 1000.0, prefill_price_ms=0.0, decode_price_ms=10.0)
    run = simulate_gateway(df, eng, 1, "fcfs", n_tenants=1, sample_ms=None, limiter=lim)
    req = run.requests
    assert list(req["rejected"]) == [False, False, False, False, True, False]
    assert list(req["finish_ms"][:4]) == [50.0] * 4 and req["retry_after_ms"][4] == 500.0
    assert req["finish_ms"][5] == 1050.0 and lim.used[0] == 50.0 and lim.window[0] == 1
    # what the first window counted: the four, 2x the limit
    lim2 = CountAfterResponse([100.0], 1000.0, 0.0, 10.0)
    simulate_gateway(df.iloc[:5], eng, 1, "fcfs", n_tenants=1, sample_ms=None, limiter=lim2)
    assert lim2.used[0] == 200.0
    with pytest.raises(ValueError, match="limits_ms"):
        CountAfterResponse([0.0], 1000.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="window_ms"):
        CountAfterResponse([1.0], 0.0, 0.0, 1.0)


def test_overshoot_workload_sends_bursts_of_k_at_twice_the_share():
    from fairlib.chapters import token_pools as tp
    eng = fairlib.Engine(4.0, 0.5, 0.0625, 16)
    df = tp.overshoot_workload(16, eng, seed=3, duration_s=120.0)
    b = df[df["tenant"] == 0]
    sizes = b.groupby("arrival_ms").size()
    assert (sizes == 16).all() and (b["output_tokens"] == tp.BURSTY.output).all()
    c = eng.prefill_ms_per_token * tp.BURSTY.prompt + pools.decode_price_ms(eng) * tp.BURSTY.output
    gaps = np.diff(sizes.index.to_numpy())
    np.testing.assert_allclose(gaps, 16 * c / tp.BURSTY.rho)          # offered machine time: rho = 1.0
    assert (df.loc[df["tenant"] == 1, "est_output_tokens"] == df.loc[df["tenant"] == 1, "output_tokens"]).all()
    with pytest.raises(ValueError, match="burst size"):
        tp.overshoot_workload(0, eng, 0)
    with pytest.raises(ValueError, match="variant"):
        tp.overshoot_run(1, "none")


def _fake_pools_run(tmp_path, events, replicas=2, duration_s=90.0):
    """A saved-run stand-in for the live chapter's analysis: the gateway's state and event log."""
    import json as _json
    from types import SimpleNamespace
    (tmp_path / "gateway.json").write_text(_json.dumps({"t0_wall": 1000.0}))
    (tmp_path / "gateway_events.jsonl").write_text(
        "".join(_json.dumps(e) + "\n" for e in [{"spec": {}, "tenants": []}] + events))
    return SimpleNamespace(path=str(tmp_path), duration_s=duration_s, summary={"start_wall": 1002.0},
                           extra={"pools": {"replicas": replicas, "duration_s": duration_s}})


def test_the_live_outage_is_the_first_loss_to_the_next_full_pool(tmp_path):
    """Gateway clock 2 s ahead of the run: a drain logged at 27 s is 25 s into the run; a health
    check that flapped (2 -> 1 -> 2 inside the outage would end it, 1 -> 0 -> 1 does not)."""
    from fairlib.chapters import token_pools_live as tl
    run = _fake_pools_run(tmp_path, [["replicas", 27000.0, 1], ["replicas", 40000.0, 0], ["replicas", 41000.0, 1],
                                     ["replicas", 57000.0, 2]])
    assert tl.replicas_events(run) == [(25.0, 1), (38.0, 0), (39.0, 1), (55.0, 2)]
    assert tl.outage(run) == (25.0, 55.0)
    assert [p[0] for p in tl._phases(run)] == ["before", "one replica", "after"]
    assert tl._sim_events(run) == [(25000.0, 1, "down"), (38000.0, 0, "down"), (39000.0, 0, "up"),
                                   (55000.0, 1, "up")]                          # the model follows the count
    (tmp_path / "b").mkdir()
    never_back = _fake_pools_run(tmp_path / "b", [["replicas", 12000.0, 1]])
    assert tl.outage(never_back) == (10.0, 90.0)
    (tmp_path / "c").mkdir()
    none = _fake_pools_run(tmp_path / "c", [])
    assert tl.outage(none) is None and tl._phases(none) == [("whole run", 0.0, 90.0)]


def test_limiter_and_kv_errors_name_the_field():
    from fairlib.sim.limiters import CountAfterResponse
    lim = CountAfterResponse([10.0, 20.0], 1000.0, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"tenant must be an index in 0..1"):
        lim.allow(2, 0.0)
    assert lim.retry_after_ms(0, 1000.0) == 1000.0 and lim.retry_after_ms(0, 999.0) == 1.0
    with pytest.raises(ValueError, match="must be >= 1"):
        pools.kv_capacity_from_metrics('vllm:cache_config_info{block_size="16",num_gpu_blocks="0"} 1.0\n')


def test_replay_samples_from_a_fractional_start_keeps_every_instant():
    """Samples at start + k x step, computed, not accumulated: from 0.1 ms in steps of 0.1 ms up
    to 1.0 ms there are ten, the last exactly at the end."""
    gate = PolicyGate("fcfs", n_tenants=1, slots=1, record=True)
    rid, _ = gate.arrive(0, 1, 0.05)
    gate.admit(0.05)
    gate.observe([rid], [1], [True], 0.9, 0.95)
    _, smp = replay_samples(gate.spec, gate.log, 0.1, start_ms=0.1, end_ms=1.0)
    assert len(smp) == 10 and smp["t_ms"].iloc[-1] == pytest.approx(1.0)
    assert list(smp["in_flight"]) == [1] * 9 + [0]
    with pytest.raises(ValueError, match="end_ms"):
        replay_samples(gate.spec, gate.log, 0.1, end_ms=float("inf"))


@pytest.mark.parametrize("kw, match", [
    ({"endpoints": "http://a/v1"}, "not one string"),
    ({"kind": "nope"}, "kind must be one of"),
    ({"variants": {"zzz": ["fcfs"]}}, r"unknown experiment 'zzz'; allowed: flood, loss"),
    ({"variants": {"flood": "fcfs"}}, r"variants\['flood'\]: a list"),
    ({"variants": {"flood": ["nope"]}}, r"unknown \['nope'\]; allowed: fcfs, pool_estimate, pool_max_tokens"),
])
def test_live_measure_names_bad_arguments_before_it_sends_anything(kw, match):
    from fairlib.chapters import token_pools_measure as tm
    args = {"endpoints": ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"], "kind": "llamacpp", **kw}
    with pytest.raises(ValueError, match=match):
        tm.measure(args.pop("endpoints"), args.pop("kind"), "data/engines/llamacpp.json", **args)
