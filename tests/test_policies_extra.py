"""Hand-computed cases for the two policies added with the reference grid: ``rr`` (round robin by
request) and ``vtc_predict`` (VTC with per-tenant output-length prediction, as the VTC artifact's
vtc_len_predict). Rules: book/engine-model.md (Policies) and the modules' docstrings.

Every expected value was worked out by hand, iteration by iteration (comments), and is checked
against both the compiled simulator (fairlib.simulate) and the plain-Python reference
(tests/reference_sim.py), including the policy's final counters.

Engine unless stated: base 10 ms, slope 1 ms/seq, prefill 0.1 ms/token:
dt = 10 + B + 0.1 P. With prompts of 10 tokens, one request alone costs 12 ms in the iteration
that admits it and 11 ms in each later one.
"""
import math

import numpy as np
import pandas as pd
import pytest

import reference_sim
import fairlib

ENGINE = dict(iter_base_ms=10.0, iter_slope_ms=1.0, prefill_ms_per_token=0.1)


def R(a, tenant, p, o):
    return dict(arrival_ms=float(a), tenant=tenant, prompt_tokens=p, output_tokens=o)


def run(impl, rows, n_tenants, max_batch, policy, monkeypatch, **params):
    """(admitted_ms, first_token_ms, finish_ms, counters or None) from either implementation."""
    df = pd.DataFrame(rows)
    if impl == "compiled":
        eng = fairlib.Engine(max_batch=max_batch, **ENGINE)
        res = fairlib.simulate(df, eng, policy, n_tenants=n_tenants, **params)
        r = res.requests
        counters = None if res.counters is None else list(res.counters)
        return (r["admitted_ms"].tolist(), r["first_token_ms"].tolist(), r["finish_ms"].tolist(), counters)
    made = {}
    original = reference_sim._make_policy

    def spy(sim, name, p):
        made["policy"] = original(sim, name, p)
        return made["policy"]

    monkeypatch.setattr(reference_sim, "_make_policy", spy)
    req, _, _ = reference_sim.reference_simulate(df, n_tenants=n_tenants, max_batch=max_batch, policy=policy,
                                                 **ENGINE, **params)
    counters = getattr(made["policy"], "counter", None)
    return req["admitted_ms"], req["first_token_ms"], req["finish_ms"], counters


def close(actual, expected):
    assert len(actual) == len(expected), (actual, expected)
    for a, e in zip(actual, expected):
        if isinstance(e, float) and math.isnan(e):
            assert math.isnan(a), (actual, expected)
        else:
            assert a == pytest.approx(e, rel=1e-12, abs=1e-12), (actual, expected)


IMPLS = ("compiled", "reference")


# ---------------------------------------------------------------------------------------------
# rr
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_rr_one_request_per_tenant_in_turn(impl, monkeypatch):
    # all at t=0, prompt 10, output 1, max_batch 1: r0 t0, r1 t0, r2 t1, r3 t2, r4 t1.
    # pointer 0 -> r0 (pointer 1) -> r2 (2) -> r3 (0) -> r1 (1) -> r4. One request per iteration,
    # each dt = 10 + 1 + 1 = 12: admitted 0 (r0), 12 (r2), 24 (r3), 36 (r1), 48 (r4); each
    # finishes at the end of its iteration. (FCFS would run r0, r1, r2, r3, r4.)
    rows = [R(0, 0, 10, 1), R(0, 0, 10, 1), R(0, 1, 10, 1), R(0, 2, 10, 1), R(0, 1, 10, 1)]
    adm, first, fin, _ = run(impl, rows, 3, 1, "rr", monkeypatch)
    close(adm, [0.0, 36.0, 12.0, 24.0, 48.0])
    close(first, [12.0, 48.0, 24.0, 36.0, 60.0])
    close(fin, [12.0, 48.0, 24.0, 36.0, 60.0])


@pytest.mark.parametrize("impl", IMPLS)
def test_rr_rotates_within_one_iteration(impl, monkeypatch):
    # the same five requests, max_batch 3: it1 t=0 admits r0 (pointer 1), r2 (2), r3 (0): full.
    # B = 3, P = 30: dt = 10 + 3 + 3 = 16, all three finish at 16. it2 t=16: r1 (pointer 1),
    # r4 (pointer 2); B = 2, P = 20: dt = 10 + 2 + 2 = 14 -> both finish at 30.
    rows = [R(0, 0, 10, 1), R(0, 0, 10, 1), R(0, 1, 10, 1), R(0, 2, 10, 1), R(0, 1, 10, 1)]
    adm, first, fin, _ = run(impl, rows, 3, 3, "rr", monkeypatch)
    close(adm, [0.0, 16.0, 0.0, 0.0, 16.0])
    close(fin, [16.0, 30.0, 16.0, 16.0, 30.0])


