"""Tests of fairlib.analysis.indices."""
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from fairlib.analysis.indices import CI, bootstrap_ci, jain_index, latency_table, max_min_ratio, shares


# --- vectors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 4, 7])
def test_jain_hand_cases(n):
    assert jain_index([3.0] * n) == 1.0
    one_hot = [0.0] * n
    one_hot[-1] = 5.0
    assert math.isclose(jain_index(one_hot), 1.0 / n, rel_tol=1e-15)


def test_jain_worked_example_and_weights():
    # (1+2+3)^2 / (3 * (1+4+9)) = 36/42
    assert math.isclose(jain_index([1, 2, 3]), 36 / 42, rel_tol=1e-15)
    # published FCFS split 25.9/26.8/24.7/22.6: 100^2 / (4 * 2510.1) ... computed exactly here
    x = np.array([25.9, 26.8, 24.7, 22.6])
    assert math.isclose(jain_index(x), x.sum() ** 2 / (4 * (x ** 2).sum()), rel_tol=1e-15)
    # weights: service proportional to weight is perfectly fair
    assert math.isclose(jain_index([2.0, 4.0, 6.0], weights=[1, 2, 3]), 1.0, rel_tol=1e-15)
    assert math.isnan(jain_index([0.0, 0.0]))


def test_max_min_ratio():
    assert max_min_ratio([25.9, 26.8, 24.7, 22.6]) == pytest.approx(26.8 / 22.6, rel=1e-15)
    assert round(max_min_ratio([7.4, 11.3, 30.3, 51.0]), 2) == 6.89  # published 6.87 from unrounded shares
    assert max_min_ratio([5, 5, 5]) == 1.0
    assert max_min_ratio([0.0, 1.0]) == math.inf
    assert math.isnan(max_min_ratio([0.0, 0.0]))
    assert max_min_ratio([1.0, 6.0], weights=[1.0, 3.0]) == 2.0


def test_shares():
    s = shares([1.0, 3.0, 4.0])
    assert np.array_equal(s, [0.125, 0.375, 0.5])
    ser = shares(pd.Series([2.0, 2.0], index=["a", "b"]))
    assert isinstance(ser, pd.Series) and list(ser.index) == ["a", "b"] and list(ser) == [0.5, 0.5]
    assert np.isnan(shares([0.0, 0.0])).all()


@pytest.mark.parametrize("bad", [[], [1.0, -1.0], [1.0, float("nan")], [[1.0, 2.0]]])
def test_vector_validation(bad):
    for f in (jain_index, max_min_ratio, shares):
        with pytest.raises(ValueError, match="x must"):
            f(bad)
    with pytest.raises(ValueError, match="weights"):
        jain_index([1.0, 2.0], weights=[1.0, 0.0])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1e6), min_size=1, max_size=20).filter(lambda x: sum(x) > 0))
def test_jain_bounds_and_scale_invariance(x):
    j = jain_index(x)
    assert 1.0 / len(x) - 1e-12 <= j <= 1.0 + 1e-12
    assert math.isclose(jain_index(np.array(x) * 3.7), j, rel_tol=1e-9)
    assert math.isclose(float(np.sum(shares(x))), 1.0, rel_tol=1e-12)
    assert max_min_ratio(x) >= 1.0


# --- latency table ---------------------------------------------------------------------------
def result_table():
    nan = np.nan
    return pd.DataFrame({
        "arrival_ms":     [0.0,   10.0,  20.0,  30.0,  40.0,  50.0],
        "tenant":         [0,     0,     0,     1,     1,     1],
        "output_tokens":  [5,     1,     3,     2,     4,     4],
        "admitted_ms":    [5.0,   10.0,  40.0,  30.0,  nan,   60.0],
        "first_token_ms": [15.0,  20.0,  50.0,  40.0,  nan,   70.0],
        "finish_ms":      [55.0,  20.0,  nan,   50.0,  nan,   100.0],
        "rejected":       [False, False, False, False, True,  False],
    })


