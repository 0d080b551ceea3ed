"""Hand-computed cases of the engine model (book/engine-model.md), run against both simulators.

Every expected value below was worked out by hand from the contract, iteration by
iteration, and is written out in the comments; none was read off an implementation.
Each case runs twice, through the ``sim`` fixture: against ``tests/reference_sim.py``
(``[reference]``) and against ``fairlib.simulate`` (``[compiled]``, through
``sim_harness.compiled_simulate``, which gives the compiled result the reference's
``(req, ten, run)`` shape). To run the cases against another simulator, add it to
``sim_harness.SIMULATORS``.

Unless stated otherwise the engine is  base = 10 ms, slope = 1 ms/seq, prefill = 0.1 ms/token,
so an iteration costs  dt = 10 + B + 0.1 * P  and charges  per_seq = (10 + B) / B  to each
running sequence plus  0.1 * prefill tokens  to each admitted one.
"""

import math

import pandas as pd
import pytest

from sim_harness import SIMULATORS, compiled_result

ENGINE = dict(iter_base_ms=10.0, iter_slope_ms=1.0, prefill_ms_per_token=0.1)


@pytest.fixture(params=["reference", "compiled"])
def sim(request):
    """sim(rows, n_tenants, max_batch=8, **kw) -> (req, ten, run) on one implementation.
    rows: list of dicts (arrival_ms, tenant, prompt_tokens, output_tokens, ...)."""
    simulate = SIMULATORS[request.param]

    def run_case(rows, n_tenants, max_batch=8, **kw):
        df = pd.DataFrame(rows)
        params = dict(ENGINE)
        params.update(kw)
        req, ten, run = simulate(df, n_tenants=n_tenants, max_batch=max_batch, **params)
        check_accounting(req, ten, run, df)
        return req, ten, run

    return run_case


def R(a, tenant, p, o, **extra):
    d = dict(arrival_ms=float(a), tenant=tenant, prompt_tokens=p, output_tokens=o)
    d.update(extra)
    return d


def close(actual, expected):
    """Element-wise equality of two lists of floats; NaN matches NaN."""
    assert len(actual) == len(expected), (actual, expected)
    for a, e in zip(actual, expected):
        if isinstance(e, float) and math.isnan(e):
            assert math.isnan(a), (actual, expected)
        else:
            assert a == pytest.approx(e, rel=1e-12, abs=1e-12), (actual, expected)


def check_accounting(req, ten, run, df):
    """Invariants that hold in every case: charges sum to the busy time, shares to 1,
    per-request charges to the tenant's machine time, tokens to the run's tokens."""
    n = len(ten["machine_ms"])
    assert sum(ten["machine_ms"]) == pytest.approx(run["busy_ms"], rel=1e-12)
    for u in range(n):
        assert ten["machine_ms"][u] == pytest.approx(ten["prefill_ms"][u] + ten["decode_ms"][u], rel=1e-12)
        mine = [c for c, tu in zip(req["charged_ms"], df["tenant"]) if tu == u]
        assert sum(mine) == pytest.approx(ten["machine_ms"][u], rel=1e-12, abs=1e-12)
        gen = [g for g, tu in zip(req["generated"], df["tenant"]) if tu == u]
        assert sum(gen) == ten["decode_tokens"][u]
    assert sum(ten["decode_tokens"]) == run["decode_tokens"]
    if run["busy_ms"] > 0:
        assert sum(ten["share"]) == pytest.approx(1.0, rel=1e-12)


# ---------------------------------------------------------------------------------------
# fcfs: the basic iteration
# ---------------------------------------------------------------------------------------


def test_fcfs_two_requests(sim):
    # r0: tenant 0, prompt 10, output 2; r1: tenant 1, prompt 20, output 3; both at t=0.
    # it1 t=0 : admit r0, r1; B=2, P=30: dt = 10 + 2 + 3 = 15 -> t=15; per_seq = 12/2 = 6
    #           charges r0 = 1.0 + 6 = 7, r1 = 2.0 + 6 = 8; both emit their first token at 15
    # it2 t=15: B=2, dt = 12 -> t=27; per_seq 6; r0 reaches 2 tokens: finishes at 27
    #           charges r0 = 13, r1 = 14
    # it3 t=27: B=1, dt = 11 -> t=38; per_seq 11; r1 finishes at 38; r1 = 25
    req, ten, run = sim([R(0, 0, 10, 2), R(0, 1, 20, 3)], n_tenants=2, policy="fcfs")
    assert req["rejected"] == [False, False]
    close(req["admitted_ms"], [0.0, 0.0])
    close(req["first_token_ms"], [15.0, 15.0])
    close(req["finish_ms"], [27.0, 38.0])
    assert req["generated"] == [2, 3]
    close(req["charged_ms"], [13.0, 25.0])
    assert req["preemptions"] == [0, 0]
    close(ten["machine_ms"], [13.0, 25.0])
    close(ten["prefill_ms"], [1.0, 2.0])
    close(ten["decode_ms"], [12.0, 23.0])
    assert ten["decode_tokens"] == [2, 3]
    assert ten["requests_admitted"] == [1, 1]
    assert ten["requests_finished"] == [1, 1]
    assert ten["requests_rejected"] == [0, 0]
    close(ten["share"], [13.0 / 38.0, 25.0 / 38.0])
    assert run["busy_ms"] == pytest.approx(38.0)
    assert run["iterations"] == 3
    assert run["decode_tokens"] == 5