@pytest.mark.parametrize("impl", IMPLS)
def test_rr_pointer_moves_past_the_chosen_tenant(impl, monkeypatch):
    # 4 tenants, max_batch 1, prompt 10, output 1. At t=0: r0 t0, r1 t0, r2 t2, r3 t2;
    # r4 (t1) arrives at t=13.
    # it1 t=0 : pointer 0 -> r0, pointer 1; t=12.
    # it2 t=12: r4 not yet here. pointer 1: tenant 1 empty -> tenant 2: r2, pointer 3 (the
    #           tenant after the chosen one, not pointer + 1 = 2); t=24.
    # it3 t=24: r4 delivered. pointer 3: tenant 3 empty -> tenant 0: r1, pointer 1; t=36.
    # it4 t=36: pointer 1: r4, pointer 2; t=48.   it5 t=48: r3; t=60.
    # (With "pointer + 1" it3 would pick tenant 2 again: r3.)
    rows = [R(0, 0, 10, 1), R(0, 0, 10, 1), R(0, 2, 10, 1), R(0, 2, 10, 1), R(13, 1, 10, 1)]
    adm, first, fin, _ = run(impl, rows, 4, 1, "rr", monkeypatch)
    close(adm, [0.0, 24.0, 12.0, 48.0, 36.0])
    close(fin, [12.0, 36.0, 24.0, 60.0, 48.0])


def test_rr_equalises_requests_not_machine_time():
    # two backlogged tenants, identical prompts, outputs 1 vs 10: rr admits them alternately,
    # so each gets the same number of requests, and the long one ~10x the decode time.
    n = 40
    rows = [R(0, t, 10, 1 if t == 0 else 10) for _ in range(n) for t in (0, 1)]
    res = fairlib.simulate(pd.DataFrame(rows), fairlib.Engine(max_batch=2, **ENGINE), "rr", horizon_ms=300.0)
    adm = res.tenants["requests_admitted"].to_numpy()
    assert abs(adm[0] - adm[1]) <= 1 or adm[0] > adm[1]   # never behind in requests
    assert res.tenants["decode_tokens"][1] > 5 * res.tenants["decode_tokens"][0]


# ---------------------------------------------------------------------------------------------
# vtc_predict
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_vtc_predict_charges_beyond_the_prediction_and_refunds(impl, monkeypatch):
    # one tenant, init 2.5 (the prediction before its first finish), wp 1, wq 2, max_batch 1.
    # r0 (prompt 10, output 5) at t=0: p = 2.5: c = 10 + 2 * 2.5 = 15. Tokens 1, 2 <= 2.5: free;
    #   tokens 3, 4, 5 > 2.5: +2 each -> 21. Times: 12, 23, 34, 45, 56 (finish). No refund
    #   (5 > 2.5). First finish: prediction = 5.
    # r1 (prompt 10, output 1) at t=100 (idle jump): p = 5: c = 21 + 10 + 10 = 41; token 1 <= 5:
    #   free; finish at 112 with 1 < 5: refund 2 * (5 - 1) = 8 -> 33. Prediction (5*4 + 1)/5 = 4.2.
    rows = [R(0, 0, 10, 5), R(100, 0, 10, 1)]
    adm, first, fin, c = run(impl, rows, 1, 1, "vtc_predict", monkeypatch, init=2.5)
    close(adm, [0.0, 100.0])
    close(first, [12.0, 112.0])
    close(fin, [56.0, 112.0])
    close(c, [33.0])


@pytest.mark.parametrize("impl", IMPLS)
def test_vtc_predict_history_and_two_finishes(impl, monkeypatch):
    # two tenants, max_batch 1, wp 1, wq 2, init 0 (the artifact's).
    # r0 t0 (10, 4), r1 t1 (10, 1), r2 t0 (10, 2), r3 t1 (10, 1), all at t=0.
    # it1 t=0 : tie c0 = c1 = 0 -> r0, p = 0: c0 = 10; t=12, token 1 > 0: c0 = 12.
    # it2-4   : t = 23, 34, 45; c0 = 14, 16, 18; r0 finishes at 45: prediction_0 = 4.
    # it5 t=45: c0 18, c1 0 -> r1, p = 0: c1 = 10; t=57, token > 0: 12; finish: prediction_1 = 1.
    # it6 t=57: c0 18, c1 12 -> r3, p = 1: c1 = 12 + 10 + 2 = 24; t=69; token 1 <= 1: free;
    #           finish, no refund (1 = p); prediction_1 = (1*4 + 1)/5 = 1.
    # it7 t=69: r2, p = 4: c0 = 18 + 10 + 8 = 36; t=81, token 1 free. it8: t=92, token 2 free;
    #           finish with 2 < 4: refund 2*2 = 4 -> c0 = 32.
    rows = [R(0, 0, 10, 4), R(0, 1, 10, 1), R(0, 0, 10, 2), R(0, 1, 10, 1)]
    adm, first, fin, c = run(impl, rows, 2, 1, "vtc_predict", monkeypatch)
    close(adm, [0.0, 45.0, 69.0, 57.0])
    close(first, [12.0, 57.0, 81.0, 69.0])
    close(fin, [45.0, 57.0, 92.0, 69.0])
    close(c, [32.0, 24.0])


