"""fairlib.chapters.token_pools_checks: the queue and the debt's decay, on hand-computed cases."""
import numpy as np
import pandas as pd
import pytest

from fairlib.chapters.token_pools_checks import debt_decay, queue_stats


def _requests():
    # A waits 0-10, B 5-20, C refused, D dispatched on arrival at 40
    return pd.DataFrame({"arrival_ms": [0.0, 5.0, 30.0, 40.0], "admitted_ms": [10.0, 20.0, np.nan, 40.0],
                         "rejected": [False, False, True, False]})


def test_queue_length_by_hand():
    q = queue_stats(_requests(), 50.0)
    # length 1 on [0,5), 2 on [5,10), 1 on [10,20), 0 on [20,50): mean (5 + 10 + 10) / 50
    assert q["mean queue"] == pytest.approx(0.5)
    assert q["largest queue"] == 2
    assert q["time empty (%)"] == pytest.approx(60.0)
    assert q["p99 wait (s)"] == pytest.approx(np.percentile([0.010, 0.015, 0.0], 99))


def test_queue_mean_is_the_waits_over_the_window():
    # Little's law on a closed window: the time-weighted length is the summed waits over D
    rng = np.random.default_rng(3)
    a = np.sort(rng.uniform(0, 1000, 200))
    s = a + rng.exponential(30, 200)
    req = pd.DataFrame({"arrival_ms": a, "admitted_ms": s, "rejected": np.zeros(200, bool)})
    D = float(s.max()) + 1
    assert queue_stats(req, D)["mean queue"] == pytest.approx((s - a).sum() / D)


def test_a_request_never_dispatched_waits_to_the_end():
    req = pd.DataFrame({"arrival_ms": [10.0], "admitted_ms": [np.nan], "rejected": [False]})
    q = queue_stats(req, 100.0)
    assert q["mean queue"] == pytest.approx(0.9) and q["time empty (%)"] == pytest.approx(10.0)


def test_queue_refuses_bad_input():
    with pytest.raises(ValueError, match="duration_ms"):
        queue_stats(_requests(), 0)
    with pytest.raises(ValueError, match="admitted_ms"):
        queue_stats(_requests().drop(columns="admitted_ms"), 50.0)


def test_debt_decays_only_once_out_of_demand():
    t = np.arange(0.0, 11.0)
    debt = np.where(t <= 4, 2.0 * t, 8.0 * 2.0 ** (-(t - 4) / 2.0))      # half-life 2 s
    s = pd.DataFrame({"t_s": t, "tenant": "batch", "debt_ms": 1e3 * debt,
                      "waiting": (t <= 4).astype(int), "rejected": 0})
    d = debt_decay(s, "batch", half_life_s=2.0, horizon_s=5.0)
    assert d["last in demand (s)"] == 4 and d["debt then (s)"] == pytest.approx(8.0)
    assert d["not in demand for (s)"] == 6
    assert d["decay predicts (s)"] == pytest.approx(1.0) == d["measured at the end (s)"]
    # a refusal keeps the tenant in demand for the horizon after it
    s2 = s.assign(rejected=(t >= 3).astype(int))
    assert debt_decay(s2, "batch", 2.0, 5.0)["last in demand (s)"] == 8
    with pytest.raises(ValueError, match="no samples of tenant 'x'"):
        debt_decay(s, "x", 2.0, 5.0)


def test_chapter5_estimate_at_its_fixed_point_by_hand():
    from fairlib.chapters.token_pools import TenantLoad, drift_estimate

    tl = TenantLoad("x", "guaranteed", 0.3, 1000.0, 400, 120, 512, 0.3)
    # O / T_base = 0.125 -> clamped 0.25, 1.0, 0.5: B* = 0.58333; premium S = 1.2; F = 1, 1.2, 1.5
    est = drift_estimate(tl, np.array([0, 200, 800]), np.array([64, 512, 256]))
    assert est.tolist() == [358, 430, 537]
    spot = TenantLoad("s", "spot", 0.0, 60000.0, 300, 300, 1024, 1.2)      # batch tier: S = 0.8
    assert drift_estimate(spot, np.array([0]), np.array([1024])).tolist() == [819]