ROWS_IDLE = [R(0, 0, 10, 1), R(5, 0, 10, 1), R(100, 1, 10, 2)]


def test_fcfs_arrival_during_iteration_and_idle_gap(sim):
    # it1 t=0  : r0 admitted; B=1, P=10: dt = 12 -> t=12; r0 finishes at 12
    # it2 t=12 : r1 (arrived at 5, during it1) delivered now, admitted at 12; dt 12 -> t=24
    # t=24     : nothing runs -> idle jump to the next arrival, t=100
    # it3 t=100: r2 admitted; dt 12 -> t=112 (first token); it4: dt 11 -> t=123 finish
    req, ten, run = sim(ROWS_IDLE, n_tenants=2, policy="fcfs")
    close(req["admitted_ms"], [0.0, 12.0, 100.0])
    close(req["first_token_ms"], [12.0, 24.0, 112.0])
    close(req["finish_ms"], [12.0, 24.0, 123.0])
    close(req["charged_ms"], [12.0, 12.0, 23.0])
    assert run["busy_ms"] == pytest.approx(47.0)  # the idle gap 24..100 is not busy time
    assert run["iterations"] == 4
    close(ten["share"], [24.0 / 47.0, 23.0 / 47.0])


def test_horizon_completes_the_started_iteration(sim):
    # horizon 20: it1 (t=0) and it2 (t=12 < 20) run, it2 ends at 24 > 20 and completes;
    # at t=24 the loop stops. r2 is never delivered: not rejected, everything NaN.
    req, ten, run = sim(ROWS_IDLE, n_tenants=2, policy="fcfs", horizon_ms=20.0)
    close(req["finish_ms"], [12.0, 24.0, math.nan])
    close(req["admitted_ms"], [0.0, 12.0, math.nan])
    assert req["rejected"] == [False, False, False]
    assert req["generated"] == [1, 1, 0]
    assert run["iterations"] == 2
    assert run["busy_ms"] == pytest.approx(24.0)
    close(ten["share"], [1.0, 0.0])


def test_horizon_after_idle_jump_and_running_at_end(sim):
    # horizon 50: after it2 (t=24) the idle jump goes to t=100 >= 50: the run ends.
    req, ten, run = sim(ROWS_IDLE, n_tenants=2, policy="fcfs", horizon_ms=50.0)
    close(req["finish_ms"], [12.0, 24.0, math.nan])
    assert run["iterations"] == 2
    # horizon 110: it3 starts at 100 < 110 and ends at 112 >= 110; r2 keeps 1 token and
    # its charge 0.1*10 + 11 = 12, finish_ms NaN.
    req, ten, run = sim(ROWS_IDLE, n_tenants=2, policy="fcfs", horizon_ms=110.0)
    close(req["finish_ms"], [12.0, 24.0, math.nan])
    close(req["first_token_ms"], [12.0, 24.0, 112.0])
    assert req["generated"] == [1, 1, 1]
    close(req["charged_ms"], [12.0, 12.0, 12.0])
    assert ten["requests_finished"] == [2, 0]
    assert ten["requests_admitted"] == [2, 1]
    assert run["busy_ms"] == pytest.approx(36.0)


def test_max_batch(sim):
    # max_batch 1. r0 (out 2), r1 (out 1), both at 0.
    # it1 t=0: r0 admitted, dt 12 -> 12; it2: batch full, dt 11 -> 23, r0 finishes
    # it3 t=23: r1 admitted, dt 12 -> 35
    req, ten, run = sim([R(0, 0, 10, 2), R(0, 1, 10, 1)], n_tenants=2, max_batch=1, policy="fcfs")
    close(req["admitted_ms"], [0.0, 23.0])
    close(req["finish_ms"], [23.0, 35.0])
    close(ten["machine_ms"], [23.0, 12.0])


