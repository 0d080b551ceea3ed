"""Properties of the compiled simulator that hold for every workload (book/engine-model.md):
conservation of machine time and tokens, request lifecycles, the batch limit, determinism and
the indifference of fcfs to tenant labels. Workloads come from ``sim_harness.workloads``.
"""
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from sim_harness import POLICY_NAMES, compiled_result, workloads

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def any_workload():
    return st.sampled_from(POLICY_NAMES).flatmap(workloads)


def check_conservation(df, res):
    req, ten, run = res.requests, res.tenants, res.run
    busy = run["busy_ms"]
    machine = ten["machine_ms"].to_numpy()
    assert math.isclose(machine.sum(), busy, rel_tol=1e-9, abs_tol=1e-9)
    np.testing.assert_allclose(ten["prefill_ms"] + ten["decode_ms"], machine, rtol=1e-9, atol=1e-9)
    tenant = df["tenant"].to_numpy()
    n_t = len(ten)
    charged = np.bincount(tenant, weights=req["charged_ms"].to_numpy(), minlength=n_t)
    np.testing.assert_allclose(charged, machine, rtol=1e-9, atol=1e-9)
    generated = np.bincount(tenant, weights=req["generated"].to_numpy(), minlength=n_t)
    assert np.array_equal(generated, ten["decode_tokens"].to_numpy())
    assert ten["decode_tokens"].sum() == run["decode_tokens"]
    if busy > 0:
        assert math.isclose(ten["share"].sum(), 1.0, rel_tol=0, abs_tol=1e-9)
        np.testing.assert_allclose(ten["share"], machine / machine.sum(), rtol=1e-12)
    else:
        assert run["iterations"] == 0 and ten["share"].isna().all()
    # the per-tenant counts are the per-request outcomes counted
    admitted = req["admitted_ms"].notna().to_numpy()
    finished = req["finish_ms"].notna().to_numpy()
    rejected = req["rejected"].to_numpy()
    for name, mask in (("requests_admitted", admitted), ("requests_finished", finished),
                       ("requests_rejected", rejected)):
        assert np.array_equal(np.bincount(tenant[mask], minlength=n_t), ten[name].to_numpy()), name


def check_lifecycles(df, res, kw):
    req = res.requests
    arrival = df["arrival_ms"].to_numpy()
    out = df["output_tokens"].to_numpy()
    adm, first, fin = (req[c].to_numpy() for c in ("admitted_ms", "first_token_ms", "finish_ms"))
    gen = req["generated"].to_numpy()
    rejected = req["rejected"].to_numpy()
    charged = req["charged_ms"].to_numpy()
    assert np.all(gen <= out)
    assert np.all(gen[~np.isnan(fin)] == out[~np.isnan(fin)])             # finished: every token
    assert np.all(gen[np.isnan(fin)] < out[np.isnan(fin)])                 # unfinished: not all
    # an admission always yields a token: admitted <=> first token <=> generated >= 1
    assert np.array_equal(np.isnan(adm), np.isnan(first))
    assert np.array_equal(np.isnan(adm), gen == 0)
    ran = ~np.isnan(adm)
    assert np.all(adm[ran] >= arrival[ran])
    assert np.all(first[ran] > adm[ran])                                   # dt > 0
    done = ~np.isnan(fin)
    assert np.all(fin[done] >= first[done])
    assert np.all(adm[ran] < kw.get("horizon_ms", math.inf))               # admitted while t < horizon
    # rejected requests never run and are never charged
    assert not np.any(ran & rejected)
    assert np.all(charged[rejected] == 0) and np.all(req["preemptions"].to_numpy()[rejected] == 0)
    assert np.array_equal(charged > 0, ran)         # per_seq = (base + slope * B) / B > 0
    # a request the engine could never run is rejected
    impossible = np.zeros(len(df), bool)
    if kw.get("max_prefill_tokens") is not None:
        impossible |= df["prompt_tokens"].to_numpy() > kw["max_prefill_tokens"]
    if kw.get("kv_capacity_tokens") is not None:
        impossible |= (df["prompt_tokens"] + df["output_tokens"]).to_numpy() > kw["kv_capacity_tokens"]
    assert not np.any(ran & impossible)
    if math.isinf(kw.get("horizon_ms", math.inf)):     # without a horizon everything is delivered
        assert np.all(rejected[impossible])
    if kw.get("kv_capacity_tokens") is None:
        assert req["preemptions"].sum() == 0


