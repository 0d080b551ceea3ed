"""`SimResult` builds its pandas tables on first read (simulate() itself stays on numpy arrays);
the tables it builds equal, column for column, dtype for dtype and bit for bit, the ones the
eager implementation built (copied below as `eager_tables`: validation in pandas, then one
DataFrame per table straight after the run)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import fairlib
from fairlib.chapters import presets
from fairlib.sim import loop
from fairlib.sim.simulate import build_state
from fairlib.sim import state

INT_COLUMNS = ("tenant", "prompt_tokens", "output_tokens", "est_output_tokens", "klass", "priority")


def eager_tables(requests, engine, policy, horizon_ms, n_tenants=None, tenant_names=None, **params):
    """The eager implementation (before lazy tables): (requests, tenants, run, counters)."""
    if isinstance(requests, dict):
        requests = pd.DataFrame(requests)
    df = requests.reset_index(drop=True)
    out = {"arrival_ms": pd.to_numeric(df["arrival_ms"], errors="coerce").to_numpy(dtype=float)}
    for name in INT_COLUMNS:
        if name in df.columns:
            out[name] = df[name].to_numpy().astype(np.int64)
    if n_tenants is None:
        n_tenants = len(tenant_names) if tenant_names is not None else int(out["tenant"].max()) + 1
    df = pd.DataFrame({c: (out[c] if c in out else df[c].to_numpy()) for c in df.columns}, copy=False)
    pol = fairlib.make_policy(policy, **params)
    S, pf, pi = build_state(df, n_tenants, engine, pol)
    loop.run(S, engine.kernel_params(), pol.pid, pf, pi, float(horizon_ms))
    n = len(df)
    columns = {c: df[c].to_numpy()[:n].copy() for c in df.columns}
    columns.update({
        "rejected": S.RI[state.STATUS, :n] == state.REJECTED, "admitted_ms": S.RF[state.ADMITTED, :n].copy(),
        "first_token_ms": S.RF[state.FIRST, :n].copy(), "finish_ms": S.RF[state.FINISH, :n].copy(),
        "generated": S.RI[state.GENERATED, :n].copy(), "charged_ms": S.RF[state.CHARGED, :n].copy(),
        "preemptions": S.RI[state.PREEMPT, :n].copy()})
    req = pd.DataFrame(columns, copy=False)
    n_t = S.TF.shape[1]
    names = list(tenant_names) if tenant_names is not None else [str(i) for i in range(n_t)]
    machine = S.TF[state.T_MACHINE].copy()
    total = machine.sum()
    ten = pd.DataFrame({
        "name": names,
        "machine_ms": machine, "prefill_ms": S.TF[state.T_PREFILL].copy(),
        "decode_ms": S.TF[state.T_DECODE].copy(),
        "decode_tokens": S.TI[state.T_TOKENS].copy(), "requests_admitted": S.TI[state.T_ADMITTED].copy(),
        "requests_finished": S.TI[state.T_FINISHED].copy(),
        "requests_rejected": S.TI[state.T_REJECTED].copy(),
        "share": machine / total if total > 0 else np.full(n_t, np.nan),
    })
    ten.index.name = "tenant"
    run = {"busy_ms": float(S.sf[state.BUSY_MS]), "iterations": int(S.si[state.ITERATIONS]),
           "decode_tokens": int(S.si[state.DECODE_TOKENS]), "end_ms": float(S.sf[state.T_NOW]),
           "horizon_ms": float(horizon_ms)}
    return req, ten, run, pol.counters(pf, n_t)


def assert_same_table(a: pd.DataFrame, b: pd.DataFrame):
    assert list(a.columns) == list(b.columns)
    assert list(a.dtypes) == list(b.dtypes)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    for c in a.columns:   # bit for bit, NaN where NaN
        x, y = a[c].to_numpy(), b[c].to_numpy()
        if x.dtype.kind in "f":
            assert x.tobytes() == y.tobytes(), c


def seed000_table(duration_s=20.0):
    df = presets.seed000(seed=0, duration_s=duration_s).requests(0)
    df["klass"] = df["tenant"]
    return df


SMALL_KV = fairlib.Engine(9.0, 0.55, 0.06, 24, kv_capacity_tokens=6000)
CASES = {
    "fcfs": (fairlib.SEED000_ENGINE, "fcfs", {}),
    "vtc": (fairlib.SEED000_ENGINE, "vtc", {}),
    "rpm_quota rejects": (fairlib.SEED000_ENGINE, "rpm_quota", {"limit": 20}),
    "slot_cap": (fairlib.SEED000_ENGINE, "slot_cap", {"cap": 6}),
    "sjf": (fairlib.SEED000_ENGINE, "sjf", {}),
    "fcfs preempts (small KV)": (SMALL_KV, "fcfs", {}),
    "residency preempts (small KV)": (SMALL_KV, "residency", {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_lazy_tables_equal_the_eager_ones(case):
    engine, policy, params = CASES[case]
    df = seed000_table()
    res = fairlib.simulate(df, engine, policy, 15_000.0, **params)
    req, ten, run, counters = eager_tables(df, engine, policy, 15_000.0, **params)
    assert_same_table(res.requests, req)
    assert_same_table(res.tenants, ten)
    assert res.tenants.index.name == "tenant"
    assert res.run == run
    assert res.tenant_names == ["0", "1", "2", "3"]
    assert (res.counters is None and counters is None) or np.array_equal(res.counters, counters)
    assert res.max_min == pytest.approx(float(ten["share"].max() / ten["share"].min()), rel=0, abs=0)
    if policy == "rpm_quota":
        assert res.requests["rejected"].sum() > 0 and res.tenants["requests_rejected"].sum() > 0
    if engine is SMALL_KV:
        assert res.requests["preemptions"].sum() > 0
    # unfinished requests at the horizon keep NaN finish times
    assert res.requests["finish_ms"].isna().any()


def test_other_columns_index_dict_input_and_names_are_kept():
    df = seed000_table(5.0)
    n = len(df)
    df.index = np.arange(100, 100 + n)           # an index that is not 0..n-1
    df["label"] = [f"r{i}" for i in range(n)]
    df["kind"] = pd.Categorical(np.where(np.arange(n) % 2 == 0, "even", "odd"))
    df["flag"] = np.arange(n) % 3 == 0
    df["when"] = pd.Timestamp("2024-01-01") + pd.to_timedelta(df["arrival_ms"].to_numpy(), unit="ms")
    df["mixed"] = pd.Series([1 if i % 2 else "a" for i in range(n)], index=df.index, dtype=object)
    df["weight"] = np.linspace(0.0, 1.0, n).astype(np.float32)
    names = ["a", "b", "c", "d", "idle"]          # a fifth tenant with no requests: share 0
    for table in (df, {c: df[c].to_numpy() for c in df.columns}):
        res = fairlib.simulate(table, fairlib.SEED000_ENGINE, "vtc", None, tenant_names=names)
        req, ten, run, _ = eager_tables(table, fairlib.SEED000_ENGINE, "vtc", math.inf, tenant_names=names)
        assert_same_table(res.requests, req)
        assert_same_table(res.tenants, ten)
        assert res.run == run
        assert list(res.tenants["name"]) == names and res.tenants["share"].iloc[4] == 0.0
        assert res.max_min == math.inf


def test_an_empty_table():
    df = pd.DataFrame({"arrival_ms": [], "tenant": [], "prompt_tokens": [], "output_tokens": []})
    res = fairlib.simulate(df)
    req, ten, run, _ = eager_tables(df, fairlib.Engine(), "fcfs", math.inf, n_tenants=1)
    assert_same_table(res.requests, req)
    assert_same_table(res.tenants, ten)
    assert np.isnan(res.tenants["share"].iloc[0])


def test_tables_are_built_on_first_read_and_kept():
    df = seed000_table(5.0)
    res = fairlib.simulate(df, fairlib.SEED000_ENGINE, "fcfs", None)
    assert "requests" not in vars(res) and "tenants" not in vars(res)   # nothing built by simulate()
    assert res.run["decode_tokens"] == int(df["output_tokens"].sum())    # no table needed for these
    assert res.tenant_names == ["0", "1", "2", "3"]
    assert "requests" not in vars(res) and "tenants" not in vars(res)
    req = res.requests
    assert res.requests is req and "tenants" not in vars(res)
    ten = res.tenants
    assert res.tenants is ten and res.shares is not None and res.tenants is ten


def test_the_result_is_a_snapshot_of_the_input():
    """Changing the input table after simulate() does not change the (later built) result."""
    df = seed000_table(5.0)
    df["label"] = [f"r{i}" for i in range(len(df))]
    res = fairlib.simulate(df, fairlib.SEED000_ENGINE, "fcfs", None)
    before = (int(df["prompt_tokens"].iloc[0]), float(df["arrival_ms"].iloc[0]), df["label"].iloc[0])
    df.loc[0, "prompt_tokens"] = 999
    df.loc[0, "arrival_ms"] = -5.0
    df.loc[0, "label"] = "changed"
    assert (int(res.requests["prompt_tokens"].iloc[0]), float(res.requests["arrival_ms"].iloc[0]),
            res.requests["label"].iloc[0]) == before


def test_repeated_column_names_are_refused():
    df = seed000_table(1.0)
    df["label"] = "x"
    df = pd.concat([df, df[["label"]]], axis=1)
    with pytest.raises(ValueError, match=r"column names must be unique; repeated: \['label'\]"):
        fairlib.simulate(df)


def test_a_result_built_from_dataframes_keeps_them():
    """SimResult still takes ready DataFrames (as it did as a dataclass)."""
    req = pd.DataFrame({"arrival_ms": [0.0]})
    ten = pd.DataFrame({"share": [0.25, 0.75]})
    res = fairlib.SimResult(req, ten, {}, fairlib.Engine(), fairlib.make_policy("fcfs"))
    assert res.requests is req and res.tenants is ten and res.max_min == 3.0
    assert res.counters is None and list(res.tenant_names) == []