def test_max_prefill_tokens_no_skipping_and_engine_rejection(sim):
    # budget 25. r0 p20, r1 p10, r2 p5 (tenant 0); r3 p30 (tenant 1) > 25: rejected by the
    # engine at arrival. All output 1, all at t=0.
    # it1 t=0 : r0 (P=20); r1 would make 30 > 25: stop. r2 would fit but nothing is skipped.
    #           B=1: dt = 11 + 2 = 13 -> t=13
    # it2 t=13: r1 (P=10), r2 (P=15); B=2: dt = 12 + 1.5 = 13.5 -> t=26.5
    rows = [R(0, 0, 20, 1), R(0, 0, 10, 1), R(0, 0, 5, 1), R(0, 1, 30, 1)]
    req, ten, run = sim(rows, n_tenants=2, policy="fcfs", max_prefill_tokens=25)
    assert req["rejected"] == [False, False, False, True]
    close(req["admitted_ms"], [0.0, 13.0, 13.0, math.nan])
    close(req["finish_ms"], [13.0, 26.5, 26.5, math.nan])
    # per_seq in it2 = 12/2 = 6: r1 = 1.0 + 6, r2 = 0.5 + 6
    close(req["charged_ms"], [13.0, 7.0, 6.5, 0.0])
    assert ten["requests_rejected"] == [0, 1]
    assert ten["requests_admitted"] == [3, 0]
    close(ten["share"], [1.0, 0.0])
    assert run["busy_ms"] == pytest.approx(26.5)


def test_nothing_delivered_share_nan(sim):
    # the only request is impossible for the engine: no busy time, share NaN
    req, ten, run = sim([R(0, 0, 30, 1)], n_tenants=1, policy="fcfs", max_prefill_tokens=25)
    assert req["rejected"] == [True]
    assert run["busy_ms"] == 0.0 and run["iterations"] == 0
    assert math.isnan(ten["share"][0])


# ---------------------------------------------------------------------------------------
# rpm_quota
# ---------------------------------------------------------------------------------------


def test_rpm_quota(sim):
    # limit 2; all prompt 10, output 1 (each request alone costs dt = 12)
    # r0 t0 a=0      accepted (window (-60000, 0]: none)
    # r1 t0 a=10     accepted (window has r0)
    # r2 t0 a=20     rejected (r0, r1 in (-59980, 20])
    # r3 t1 a=20     accepted (other tenant)
    # r4 t0 a=60000  window (0, 60000]: r1 only (r0 at 0 is out, r2 was rejected): accepted
    # r5 t0 a=60010  window (10, 60010]: r4 only (r1 at 10 is out): accepted
    # r6 t0 a=60015  window (15, 60015]: r4, r5: rejected
    # times: it1 t=0 r0 -> 12; it2 t=12 r1 (delivered) -> 24; it3 t=24 r2 rejected, r3 -> 36;
    # idle to 60000: r4 -> 60012; t=60012: r5 -> 60024; t=60024: r6 rejected, nothing left.
    rows = [R(0, 0, 10, 1), R(10, 0, 10, 1), R(20, 0, 10, 1), R(20, 1, 10, 1),
            R(60000, 0, 10, 1), R(60010, 0, 10, 1), R(60015, 0, 10, 1)]
    req, ten, run = sim(rows, n_tenants=2, policy="rpm_quota", limit=2)
    assert req["rejected"] == [False, False, True, False, False, False, True]
    close(req["admitted_ms"], [0.0, 12.0, math.nan, 24.0, 60000.0, 60012.0, math.nan])
    close(req["finish_ms"], [12.0, 24.0, math.nan, 36.0, 60012.0, 60024.0, math.nan])
    assert ten["requests_rejected"] == [2, 0]
    assert ten["requests_admitted"] == [4, 1]
    assert run["iterations"] == 5


def test_rpm_quota_rejections_do_not_count(sim):
    # limit 1. t0: a=0 accepted; a=59999.5 rejected (0 is in (-0.5, 59999.5]);
    # a=60000 accepted: (0, 60000] holds no accepted request (0 excluded, 59999.5 rejected).
    rows = [R(0, 0, 10, 1), R(59999.5, 0, 10, 1), R(60000, 0, 10, 1)]
    req, ten, run = sim(rows, n_tenants=1, policy="rpm_quota", limit=1)
    assert req["rejected"] == [False, True, False]
    close(req["finish_ms"], [12.0, math.nan, 60012.0])


# ---------------------------------------------------------------------------------------
# vtc / lcf / residency
# ---------------------------------------------------------------------------------------

# max_batch 1; every request prompt 10, output 1, so every iteration is dt = 12.
# t0: r0, r1, r2 at 0; t1: r3, r4 at 1.
ROWS_LIFT = [R(0, 0, 10, 1), R(0, 0, 10, 1), R(0, 0, 10, 1), R(1, 1, 10, 1), R(1, 1, 10, 1)]