ROWS_ORDER = [R(0, 0, 10, 10), R(105, 0, 10, 1), R(105, 0, 10, 1), R(105, 1, 10, 1), R(105, 1, 10, 1)]


@pytest.mark.parametrize("impl", IMPLS)
def test_vtc_predict_upfront_charge_changes_the_order(impl, monkeypatch):
    # max_batch 3. r0 t0 (10, 10) alone at t=0: c0 = 10 at admission, t=12 (+2 = 12), then 9
    # iterations of 11 ms: finishes at 12 + 99 = 111 with c0 = 12 + 18 = 30; prediction_0 = 10.
    # r1 t0, r2 t0, r3 t1, r4 t1 (all prompt 10, output 1) arrive at 105, delivered at t=111:
    # r1: no other tenant backlogged, c0 stays 30; r3: tenant 1 lifted to min(c0) = 30.
    # it t=111: tie -> r1, p = 10: c0 = 30 + 10 + 20 = 60; then c1 = 30 < 60 -> r3, p = 0:
    #   c1 = 40; then 40 < 60 -> r4: c1 = 50. B = 3, P = 30: dt = 16 -> t=127.
    #   charges: r1's token 1 <= 10 free; r3, r4: +2 each -> c1 = 54. Finishes in table order:
    #   r1 refund 2 * (10 - 1) = 18 -> c0 = 42, prediction_0 = (10*4 + 1)/5 = 8.2; r3: first
    #   finish, prediction_1 = 1; r4: (1*4 + 1)/5 = 1.
    # it t=127: r2, p = 8.2: c0 = 42 + 10 + 16.4 = 68.4; dt = 12 -> t=139; token free; refund
    #   2 * 7.2 = 14.4 -> c0 = 54.
    # (Plain vtc admits r1, r3, r2 at 111: the prediction is what pushes r2 back.)
    adm, first, fin, c = run(impl, ROWS_ORDER, 2, 3, "vtc_predict", monkeypatch)
    close(adm, [0.0, 111.0, 127.0, 111.0, 111.0])
    close(fin, [111.0, 127.0, 139.0, 127.0, 127.0])
    close(c, [54.0, 54.0])


@pytest.mark.parametrize("impl", IMPLS)
def test_vtc_same_case_for_contrast(impl, monkeypatch):
    # plain vtc on the same requests: at t=111 tie -> r1 (c0 = 40), c1 = 30 -> r3 (c1 = 40),
    # tie -> r2 (c0 = 50). r4 waits: B = 3, dt = 16 -> t=127; then r4 at 127, finishes at 139.
    adm, _, fin, _ = run(impl, ROWS_ORDER, 2, 3, "vtc", monkeypatch)
    close(adm, [0.0, 111.0, 111.0, 111.0, 127.0])
    close(fin, [111.0, 127.0, 127.0, 127.0, 139.0])


@pytest.mark.parametrize("impl", IMPLS)
def test_vtc_predict_weights_divide_every_charge(impl, monkeypatch):
    # one tenant with weight 2, init 2.5, the first case's requests: every charge halves:
    # 33 / 2 = 16.5.
    rows = [R(0, 0, 10, 5), R(100, 0, 10, 1)]
    *_, c = run(impl, rows, 1, 1, "vtc_predict", monkeypatch, init=2.5, weights=[2.0])
    close(c, [16.5])


def test_vtc_predict_equals_vtc_before_any_finish():
    # init 0: until a tenant's first finish every token is beyond the prediction, so the counters
    # move exactly as vtc's: on a table where nothing finishes within the horizon the two agree.
    rng = np.random.default_rng(3)
    n = 60
    df = pd.DataFrame({"arrival_ms": np.sort(rng.uniform(0, 200, n)), "tenant": rng.integers(0, 3, n),
                       "prompt_tokens": rng.integers(5, 50, n), "output_tokens": rng.integers(500, 900, n)})
    eng = fairlib.Engine(max_batch=4, **ENGINE)
    a = fairlib.simulate(df, eng, "vtc", horizon_ms=2000.0, n_tenants=3)
    b = fairlib.simulate(df, eng, "vtc_predict", horizon_ms=2000.0, n_tenants=3)
    assert a.requests["finish_ms"].isna().all()
    assert np.array_equal(a.counters, b.counters)
    pd.testing.assert_frame_equal(a.requests, b.requests)


def test_vtc_predict_parameters_validated():
    with pytest.raises(ValueError, match="window"):
        fairlib.make_policy("vtc_predict", window=0)
    with pytest.raises(ValueError, match="init"):
        fairlib.make_policy("vtc_predict", init=-1)
    with pytest.raises(ValueError, match="unknown"):
        fairlib.make_policy("rr", cap=3)