def check_batch_limit(res, max_batch):
    """Without preemptions a request runs in every iteration from the one that admits it to the
    one that finishes it: at each emission time e (a first token or a finish) the running set is
    {r: admitted_r < e <= finish_r}; it never exceeds max_batch."""
    req = res.requests
    if req["preemptions"].sum() > 0:
        return
    adm = req["admitted_ms"].to_numpy()
    fin = req["finish_ms"].fillna(np.inf).to_numpy()
    ran = ~np.isnan(adm)
    adm, fin = adm[ran], fin[ran]
    emissions = np.unique(np.concatenate([req["first_token_ms"].dropna(), req["finish_ms"].dropna()]))
    running = ((adm[None, :] < emissions[:, None]) & (emissions[:, None] <= fin[None, :])).sum(axis=1)
    assert running.max(initial=0) <= max_batch
    if len(emissions):
        assert running.min() >= 1


@settings(max_examples=300, **SETTINGS)
@given(case=any_workload())
def test_conservation_lifecycles_and_batch_limit(case):
    df, kw = case
    res = compiled_result(df, **kw)
    check_conservation(df, res)
    check_lifecycles(df, res, kw)
    check_batch_limit(res, kw["max_batch"])


@pytest.mark.parametrize("max_batch", [1, 2, 5])
def test_batch_limit_binds_on_a_burst(max_batch):
    """The reconstruction is not vacuous: a burst fills the batch exactly."""
    df = pd.DataFrame({"arrival_ms": np.zeros(12), "tenant": np.arange(12) % 3,
                       "prompt_tokens": np.full(12, 10), "output_tokens": np.arange(12) % 4 + 1})
    res = compiled_result(df, n_tenants=3, iter_base_ms=9.0, iter_slope_ms=0.55, prefill_ms_per_token=0.06,
                          max_batch=max_batch)
    adm = res.requests["admitted_ms"].to_numpy()
    fin = res.requests["finish_ms"].to_numpy()
    emissions = np.unique(np.concatenate([res.requests["first_token_ms"], fin]))
    running = ((adm[None, :] < emissions[:, None]) & (emissions[:, None] <= fin[None, :])).sum(axis=1)
    assert running.max() == max_batch
    check_batch_limit(res, max_batch)


def _frozen(res):
    """Every output array as bytes (bitwise comparison, NaN included)."""
    out = [res.requests[c].to_numpy().tobytes() for c in res.requests.columns]
    out += [res.tenants[c].to_numpy().tobytes() for c in res.tenants.columns if c != "name"]
    out.append(repr(sorted(res.run.items())))
    if res.counters is not None:
        out.append(np.asarray(res.counters).tobytes())
    return out


@settings(max_examples=60, **SETTINGS)
@given(case=any_workload())
def test_deterministic(case):
    df, kw = case
    before = df.copy()
    a = compiled_result(df, **kw)
    b = compiled_result(df.copy(), **kw)
    assert _frozen(a) == _frozen(b)
    pd.testing.assert_frame_equal(df, before)          # the input table is not modified


@settings(max_examples=80, **SETTINGS)
@given(case=workloads("fcfs"), data=st.data())
def test_fcfs_ignores_tenant_labels(case, data):
    """Relabelling tenants by a permutation changes no per-request outcome under fcfs, and the
    tenant table is permuted accordingly."""
    df, kw = case
    n_t = kw["n_tenants"]
    perm = np.array(data.draw(st.permutations(range(n_t)), label="perm"), np.int64)
    relabelled = df.assign(tenant=perm[df["tenant"].to_numpy()])
    a = compiled_result(df, **kw)
    b = compiled_result(relabelled, **kw)
    cols = ["rejected", "admitted_ms", "first_token_ms", "finish_ms", "generated", "charged_ms", "preemptions"]
    pd.testing.assert_frame_equal(a.requests[cols], b.requests[cols], check_exact=True)
    ta = a.tenants.drop(columns="name").to_numpy(float)
    tb = b.tenants.drop(columns="name").to_numpy(float)
    np.testing.assert_allclose(tb[perm], ta, rtol=1e-12, atol=0, equal_nan=True)
    assert a.run == b.run