def test_vtc_counter_lift(sim):
    # wp 1, wq 2.
    # it1 t=0 : r0..r2 delivered (t0 had no other backlogged tenant: no lift, c0 = 0).
    #           t0 -> r0, c0 = 10; end: c0 = 12. t=12
    # it2 t=12: r3 delivered: t1's line empty -> non-empty, t0 backlogged with 12:
    #           c1 = max(0, 12) = 12. r4: line not empty, no lift.
    #           tie 12/12 -> lowest index t0 -> r1, c0 = 22 -> 24. t=24
    # it3 t=24: c1 12 -> r3, c1 = 22 -> 24. t=36
    # it4 t=36: tie 24/24 -> t0 -> r2. t=48
    # it5 t=48: r4. t=60
    req, ten, run = sim(ROWS_LIFT, n_tenants=2, max_batch=1, policy="vtc", wp=1.0, wq=2.0)
    close(req["finish_ms"], [12.0, 24.0, 48.0, 36.0, 60.0])
    close(req["admitted_ms"], [0.0, 12.0, 36.0, 24.0, 48.0])


def test_lcf_no_lift(sim):
    # as above without the lift: at it2 c1 = 0 < c0 = 12 -> r3 (c1 = 12);
    # it3: tie 12/12 -> t0 r1 (c0 = 24); it4: c1 12 -> r4 (c1 = 24); it5: r2.
    req, ten, run = sim(ROWS_LIFT, n_tenants=2, max_batch=1, policy="lcf")
    close(req["finish_ms"], [12.0, 36.0, 60.0, 24.0, 48.0])


def test_vtc_admission_charge_counts_for_the_next_pick(sim):
    # max_batch 2. t0: r0, r1; t1: r2; all at 0, prompt 10, output 1.
    # delivery: r0 (c0 = 0), r1, r2 (lift to max(0, c0 = 0) = 0).
    # it1 t=0: tie -> t0 -> r0, c0 = 10 at admission; next pick c1 = 0 < 10 -> r2.
    #          B=2, P=20: dt = 12 + 2 = 14 -> t=14. c0 = c1 = 12.
    # it2 t=14: r1, dt 12 -> 26.
    rows = [R(0, 0, 10, 1), R(0, 0, 10, 1), R(0, 1, 10, 1)]
    req, ten, run = sim(rows, n_tenants=2, max_batch=2, policy="vtc")
    close(req["finish_ms"], [14.0, 26.0, 14.0])


def test_vtc_weights(sim):
    # weights [1, 2], max_batch 1, all at 0, prompt 10, output 1 (dt 12 each).
    # t0: r0, r1, r2; t1: r3, r4, r5. Delivery: c0 = 0, r3 lifts c1 to max(0, 0) = 0.
    # it1: tie -> t0 r0: c0 = 10 + 2 = 12
    # it2: c1 0 -> r3: c1 = 10/2 + 2/2 = 6
    # it3: c1 6 -> r4: c1 = 12
    # it4: tie 12/12 -> t0 r1: c0 = 24
    # it5: c1 12 -> r5: c1 = 18
    # it6: r2
    rows = [R(0, 0, 10, 1)] * 3 + [R(0, 1, 10, 1)] * 3
    req, ten, run = sim(rows, n_tenants=2, max_batch=1, policy="vtc", weights=[1.0, 2.0])
    close(req["finish_ms"], [12.0, 48.0, 72.0, 24.0, 36.0, 60.0])


# max_batch 1. t0: r0, r1 prompt 100, output 1; t1: r2, r3 prompt 10, output 3. All at 0.
ROWS_RESIDENCY = [R(0, 0, 100, 1), R(0, 0, 100, 1), R(0, 1, 10, 3), R(0, 1, 10, 3)]


def test_residency(sim):
    # counter charged the machine ms. Delivery: c0 = 0; r2 lifts c1 to max(0, 0) = 0.
    # it1 t=0 : tie -> t0 r0: c0 += 0.1*100 = 10; P=100: dt = 11 + 10 = 21 -> t=21;
    #           per_seq 11: c0 = 21
    # it2 t=21: c1 0 -> r2: c1 = 1.0; dt = 11 + 1 = 12 -> t=33; c1 = 12
    # it3, it4: r2 decodes, dt 11 each -> 44, 55 (finish); c1 = 34
    # it5 t=55: c0 21 < 34 -> r1: dt 21 -> t=76 (finish); c0 = 42
    # it6 t=76: r3: 12 -> 88, 11 -> 99, 11 -> 110
    req, ten, run = sim(ROWS_RESIDENCY, n_tenants=2, max_batch=1, policy="residency")
    close(req["admitted_ms"], [0.0, 55.0, 21.0, 76.0])
    close(req["finish_ms"], [21.0, 76.0, 55.0, 110.0])
    close(ten["machine_ms"], [42.0, 68.0])


