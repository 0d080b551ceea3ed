"""PolicyGate: the simulator's policies driven by observed events (the gateway's core).

- hand-computed charges: vtc's counters and lift, residency's dt/B with the prefill price, a chunk
  of several tokens, vtc_predict's refund at a finish, withdrawals, rpm_quota's Retry-After;
- the engine model's own iterations fed to a gate give the engine model's admissions, charges
  and counters, for every policy (the gate runs the simulator's decision code, not a copy);
- ``lines.remove`` keeps every line a heap (hypothesis);
- ``replay`` of a gate's log reproduces it, and names the first event that differs.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairlib.sim import lines
from fairlib.sim.engine import Engine
from fairlib.sim.gate import PolicyGate, replay
from fairlib.sim.online import OnlineEngine
from fairlib.sim.policies import POLICIES
from fairlib.sim import state
from sim_harness import random_case


# --- hand-computed ----------------------------------------------------------------------------
def test_vtc_counters_and_lift_by_hand():
    g = PolicyGate("vtc", n_tenants=2, slots=1, wp=1.0, wq=2.0)
    a, _ = g.arrive(0, 100, 0.0)
    assert g.admit(0.0) == [a]                       # c0 = 100
    b, _ = g.arrive(0, 10, 1.0)
    c, _ = g.arrive(1, 30, 2.0)                      # tenant 1's line was empty, tenant 0 backlogged: lift to 100
    np.testing.assert_allclose(g.counters(), [100.0, 100.0])
    g.observe([a], [3], [True], 12.0, 14.0)         # 3 tokens in one chunk: 3 iterations of wq = 2
    np.testing.assert_allclose(g.counters(), [106.0, 100.0])
    assert g.admit(14.0) == [c]                      # the lower counter: tenant 1
    np.testing.assert_allclose(g.counters(), [106.0, 130.0])
    assert g.in_flight == 1 and g.waiting == 1


def test_residency_charges_dt_over_b_with_the_prefill_price():
    g = PolicyGate("residency", n_tenants=2, slots=2, prefill_ms_per_token=0.5)
    a, _ = g.arrive(0, 10, 0.0)
    b, _ = g.arrive(1, 20, 0.0)
    assert g.admit(0.0) == [a, b]
    np.testing.assert_allclose(g.counters(), [5.0, 10.0])        # 0.5 ms x prompt at admission
    # first step: both first tokens, dt 25 = prefill 15 + 10 of iteration time: 5 each
    per = g.observe([a, b], [1, 1], [False, False], 25.0, 25.0)
    assert per == pytest.approx(5.0)
    np.testing.assert_allclose(g.counters(), [10.0, 15.0])
    # a chunk of 4 tokens counts the step's time once
    g.observe([a, b], [4, 1], [True, False], 8.0, 33.0)
    np.testing.assert_allclose(g.counters(), [14.0, 19.0])
    ts = g.tenant_state()
    np.testing.assert_allclose(ts["machine_ms"], [14.0, 19.0])
    np.testing.assert_allclose(ts["prefill_ms"], [5.0, 10.0])
    assert ts["output_tokens"].tolist() == [5, 2] and ts["finished"].tolist() == [1, 0]
    assert g.running_ids() == [b]


def test_vtc_predict_refund_at_a_finish_seen_in_a_coalesced_chunk():
    g = PolicyGate("vtc_predict", n_tenants=1, slots=1, wp=0.0, wq=1.0, init=5.0)
    a, _ = g.arrive(0, 1, 0.0)
    g.admit(0.0)
    assert g.counters()[0] == pytest.approx(5.0)                  # the prediction, paid at admission
    g.observe([a], [2], [False], 1.0, 1.0)
    g.observe([a], [1], [True], 1.0, 2.0)                         # 3 tokens < 5: 2 refunded
    assert g.counters()[0] == pytest.approx(3.0)
    b, _ = g.arrive(0, 1, 3.0)
    g.admit(3.0)
    assert g.counters()[0] == pytest.approx(6.0)                  # the prediction is now the first output: 3
    g.observe([b], [5], [True], 1.0, 4.0)                         # tokens 4 and 5 beyond it: +2
    assert g.counters()[0] == pytest.approx(8.0)


def test_withdraw_from_the_line_and_from_the_batch():
    g = PolicyGate("fcfs", n_tenants=1, slots=1)
    ids = [g.arrive(0, 5, float(t))[0] for t in range(4)]
    assert g.admit(4.0) == [ids[0]]
    assert g.withdraw(ids[2], 5.0) == "waiting"
    assert g.withdraw(ids[0], 5.0) == "in_flight"
    assert g.withdraw(ids[0], 5.0) == "gone"
    assert g.admit(6.0) == [ids[1]]
    g.observe([ids[1]], [1], [True], 1.0, 7.0)
    assert g.admit(7.0) == [ids[3]]
    assert g.waiting == 0


def test_rpm_quota_rejects_and_says_when_to_retry():
    g = PolicyGate("rpm_quota", n_tenants=2, slots=1, limit=2)
    assert g.arrive(0, 5, 0.0)[1] and g.arrive(0, 5, 1000.0)[1]
    rid, ok = g.arrive(0, 5, 2000.0)
    assert not ok
    assert g.retry_after_s(0, 2000.0) == pytest.approx(58.0)      # the first leaves the window at 60 s
    assert g.retry_after_s(1, 2000.0) == 0.0
    assert g.arrive(1, 5, 2000.0)[1]


def test_bad_events_are_named():
    g = PolicyGate("fcfs", n_tenants=2, slots=2)
    with pytest.raises(ValueError, match="tenant"):
        g.arrive(5, 10, 0.0)
    with pytest.raises(ValueError, match="t_ms"):
        g.arrive(0, 10, float("nan"))
    a, _ = g.arrive(0, 10, 0.0)
    with pytest.raises(ValueError, match="not in flight"):
        g.observe([a], [1], [False], 1.0, 1.0)
    g.admit(0.0)
    with pytest.raises(ValueError, match=">= 1 token"):
        g.observe([a], [0], [False], 1.0, 1.0)
    with pytest.raises(ValueError, match="dt_ms"):
        g.observe([a], [1], [False], -1.0, 1.0)


# --- the engine model's iterations, fed to a gate ----------------------------------------------
def _drive(policy, seed):
    """The engine model run iteration by iteration (OnlineEngine) and a gate fed what each
    iteration showed: its arrivals, its admissions (checked), its emitters, finishes and duration.
    Engine costs are multiples of 1/16 ms and arrivals whole ms, so that the step time a gate is
    given (end - start) minus the prefill price gives the engine model's per-sequence charge to
    the last bit: the decisions, ties included, must then be the same."""
    df, kw = random_case(seed, policy, n_max=60)
    rng = np.random.default_rng(seed)
    df["arrival_ms"] = np.floor(df["arrival_ms"].to_numpy())
    kw.update(iter_base_ms=float(rng.choice([1.0, 4.0, 9.0])), iter_slope_ms=float(rng.choice([0.0, 0.5, 1.25])),
              prefill_ms_per_token=float(rng.choice([0.0, 0.0625, 0.25])))
    params = {k: v for k, v in kw.items() if k not in ("n_tenants", "policy", "iter_base_ms", "iter_slope_ms",
                                                       "prefill_ms_per_token", "max_batch", "max_prefill_tokens",
                                                       "kv_capacity_tokens", "horizon_ms", "batching",
                                                       "fill_wait_ms")}
    eng = Engine(iter_base_ms=kw["iter_base_ms"], iter_slope_ms=kw["iter_slope_ms"],
                 prefill_ms_per_token=kw["prefill_ms_per_token"], max_batch=kw["max_batch"])
    n_t = kw["n_tenants"]
    n_c = int(df["klass"].max()) + 1 if len(df) else 1
    prio = df["priority"] if "priority" in df else df["klass"]
    online = OnlineEngine(eng, policy, n_tenants=n_t, n_classes=max(n_c, 1), **params)
    gate = PolicyGate(policy, n_tenants=n_t, slots=eng.max_batch, prefill_ms_per_token=eng.prefill_ms_per_token,
                      n_classes=max(n_c, 1), record=True, **params)
    rows = list(zip(df["arrival_ms"], df["tenant"], df["prompt_tokens"], df["output_tokens"],
                    df["est_output_tokens"], df["klass"], prio))
    for a, tn, p, o, e, k, pr in rows:
        online.submit(int(tn), int(p), int(o), float(a), int(e), int(k), int(pr))
    admitted_sim, admitted_gate = [], []
    S = online.S
    while True:
        before = int(S.si[state.NEXT_ARRIVAL])
        n_before = int(S.si[state.N_RUNNING])
        start = online.now_ms
        it = online.step()
        for r in range(before, int(S.si[state.NEXT_ARRIVAL])):
            a, tn, p, o, e, k, pr = rows[r]
            rid, ok = gate.arrive(int(tn), int(p), start, int(e), int(k), int(pr), arrival_ms=float(a))
            assert rid == r and ok == (r not in set(it.rejected.tolist()))
        got = gate.admit(start)
        admitted_gate += got
        if it.code != 1:        # no iteration ran: nothing was admissible
            assert got == []
            if it.code == 0:
                break
            continue
        ran = it.ran.tolist()
        admitted_sim += ran[n_before:]
        assert got == ran[n_before:], f"{policy} seed {seed}: admitted {got}, the engine model {ran[n_before:]}"
        fin = set(it.finished.tolist())
        gate.observe(ran, [1] * len(ran), [r in fin for r in ran], it.end_ms - it.start_ms, it.end_ms)
    return online, gate, admitted_sim, admitted_gate


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("seed", range(10))
def test_the_engine_models_iterations_give_its_decisions_and_charges(policy, seed):
    online, gate, a_sim, a_gate = _drive(policy, seed)
    assert a_sim == a_gate
    for row in (state.T_MACHINE, state.T_PREFILL, state.T_DECODE):
        np.testing.assert_allclose(gate.S.TF[row], online.S.TF[row], rtol=1e-9, atol=1e-9)
    c_sim = online.policy.counters(online.pf, online.n_tenants)
    if c_sim is not None:
        np.testing.assert_allclose(gate.counters(), c_sim, rtol=1e-9, atol=1e-9)
    # and the gate's log replays to the same gate
    again = replay(gate.spec, gate.log)
    np.testing.assert_array_equal(again.S.TF, gate.S.TF)
    if c_sim is not None:
        np.testing.assert_array_equal(again.counters(), gate.counters())


def test_replay_names_the_event_that_differs():
    g = PolicyGate("fcfs", n_tenants=1, slots=1, record=True)
    a, _ = g.arrive(0, 5, 0.0)
    g.admit(0.0)
    log = [list(e) for e in g.log]
    log[1][3] = [a + 1]
    with pytest.raises(ValueError, match="event 1"):
        replay(g.spec, log)


# --- lines.remove keeps the heap ----------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["push", "pop", "remove"]), st.integers(0, 5)), max_size=80))
def test_lines_remove_keeps_the_line_in_order(ops):
    push, pop, remove = lines.push, lines.pop, lines.remove
    cap = 100
    heap = np.zeros(1 + cap, np.int64)
    heap[0] = 1
    heap_n = np.zeros(1, np.int64)
    RF = np.zeros((7, cap))
    model, nxt = [], 0
    for op, k in ops:
        if op == "push" and nxt < cap:
            RF[state.KEY, nxt] = float(k)                  # keys with ties: order (key, id)
            push(heap, heap_n, RF, 0, nxt)
            model.append(nxt)
            nxt += 1
        elif op == "pop" and model:
            top = pop(heap, heap_n, RF, 0)
            want = min(model, key=lambda r: (RF[state.KEY, r], r))
            assert top == want
            model.remove(want)
        elif op == "remove" and model:
            r = model[k % len(model)]
            assert remove(heap, heap_n, RF, 0, r) == 1
            model.remove(r)
            assert remove(heap, heap_n, RF, 0, r) == 0
        assert heap_n[0] == len(model)
    order = []
    while heap_n[0]:
        order.append(pop(heap, heap_n, RF, 0))
    assert order == sorted(model, key=lambda r: (RF[state.KEY, r], r))
