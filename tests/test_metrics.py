"""Tests of fairlib.analysis.indices."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fairlib.analysis.indices import jain_index, max_min_ratio, percentile_cis


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


@pytest.mark.parametrize("bad", [[], [1.0, -1.0], [1.0, float("nan")], [[1.0, 2.0]]])
def test_vector_validation(bad):
    for f in (jain_index, max_min_ratio):
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
    assert max_min_ratio(x) >= 1.0


# --- bootstrap -------------------------------------------------------------------------------
def test_percentile_cis_brackets_and_wider_level_is_wider():
    x = np.random.default_rng(1).lognormal(3, 1, 2000)
    a = percentile_cis(x, (90,), seed=4)
    assert a.equals(percentile_cis(x, (90,), seed=4))
    assert not a.equals(percentile_cis(x, (90,), seed=5))
    est, lo, hi = a.loc[90.0, ["estimate", "low", "high"]]
    assert est == np.percentile(x, 90) and lo < est < hi
    w = percentile_cis(x, (90,), seed=4, level=0.99)
    assert w.loc[90.0, "low"] <= lo and w.loc[90.0, "high"] >= hi


def test_percentile_cis_nan_and_validation():
    t = percentile_cis([1.0, np.nan, 3.0], (50,), n_boot=10)
    assert t.loc[50.0, "estimate"] == 2.0
    assert percentile_cis([np.nan], (50, 99)).isna().all().all()
    with pytest.raises(ValueError, match="n_boot"):
        percentile_cis([1.0], n_boot=0)
    with pytest.raises(ValueError, match="level"):
        percentile_cis([1.0], level=1.5)
    with pytest.raises(ValueError, match="qs"):
        percentile_cis([1.0], (101,))


def test_percentile_cis_large_input_is_chunked_consistently():
    x = np.arange(50_000, dtype=float)     # 4e6 // 5e4 = 80 resamples per block: 3 blocks
    ci = percentile_cis(x, (50,), n_boot=200, seed=0)
    assert ci.equals(percentile_cis(x, (50,), n_boot=200, seed=0))
    assert ci.loc[50.0, "low"] < 24_999.5 < ci.loc[50.0, "high"]