def test_vtc_on_the_residency_workload(sim):
    # token counters instead: it1 r0: c0 = 100 + 2 = 102; it2..4 r2: c1 = 10 + 2*3 = 16
    # (t = 21, 33, 44, 55); it5: c1 16 < 102 -> r3: 55 -> 67 -> 78 -> 89; it8: r1 89 -> 110
    req, ten, run = sim(ROWS_RESIDENCY, n_tenants=2, max_batch=1, policy="vtc")
    close(req["finish_ms"], [21.0, 110.0, 55.0, 89.0])


# ---------------------------------------------------------------------------------------
# slot_cap, priority, weighted, sjf, aging
# ---------------------------------------------------------------------------------------


def test_slot_cap(sim):
    # cap 1, max_batch 3. r0 t0 (out 2), r1 t0 (out 1), r2 t1 (out 1), all at 0, prompt 10.
    # it1 t=0 : r0 admitted (t0 runs 1); r1 skipped (t0 at cap, counting r0 admitted just now);
    #           r2 admitted. B=2, P=20: dt = 14 -> t=14; r2 finishes, r0 has 1 token.
    # it2 t=14: r0 still runs -> r1 skipped, nothing else: dt 11 -> t=25; r0 finishes.
    # it3 t=25: r1 admitted, dt 12 -> t=37.
    rows = [R(0, 0, 10, 2), R(0, 0, 10, 1), R(0, 1, 10, 1)]
    req, ten, run = sim(rows, n_tenants=2, max_batch=3, policy="slot_cap", cap=1)
    close(req["admitted_ms"], [0.0, 25.0, 0.0])
    close(req["finish_ms"], [25.0, 37.0, 14.0])
    # charges (it1 per_seq = 12/2 = 6): r0 = 1 + 6 + 11 = 18, r2 = 1 + 6 = 7, r1 = 1 + 11 = 12
    close(req["charged_ms"], [18.0, 12.0, 7.0])


def test_priority(sim):
    # max_batch 1, prompt 10, output 1 (dt 12). priority: r0 1, r1 0, r2 1, r3 0 at t=0;
    # r4 priority 0 at a=5.
    # it1 t=0 : lowest priority, table order -> r1. t=12
    # it2 t=12: r4 delivered; priority-0 waiting: r3, r4 -> r3 (table order). t=24
    # it3: r4 -> 36; it4: r0 -> 48; it5: r2 -> 60
    rows = [R(0, 0, 10, 1, priority=1), R(0, 0, 10, 1, priority=0), R(0, 0, 10, 1, priority=1),
            R(0, 0, 10, 1, priority=0), R(5, 0, 10, 1, priority=0)]
    req, ten, run = sim(rows, n_tenants=1, max_batch=1, policy="priority")
    close(req["finish_ms"], [48.0, 12.0, 60.0, 24.0, 36.0])


def test_priority_falls_back_to_klass(sim):
    rows = [R(0, 0, 10, 1, klass=1), R(0, 0, 10, 1, klass=0), R(0, 0, 10, 1, klass=1),
            R(0, 0, 10, 1, klass=0), R(5, 0, 10, 1, klass=0)]
    req, ten, run = sim(rows, n_tenants=1, max_batch=1, policy="priority")
    close(req["finish_ms"], [48.0, 12.0, 60.0, 24.0, 36.0])


def test_weighted_rotation(sim):
    # w = [2, 1]: rotation 0,0,1. max_batch 1, dt 12 each. class 0: r0, r1, r2; class 1: r3, r4, r5.
    # it1 ptr 0: slot0 -> r0, ptr 1    it2: slot1 -> r1, ptr 2    it3: slot2 -> r3, ptr 0
    # it4: slot0 -> r2, ptr 1          it5: slot1 (class 0 empty) -> slot2 -> r4, ptr 0
    # it6: slots 0, 1 empty -> slot2 -> r5
    rows = [R(0, 0, 10, 1, klass=0)] * 3 + [R(0, 0, 10, 1, klass=1)] * 3
    req, ten, run = sim(rows, n_tenants=1, max_batch=1, policy="weighted", w=[2, 1])
    close(req["finish_ms"], [12.0, 24.0, 48.0, 36.0, 60.0, 72.0])


def test_weighted_pointer_follows_the_chosen_slot(sim):
    # w = [1, 1, 1]: rotation 0,1,2. r0 class 1, r1 class 1, r2 class 2, all at 0; max_batch 1.
    # it1 ptr 0: class 0 empty -> slot1 -> r0; ptr = chosen + 1 = 2
    # it2: slot2 -> r2, ptr 0;  it3: slot0 empty -> slot1 -> r1
    rows = [R(0, 0, 10, 1, klass=1), R(0, 0, 10, 1, klass=1), R(0, 0, 10, 1, klass=2)]
    req, ten, run = sim(rows, n_tenants=1, max_batch=1, policy="weighted", w=[1, 1, 1])
    close(req["finish_ms"], [12.0, 36.0, 24.0])