def test_latency_table_hand_values():
    t = latency_table(result_table(), tenant_names=["a", "b"], percentiles=(50, 100))
    assert list(t.index) == ["a", "b"] and t.index.name == "tenant"
    a, b = t.loc["a"], t.loc["b"]
    assert (a["requests"], a["rejected"], a["finished"]) == (3, 0, 2)
    assert (b["requests"], b["rejected"], b["finished"]) == (3, 1, 2)
    # tenant a: queue 5, 0, 20 -> median 5; ttft 15, 10, 30 -> median 15, max 30
    assert a["queue_p50"] == 5.0 and a["ttft_p50"] == 15.0 and a["ttft_p100"] == 30.0
    # e2e: 55, 10 (the third has not finished) -> median 32.5
    assert a["e2e_p50"] == 32.5
    # tpot: only the 5-token request: (55-15)/4 = 10 (the 1-token one has no TPOT)
    assert a["tpot_p50"] == 10.0 and a["tpot_p100"] == 10.0
    # tenant b, rejected request excluded: tpot (50-40)/1 = 10 and (100-70)/3 = 10
    assert b["tpot_p50"] == 10.0 and b["e2e_p50"] == 35.0 and b["queue_p100"] == 10.0


def test_latency_table_without_names_and_empty_tenants():
    df = result_table()
    t = latency_table(df)
    assert list(t.index) == [0, 1]
    assert list(t.columns[:3]) == ["requests", "rejected", "finished"]
    assert "ttft_p99" in t.columns and "tpot_p90" in t.columns
    t3 = latency_table(df, tenant_names=["a", "b", "idle"])
    assert t3.loc["idle", "requests"] == 0 and math.isnan(t3.loc["idle", "e2e_p50"])
    with pytest.raises(ValueError, match="tenant ids"):
        latency_table(df, tenant_names=["only"])
    with pytest.raises(ValueError, match="finish_ms"):
        latency_table(df.drop(columns="finish_ms"))
    with pytest.raises(ValueError, match="percentiles"):
        latency_table(df, percentiles=(50, 120))


def test_latency_table_matches_numpy_percentiles():
    rng = np.random.default_rng(0)
    n = 500
    arr = np.sort(rng.uniform(0, 1e4, n))
    adm = arr + rng.exponential(50, n)
    first = adm + 20
    out = rng.integers(1, 50, n)
    fin = first + 7.0 * (out - 1)
    df = pd.DataFrame({"arrival_ms": arr, "tenant": rng.integers(0, 3, n), "output_tokens": out,
                       "admitted_ms": adm, "first_token_ms": first, "finish_ms": fin})
    t = latency_table(df, percentiles=(50, 99.9))
    for i in range(3):
        m = df.tenant.to_numpy() == i
        assert math.isclose(t.loc[i, "ttft_p99.9"], np.percentile((first - arr)[m], 99.9))
        assert math.isclose(t.loc[i, "queue_p50"], np.percentile((adm - arr)[m], 50))
        assert math.isclose(t.loc[i, "tpot_p50"], 7.0)


# --- bootstrap -------------------------------------------------------------------------------
def test_bootstrap_deterministic_and_brackets_the_estimate():
    x = np.random.default_rng(1).lognormal(3, 1, 2000)
    a, b = bootstrap_ci(x, q=90, seed=4), bootstrap_ci(x, q=90, seed=4)
    assert a == b and isinstance(a, CI)
    assert a.estimate == np.percentile(x, 90)
    assert a.low < a.estimate < a.high
    assert bootstrap_ci(x, q=90, seed=5) != a
    # a wider level gives a wider interval
    w = bootstrap_ci(x, q=90, seed=4, level=0.99)
    assert w.low <= a.low and w.high >= a.high


def test_bootstrap_mean_ci_covers_and_has_the_normal_width():
    x = np.random.default_rng(2).normal(10.0, 2.0, 4000)
    ci = bootstrap_ci(x, stat=np.mean, n_boot=2000, seed=0)
    se = x.std() / math.sqrt(x.size)
    assert ci.estimate == x.mean()
    assert abs((ci.high - ci.low) - 2 * 1.96 * se) < 0.15 * 2 * 1.96 * se


def test_bootstrap_nan_and_empty_and_validation():
    assert bootstrap_ci([1.0, np.nan, 3.0], stat=np.mean).estimate == 2.0
    assert all(math.isnan(v) for v in bootstrap_ci([np.nan]))
    with pytest.raises(ValueError, match="n_boot"):
        bootstrap_ci([1.0], n_boot=0)
    with pytest.raises(ValueError, match="level"):
        bootstrap_ci([1.0], level=1.5)
    with pytest.raises(ValueError, match="q"):
        bootstrap_ci([1.0], q=101)


def test_bootstrap_large_input_is_chunked_consistently():
    x = np.arange(50_000, dtype=float)
    ci = bootstrap_ci(x, q=50, n_boot=200, seed=0)
    assert ci == bootstrap_ci(x, q=50, n_boot=200, seed=0)
    assert ci.low < 25_000 < ci.high