def test_weighted_pointer_stays_when_admission_stops(sim):
    # w = [1, 1]; max_batch 4, max_prefill_tokens 25. r0 class 0, r1 class 1, r2 class 0; all
    # prompt 20, output 1, at 0.
    # it1 t=0 : ptr 0 -> r0 (P=20), ptr 1; next: slot1 -> r1: 40 > 25, stop, ptr stays 1.
    #           dt = 11 + 2 = 13 -> t=13
    # it2 t=13: ptr 1 -> r1, ptr 0; next slot0 -> r2: 40 > 25 stop. t=26
    # it3 t=26: r2 -> t=39
    rows = [R(0, 0, 20, 1, klass=0), R(0, 0, 20, 1, klass=1), R(0, 0, 20, 1, klass=0)]
    req, ten, run = sim(rows, n_tenants=1, max_batch=4, policy="weighted", w=[1, 1],
                        max_prefill_tokens=25)
    close(req["finish_ms"], [13.0, 26.0, 39.0])


def test_sjf(sim):
    # est 5, 3, 3, 1 (the realised output is 1 for all: sjf must read the estimate).
    # max_batch 1, dt 12: r3 -> 12, r1 -> 24, r2 -> 36 (tie with r1 by table order), r0 -> 48
    rows = [R(0, 0, 10, 1, est_output_tokens=e) for e in (5, 3, 3, 1)]
    req, ten, run = sim(rows, n_tenants=1, max_batch=1, policy="sjf")
    close(req["finish_ms"], [48.0, 24.0, 36.0, 12.0])


ROWS_AGING = [R(0, 0, 10, 3, klass=0), R(0, 0, 10, 1, klass=1), R(20, 0, 10, 1, klass=0)]


def test_aging(sim):
    # rate 100 (one class level per 10 ms waited). max_batch 1.
    # it1 t=0: r0 (class 0 beats r1 class 1: scores 0 vs 1); dt 12 -> 12; 11 -> 23; 11 -> 34 finish
    # (r2 arrives at 20, delivered at t=23.)
    # t=34: r1: 1 - 100*34/1000 = -2.4;  r2: 0 - 100*14/1000 = -1.4  -> r1 (-> 46), then r2 (-> 58)
    req, ten, run = sim(ROWS_AGING, n_tenants=1, max_batch=1, policy="aging", rate=100.0)
    close(req["finish_ms"], [34.0, 46.0, 58.0])


def test_aging_rate_zero_is_class_order(sim):
    # rate 0: at t=34 r2 (class 0) beats r1 (class 1): r2 -> 46, r1 -> 58
    req, ten, run = sim(ROWS_AGING, n_tenants=1, max_batch=1, policy="aging", rate=0.0)
    close(req["finish_ms"], [34.0, 58.0, 46.0])


# ---------------------------------------------------------------------------------------
# KV capacity and preemption
# ---------------------------------------------------------------------------------------


def test_kv_preemption_fcfs(sim):
    # kv 29, max_batch 4. r0 t0 (p10, out 5), r1 t1 (p10, out 5) at 0;
    # r2 t1 (p20, out 10) at 0: 30 > 29 -> rejected by the engine; r3 t0 (p2, out 1) at 40.
    # it1 t=0 : need 11 + 11 = 22 <= 29: both admitted; P=20, B=2: dt 14 -> t=14; 7 each
    # it2..4  : need 24, 26, 28 <= 29; dt 12 each -> t=26, 38, 50; 6 each -> 25 each, 4 tokens
    # it5 t=50: r3 delivered. need = 15 + 15 = 30 > 29: preempt the latest entry; both entered
    #           in it1 -> the later table position, r1 (held aside). need(r0) = 15.
    #           Admission: r1 is held aside, so r3 is first: need 15 + 3 = 18 <= 29, admitted.
    #           (Were r1 back in line it would be first, not fit (30 > 29), and block r3.)
    #           B=2, P=2: dt = 12 + 0.2 = 12.2 -> t=62.2; r0 (5 tokens) and r3 finish.
    #           per_seq 6: r0 = 31, r3 = 0.2 + 6 = 6.2. r1 back in line.
    # it6 t=62.2: r1 re-admitted: prefill 10 + 4 = 14, need 15. dt = 11 + 1.4 = 12.4 -> t=74.6;
    #           r1 emits its 5th token, finishes. r1 = 25 + 1.4 + 11 = 37.4
    rows = [R(0, 0, 10, 5), R(0, 1, 10, 5), R(0, 1, 20, 10), R(40, 0, 2, 1)]
    req, ten, run = sim(rows, n_tenants=2, max_batch=4, policy="fcfs", kv_capacity_tokens=29)
    assert req["rejected"] == [False, False, True, False]
    close(req["admitted_ms"], [0.0, 0.0, math.nan, 50.0])
    close(req["first_token_ms"], [14.0, 14.0, math.nan, 62.2])
    close(req["finish_ms"], [62.2, 74.6, math.nan, 62.2])
    assert req["preemptions"] == [0, 1, 0, 0]
    assert req["generated"] == [5, 5, 0, 1]
    close(req["charged_ms"], [31.0, 37.4, 0.0, 6.2])
    close(ten["prefill_ms"], [1.2, 2.4])
    close(ten["machine_ms"], [37.2, 37.4])
    assert ten["requests_admitted"] == [2, 1]
    assert ten["requests_rejected"] == [0, 1]
    assert ten["decode_tokens"] == [6, 5]
    assert run["busy_ms"] == pytest.approx(74.6)
    assert run["iterations"] == 6


def test_kv_preempts_latest_entry_not_latest_table_position(sim):
    # priority policy, kv 28, max_prefill_tokens 15, max_batch 4.
    # r0 tenant 0 (priority 1), r1 tenant 1 (priority 0), both p10, out 5, at 0.
    # it1 t=0 : r1 first (priority 0), P=10; r0 would make P=20 > 15: stop. dt 12 -> 12. r1 = 12
    # it2 t=12: need(r1) = 12; r0: 12 + 11 = 23 <= 28, admitted (entry it2). dt 12 + 1 = 13 -> 25
    #           per_seq 6: r1 = 18, r0 = 1 + 6 = 7
    # it3 t=25: need 13 + 12 = 25. dt 12 -> 37. r1 = 24, r0 = 13
    # it4 t=37: need 14 + 13 = 27. dt 12 -> 49. r1 = 30, r0 = 19 (r1 4 tokens, r0 3)
    # it5 t=49: need 15 + 14 = 29 > 28: preempt the latest entry r0 (it2), although r1 has the
    #           later table position. dt 11 -> 60, r1 finishes. r1 = 41
    # it6 t=60: r0 back: prefill 10 + 3 = 13 <= 15, need 14. dt 11 + 1.3 = 12.3 -> 72.3. r0 = 31.3
    # it7: dt 11 -> 83.3, r0 finishes. r0 = 42.3
    rows = [R(0, 0, 10, 5, priority=1), R(0, 1, 10, 5, priority=0)]
    req, ten, run = sim(rows, n_tenants=2, max_batch=4, policy="priority",
                        kv_capacity_tokens=28, max_prefill_tokens=15)
    close(req["admitted_ms"], [12.0, 0.0])
    close(req["first_token_ms"], [25.0, 12.0])
    close(req["finish_ms"], [83.3, 60.0])
    assert req["preemptions"] == [1, 0]
    close(req["charged_ms"], [42.3, 41.0])
    close(ten["prefill_ms"], [2.3, 1.0])
    assert run["busy_ms"] == pytest.approx(83.3)
    assert run["iterations"] == 7


def test_kv_recompute_prefill_too_large_drains(sim):
    # as above with max_prefill_tokens 12: at it6 r0's recompute prefill is 13 > 12, so it can
    # never be admitted again; admission stops at it, nothing runs, no arrivals left: the run
    # ends at t=60 with r0 unfinished (3 tokens, charged 19, one preemption).
    rows = [R(0, 0, 10, 5, priority=1), R(0, 1, 10, 5, priority=0)]
    req, ten, run = sim(rows, n_tenants=2, max_batch=4, policy="priority",
                        kv_capacity_tokens=28, max_prefill_tokens=12)
    close(req["finish_ms"], [math.nan, 60.0])
    assert req["generated"] == [3, 5]
    assert req["preemptions"] == [1, 0]
    close(req["charged_ms"], [19.0, 41.0])
    assert ten["requests_finished"] == [0, 1]
    assert run["busy_ms"] == pytest.approx(60.0)
    assert run["iterations"] == 5


def test_vtc_readmission_charges_the_recompute_prefill(sim):
    # vtc (wp 1, wq 2), kv 29, max_batch 4.
    # r0 t0 (p10, out 5) at 0; r1 t1 (p10, out 5) at 0; r2 t0 (p8, out 1) at 40;
    # r3 t0 (p10, out 1) at 60; r4 t1 (p10, out 1) at 60.
    # it1 t=0 : r0 (c0 = 0, no lift), r1 (lift to max(0, 0) = 0). tie -> r0, c0 = 10;
    #           c1 0 -> r1, c1 = 10. dt 14 -> 14. c0 = c1 = 12.
    # it2..4  : dt 12 each -> 26, 38, 50; c0 = c1 = 18.
    # it5 t=50: r2 delivered: t0's line empty -> non-empty, but no other tenant is backlogged
    #           (r1 runs): c0 stays 18. need 30 > 29 -> preempt r1 (same entry, later table pos).
    #           r2: need 15 + 9 = 24, admitted, c0 = 26. B=2, P=8: dt 12.8 -> 62.8.
    #           r0, r2 finish. c0 = 26 + 2 + 2 = 30; c1 18 (r1 did not run). r1 back in line.
    # it6 t=62.8: r3 delivered: t0 line empty -> non-empty, t1 backlogged (r1) with 18:
    #           c0 = max(30, 18) = 30. r4: t1 line not empty, no lift.
    #           c1 18 < 30 -> r1 (oldest of t1): recompute prefill 14 -> c1 = 32.
    #           c0 30 < 32 -> r3: need 15 + 11 = 26 <= 29, admitted, c0 = 40.
    #           c1 32 -> r4: need 37 > 29, stop.
    #           (Charging the re-admission only its 10 prompt tokens would give c1 = 28 and admit
    #           r4 instead of r3.)
    #           B=2, P=24: dt 12 + 2.4 = 14.4 -> 77.2; r1 and r3 finish.
    # it7 t=77.2: r4, dt 12 -> 89.2.
    rows = [R(0, 0, 10, 5), R(0, 1, 10, 5), R(40, 0, 8, 1), R(60, 0, 10, 1), R(60, 1, 10, 1)]
    req, ten, run = sim(rows, n_tenants=2, max_batch=4, policy="vtc", kv_capacity_tokens=29)
    close(req["admitted_ms"], [0.0, 0.0, 50.0, 62.8, 77.2])
    close(req["finish_ms"], [62.8, 77.2, 62.8, 77.2, 89.2])
    assert req["preemptions"] == [0, 1, 0, 0, 0]
    # r0: 7 + 6*3 + 6 = 31; r1: 7 + 18 + 1.4 + 6 = 32.4; r2: 0.8 + 6; r3: 1 + 6; r4: 1 + 11
    close(req["charged_ms"], [31.0, 32.4, 6.8, 7.0, 12.0])
    close(ten["machine_ms"], [44.8, 44.4])
    assert run["busy_ms"] == pytest.approx(89.2)


# ---------------------------------------------------------------------------------------
# The compiled result beyond the reference's shape: the policy's counters, the input columns
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy, counters", [
    # test_vtc_counter_lift: c0 10 -> 12 (it1), 22 -> 24 (it2), 34 -> 36 (it4);
    #                        c1 lifted to 12 (it2), 22 -> 24 (it3), 34 -> 36 (it5)
    ("vtc", [36.0, 36.0]),
    # test_lcf_no_lift: c0 12 (it1), 24 (it3), 36 (it5); c1 12 (it2), 24 (it4)
    ("lcf", [36.0, 24.0]),
])
def test_compiled_counters_after_the_lift_cases(policy, counters):
    res = compiled_result(pd.DataFrame(ROWS_LIFT), n_tenants=2, max_batch=1, policy=policy, **ENGINE)
    close(list(res.counters), counters)


def test_compiled_residency_counters_are_the_machine_time():
    # test_residency with weights 1: each counter is the tenant's machine ms, [42, 68]
    res = compiled_result(pd.DataFrame(ROWS_RESIDENCY), n_tenants=2, max_batch=1, policy="residency", **ENGINE)
    close(list(res.counters), [42.0, 68.0])
    close(list(res.tenants["machine_ms"]), [42.0, 68.0])


def test_compiled_result_keeps_the_input_columns_and_order():
    rows = [R(0, 0, 10, 1, klass=1), R(0, 0, 10, 1, klass=0), R(5, 1, 10, 2, klass=0)]
    df = pd.DataFrame(rows)
    res = compiled_result(df, n_tenants=3, max_batch=1, policy="aging", rate=0.0, **ENGINE)
    pd.testing.assert_frame_equal(res.requests[list(df.columns)], df, check_dtype=False)
    assert list(res.tenants.index) == [0, 1, 2]
    # tenant 2 sent nothing: zero machine time, share 0 (the total is positive)
    assert res.tenants.loc[2, "machine_ms"] == 0.0 and res.tenants.loc[2, "share"] == 0.0
    # rate 0, max_batch 1: class order. t=0: r1 (class 0) -> 12. t=12: r2 (class 0, arrived at 5)
    # beats r0 (class 1): 12 -> 24 -> 35 (two tokens). t=35: r0 -> 47.
    close(list(res.requests["finish_ms"]), [47.0, 12.0, 35.0])
