"""fairlib/chapters/methods.py (the methods page, book/methods.ipynb) and the metrics it leans on:
hand-computed cases, conservation laws and agreement between independent paths."""
import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from fairlib.chapters import experiments, methods, presets
from fairlib.sim.engine import SEED000_ENGINE, Engine
from fairlib.analysis.indices import demand_normalised_jain, jain_index, water_fill

#: The exact exchange rates of the seed-000 engine, R(B) = 150 / B + 55 / 6, at B = 8, 24, 48.
EXACT_BATCHES = (8, 24, 48)
EXACT_RATES = tuple(150.0 / b + 55.0 / 6.0 for b in EXACT_BATCHES)
#: The rates as the blog post prints them (2 decimals).
PUBLISHED_RATES = (27.92, 15.42, 12.29)


# --- the cost model ------------------------------------------------------------------------
def test_exact_rates_by_hand():
    # (9 + 0.55 B) / (0.06 B): 27.91666.., 15.41666.., 12.29166..
    assert EXACT_RATES[0] == pytest.approx(27 + 11 / 12, rel=1e-15)
    assert EXACT_RATES[1] == pytest.approx(15 + 5 / 12, rel=1e-15)
    assert EXACT_RATES[2] == pytest.approx(12 + 7 / 24, rel=1e-15)
    for b, r in zip(EXACT_BATCHES, EXACT_RATES):
        assert float(SEED000_ENGINE.exchange_rate(b)) == pytest.approx(r, rel=1e-14)


def test_rate_pairs_recovers_150_and_55_over_6_from_exact_rates():
    t = methods.rate_pairs(EXACT_BATCHES, EXACT_RATES)
    assert list(t.index) == ["8 and 24", "8 and 48", "24 and 48"]
    np.testing.assert_allclose(t["iter_base / prefill"], 150.0, rtol=1e-12)
    np.testing.assert_allclose(t["iter_slope / prefill"], 55.0 / 6.0, rtol=1e-12)


def test_rate_pairs_published_rates_hand_values():
    t = methods.rate_pairs(list(EXACT_BATCHES), list(PUBLISHED_RATES))
    # pair (8, 24): a = (27.92 - 15.42) / (1/8 - 1/24) = 12.5 / (1/12) = 150; b = 15.42 - 150/24
    assert t.loc["8 and 24", "iter_base / prefill"] == pytest.approx(150.0, rel=1e-12)
    assert t.loc["8 and 24", "iter_slope / prefill"] == pytest.approx(15.42 - 6.25, rel=1e-12)
    # pair (24, 48): a = (15.42 - 12.29) / (1/24 - 1/48) = 3.13 * 48 = 150.24; b = 12.29 - 150.24 / 48
    assert t.loc["24 and 48", "iter_base / prefill"] == pytest.approx(150.24, rel=1e-12)
    assert t.loc["24 and 48", "iter_slope / prefill"] == pytest.approx(12.29 - 3.13, rel=1e-12)
    # pair (8, 48): a = (27.92 - 12.29) / (1/8 - 1/48) = 15.63 * 48 / 5
    assert t.loc["8 and 48", "iter_base / prefill"] == pytest.approx(15.63 * 48 / 5, rel=1e-12)
    # every solution goes through both of its points
    for label, row in t.iterrows():
        bi, bj = (int(v) for v in label.split(" and "))
        for b in (bi, bj):
            r = PUBLISHED_RATES[EXACT_BATCHES.index(b)]
            assert row["iter_base / prefill"] / b + row["iter_slope / prefill"] == pytest.approx(r, rel=1e-12)


def test_rate_check_seed000_within_rounding_and_a_wrong_engine_not():
    t = methods.rate_check(SEED000_ENGINE, EXACT_BATCHES, PUBLISHED_RATES)
    assert list(t.index) == list(EXACT_BATCHES)
    np.testing.assert_allclose(t["difference"], [-1 / 300, -1 / 300, 1 / 600], atol=1e-12)
    assert t["within rounding"].all()
    off = methods.rate_check(Engine(9.5, 0.55, 0.06, 24), EXACT_BATCHES, PUBLISHED_RATES)
    # 9.5 / (0.06 * 8) adds 0.5 / 0.48 = 1.04 at B = 8
    assert off.loc[8, "difference"] == pytest.approx(0.5 / 0.48 - 1 / 300, rel=1e-9)
    assert not off["within rounding"].any()


def test_exact_ratios_seed000_and_another_engine():
    a, b = methods.exact_ratios()
    assert (a, b) == (Fraction(150), Fraction(55, 6))
    assert isinstance(a, Fraction) and isinstance(b, Fraction)
    # decimal parameters are read as written, not as their binary approximations
    assert methods.exact_ratios(Engine(4.5, 0.3, 0.02, 8)) == (Fraction(225), Fraction(15))
    assert methods.exact_ratios(Engine(0.9, 0.055, 0.006, 8)) == (Fraction(150), Fraction(55, 6))


@pytest.mark.parametrize("prefill", [0.01, 0.03, 0.06, 0.0613, 0.2])
def test_engine_at_prefill_keeps_the_exchange_rates(prefill):
    e = methods.engine_at_prefill(prefill)
    assert e.prefill_ms_per_token == prefill and e.max_batch == 24
    assert e.iter_base_ms == pytest.approx(150 * prefill, rel=1e-15)
    assert e.iter_slope_ms == pytest.approx(55 / 6 * prefill, rel=1e-15)
    for b, r in zip(EXACT_BATCHES, EXACT_RATES):
        assert float(e.exchange_rate(b)) == pytest.approx(r, rel=1e-13)


def test_engine_at_prefill_006_is_the_seed000_engine():
    e = methods.engine_at_prefill(0.06)
    for name in ("iter_base_ms", "iter_slope_ms", "prefill_ms_per_token", "max_batch"):
        assert getattr(e, name) == pytest.approx(getattr(SEED000_ENGINE, name), rel=1e-15)


@pytest.mark.parametrize("prefill", [0.03, 0.09])
def test_seed000_at_prefill_every_tenant_still_offers_750_ms_per_s(prefill):
    sc = methods.seed000_at_prefill(prefill, duration_s=10.0)
    assert sc.engine.prefill_ms_per_token == prefill and sc.duration_s == 10.0
    for t, rate in zip(sc.tenants, sc.rates_rps()):
        cost = float(sc.engine.request_cost_ms(t.prompt.mean, t.output.mean))
        assert rate * cost == pytest.approx(750.0, rel=1e-12)
    # a faster machine (smaller prefill) makes every request cheaper, so more of them arrive
    base = methods.seed000_at_prefill(0.06, duration_s=10.0)
    ratio = np.asarray(sc.rates_rps()) / np.asarray(base.rates_rps())
    np.testing.assert_allclose(ratio, 0.06 / prefill, rtol=1e-12)


def test_crossing_hand_cases():
    assert methods.crossing([0, 1, 2], [0, 10, 20], 15) == pytest.approx(1.5)
    assert methods.crossing([0, 1, 2], [0, 10, 20], 10) == pytest.approx(1.0)
    assert methods.crossing([1.0, 3.0], [8.0, 4.0], 5.0) == pytest.approx(2.5)   # decreasing
    assert methods.crossing([0, 1, 2, 3], [0, 5, 5, 9], 7) == pytest.approx(2.5)  # past a flat part
    assert methods.crossing([0, 1, 2], [1, 1, 1], 1) != methods.crossing([0, 1, 2], [1, 1, 1], 1)  # NaN
    assert math.isnan(methods.crossing([0, 1, 2], [0, 10, 20], 25))
    assert math.isnan(methods.crossing([0, 1, 2], [0, 10, 20], -1))
    # agrees with the independent implementation in fairlib.chapters.experiments on an increasing curve
    x, y = [0.5, 1.0, 2.0, 4.0], [0.1, 0.4, 0.45, 2.0]
    for target in (0.2, 0.42, 1.3):
        assert methods.crossing(x, y, target) == pytest.approx(
            experiments.first_crossing(x, y, [target] * 4), rel=1e-14)


# --- output means from the published shares ----------------------------------------------
def test_share_model_quota_by_hand():
    # a request of m output tokens costs 0.06 * 387 + m * (9 + 0.55 * 24) / 24 = 23.22 + 0.925 m
    s = methods.share_model([0.0, 100.0], "quota")
    c0, c1 = 23.22, 23.22 + 92.5
    np.testing.assert_allclose(s, [c0 / (c0 + c1), c1 / (c0 + c1)], rtol=1e-13)
    assert math.fsum(methods.share_model(presets.SEED000_OUTPUT_MEANS, "quota")) == pytest.approx(1.0, abs=1e-15)


def test_share_model_vtc_equal_when_weights_are_the_exchange_rate():
    # VTC shares are proportional to cost / price; cost / price is the same for every length
    # exactly when wq / wp is the machine's exchange rate (prefill: 1 token = wp, decode: R)
    r = float(SEED000_ENGINE.exchange_rate(24))
    s = methods.share_model([1.0, 23.7, 48.0, 177.0, 353.8, 5000.0], "vtc", wp=1.0, wq=r)
    np.testing.assert_allclose(s, 1 / 6, rtol=1e-13)


def test_share_model_agrees_with_counter_shares():
    means = presets.SEED000_OUTPUT_MEANS
    for wp, wq in ((1.0, 2.0), (1.0, 15.0), (0.5, 3.0)):
        a = methods.share_model(means, "vtc", wp=wp, wq=wq)
        b = experiments.counter_shares(SEED000_ENGINE, [387] * 4, means, wp=wp, wq=wq)
        np.testing.assert_allclose(a, b, rtol=1e-13)
    # the quota's model: counts equal, shares = cost / sum of costs
    costs = [float(SEED000_ENGINE.request_cost_ms(387, m)) for m in means]
    np.testing.assert_allclose(methods.share_model(means, "quota"), np.array(costs) / sum(costs), rtol=1e-13)


@pytest.mark.parametrize("policy", ["vtc", "quota"])
def test_means_from_shares_inverts_share_model(policy):
    means = presets.SEED000_OUTPUT_MEANS
    shares = list(methods.share_model(means, policy))
    sol = methods.means_from_shares(shares, {0: means[0], 3: means[3]}, policy)
    assert set(sol) == {0, 3}
    for ref in (0, 3):
        assert set(sol[ref]) == {1, 2}
        assert sol[ref][1] == pytest.approx(48.0, rel=1e-10)
        assert sol[ref][2] == pytest.approx(177.0, rel=1e-10)
    # shares as percentages give the same answer (only ratios matter)
    pct = methods.means_from_shares([100 * s for s in shares], {0: means[0]}, policy)
    assert pct[0][3] == pytest.approx(353.8, rel=1e-10)


def test_means_from_shares_quota_by_hand():
    # twice the share at an equal count is twice the cost: 23.22 + 0.925 m = 2 (23.22 + 0.925 * 10)
    sol = methods.means_from_shares([1.0, 2.0], {0: 10.0}, "quota")
    assert sol[0][1] == pytest.approx((2 * (23.22 + 9.25) - 23.22) / 0.925, rel=1e-12)
    with pytest.raises(ValueError, match="policy"):
        methods.means_from_shares([1.0, 2.0], {0: 10.0}, "fcfs")
    with pytest.raises(ValueError, match="policy"):
        methods.share_model([1.0, 2.0], "fcfs")


# --- output-length distributions in closed form -------------------------------------------
def test_length_quantile_geometric_hand_cases():
    # mean 2: p = 1/2, P(L <= k) = 1 - 2^-k
    assert methods.length_quantile("geometric", 2.0, 0.5) == 1
    assert methods.length_quantile("geometric", 2.0, 0.75) == 2      # exactly on a step
    assert methods.length_quantile("geometric", 2.0, 0.875) == 3
    assert methods.length_quantile("geometric", 2.0, 0.876) == 4
    # mean 4: p = 1/4, P(L <= k) = 1 - 0.75^k; 0.75^2 = 0.5625, 0.75^3 = 0.421875
    assert methods.length_quantile("geometric", 4.0, 0.5) == 3
    assert methods.length_quantile("geometric", 1.0, 0.99) == 1       # mean 1: always 1 token


def test_length_constant_hand_cases():
    assert methods.length_quantile("constant", 23.7, 0.5) == 24
    assert methods.length_quantile("constant", 353.8, 0.99) == 354
    assert methods.length_quantile("constant", 48.5, 0.1) == 49      # half up, like the preset
    assert methods.length_ccdf("constant", 23.7, 23) == 1.0
    assert methods.length_ccdf("constant", 23.7, 24) == 0.0


def test_length_lognormal_median_by_hand():
    # median of exp(N(mu, s)) is exp(mu) = mean * exp(-s^2 / 2); mean 100, s = 1: 60.65 -> 61
    assert methods.length_quantile("lognormal", 100.0, 0.5) == 61
    assert methods.length_quantile("lognormal", 100.0, 0.5, sigma=0.5) == round(100 * math.exp(-0.125))
    assert methods.length_ccdf("lognormal", 100.0, 0, sigma=1.0) <= 1.0


@pytest.mark.parametrize("dist", presets.SEED000_OUTPUT_DISTS)
@pytest.mark.parametrize("mean", [1.5, 23.7, 48.0, 177.0, 353.8])
def test_length_quantile_agrees_with_length_ccdf(dist, mean):
    for q in (0.1, 0.5, 0.9, 0.99):
        k = methods.length_quantile(dist, mean, q)
        assert k >= 1
        assert 1.0 - methods.length_ccdf(dist, mean, k) >= q - 1e-12
        if k > 1:
            assert 1.0 - methods.length_ccdf(dist, mean, k - 1) < q + 1e-12


@pytest.mark.parametrize("dist", presets.SEED000_OUTPUT_DISTS)
def test_length_ccdf_is_a_survival_function(dist):
    mean = 48.0
    v = [methods.length_ccdf(dist, mean, k) for k in range(0, 3000)]
    assert v[0] == 1.0                        # every answer has at least one token
    assert all(a >= b for a, b in zip(v, v[1:]))
    assert v[-1] < 1e-4


@pytest.mark.parametrize("dist,cls", [("geometric", "Geometric"), ("lognormal", "LogNormal")])
def test_length_ccdf_agrees_with_the_workload_sampler(dist, cls):
    from fairlib import workload
    rng = np.random.default_rng(7)
    n = 200_000
    for mean in (23.7, 177.0):
        x = getattr(workload, cls)(mean).sample(rng, n)
        for k in (1, 5, 20, 60, 200, 600):
            emp = float(np.count_nonzero(x > k)) / n
            p = methods.length_ccdf(dist, mean, k)
            assert abs(emp - p) <= 5 * math.sqrt(max(p * (1 - p), 1e-6) / n) + 1e-4, (mean, k, emp, p)


def test_length_functions_reject_unknown_distributions():
    with pytest.raises(ValueError, match="dist"):
        methods.length_quantile("pareto", 10.0, 0.5)
    with pytest.raises(ValueError, match="dist"):
        methods.length_ccdf("pareto", 10.0, 3)


def test_ccdf_table_shape_and_values():
    t = methods.ccdf_table(max_tokens=100, points_per_decade=4)
    ks = sorted(t["tokens"].unique())
    assert ks[0] == 1 and ks[-1] == 100
    assert len(t) == 3 * 4 * len(ks)
    row = t[(t["distribution"] == "geometric") & (t["tenant"] == "classify") & (t["tokens"] == 10)]
    assert row["P(L > tokens)"].iloc[0] == round((1 - 1 / 23.7) ** 10, 6)


def test_length_table_means_agree_with_the_request_tables():
    t = methods.length_table(seeds=[0, 1], qs=(0.5,), duration_s=10.0)
    assert list(t.index.get_level_values("distribution").unique()) == list(presets.SEED000_OUTPUT_DISTS)
    sc = presets.seed000(output_dist="constant", duration_s=10.0)
    counts = sum(np.bincount(sc.requests(s)["tenant"].to_numpy(), minlength=4) for s in (0, 1))
    assert list(t.loc["constant", "requests"]) == list(counts)
    # constant outputs: the realised mean is the rounded nominal one, exactly
    assert list(t.loc["constant", "mean in the request tables"]) == [24.0, 48.0, 177.0, 354.0]
    assert list(t.loc["geometric", "nominal mean"]) == list(presets.SEED000_OUTPUT_MEANS)


# --- demand and water-filling -------------------------------------------------------------
def test_water_fill_hand_example():
    np.testing.assert_array_equal(water_fill([100, 750, 750, 750], 1000), [100, 300, 300, 300])
    np.testing.assert_allclose(water_fill([1, 4, 4], 6), [1, 2.5, 2.5])
    np.testing.assert_allclose(water_fill([10, 20, 1000, 1000], 100), [10, 20, 35, 35])  # two rounds
    np.testing.assert_allclose(water_fill([100, 1000, 1000], 700, weights=[1, 1, 2]), [100, 200, 400])
    np.testing.assert_array_equal(water_fill([100, 200], 1000), [100, 200])   # enough for everyone
    np.testing.assert_array_equal(water_fill([0, 50, 50], 40), [0, 20, 20])


def test_water_fill_conservation_on_random_demands():
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(2, 9))
        d = rng.exponential(100.0, n) * (rng.random(n) < 0.9)
        cap = float(rng.uniform(0, 1.2) * d.sum())
        w = rng.uniform(0.5, 3.0, n)
        a = water_fill(d, cap, weights=w)
        assert np.all(a <= d + 1e-9) and np.all(a >= 0)
        assert a.sum() == pytest.approx(min(cap, d.sum()), rel=1e-12, abs=1e-9)
        short = a < d - 1e-9          # tenants that did not get all they asked for share one level
        if short.any():
            level = a[short] / w[short]
            np.testing.assert_allclose(level, level[0], rtol=1e-9)
            assert np.all(d[~short] / w[~short] <= level[0] * (1 + 1e-9) + 1e-12)


def test_demand_normalised_jain_hand_example():
    demand = [100, 750, 750, 750]
    fair = [100, 300, 300, 300]
    assert demand_normalised_jain(fair, demand) == pytest.approx(1.0, abs=1e-15)
    assert jain_index(fair) == pytest.approx(25 / 28, rel=1e-15)   # 1000^2 / (4 * 280000)
    # an even split of the same 1000 gives the light tenant 250 of which it asked for 100:
    # service / fair = (2.5, 250/300 x3); Jain of that by hand
    y = [2.5, 5 / 6, 5 / 6, 5 / 6]
    want = sum(y) ** 2 / (4 * sum(v * v for v in y))
    assert demand_normalised_jain([250, 250, 250, 250], demand) == pytest.approx(want, rel=1e-14)
    assert jain_index([250] * 4) == 1.0
    # zero-demand tenants are left out
    assert demand_normalised_jain([0, 100, 300], [0, 100, 750]) == pytest.approx(1.0, abs=1e-15)


def test_request_cost_by_tenant_by_hand():
    sc = presets.seed000(duration_s=10.0)
    d = methods.request_cost_by_tenant(sc, 0)
    req = sc.requests(0)
    per_seq = (9.0 + 0.55 * 24) / 24
    hand = [math.fsum(0.06 * p + o * per_seq for p, o in zip(g["prompt_tokens"], g["output_tokens"]))
            for _, g in req.groupby("tenant")]
    np.testing.assert_allclose(d, hand, rtol=1e-12)
    # at another batch
    d8 = methods.request_cost_by_tenant(sc, 0, batch=8)
    out = req.groupby("tenant")["output_tokens"].sum().to_numpy()
    np.testing.assert_allclose(d8 - d, out * ((9 + 0.55 * 8) / 8 - per_seq), rtol=1e-9)


def _hand_made_runs():
    """A light tenant (100 of 750 ms/s) among three: one run served by water-filling half the
    demand ("fair"), one split evenly ("even")."""
    names = list(presets.SEED000_TENANTS)
    build = lambda s: presets.seed000(seed=s, duration_s=10.0, flood=100.0 / 750.0, flood_tenant=0)  # noqa: E731
    d = methods.request_cost_by_tenant(build(0), 0)
    busy = 0.5 * float(d.sum())
    fair = water_fill(d, busy)
    runs = pd.DataFrame([
        {"seed": 0, "policy": "fair", "busy_ms": busy, **{f"share_{n}": f / busy for n, f in zip(names, fair)}},
        {"seed": 0, "policy": "even", "busy_ms": busy, **{f"share_{n}": 0.25 for n in names}},
    ])
    return names, build, d, busy, fair, runs


def test_demand_example_on_hand_made_runs():
    names, build, d, busy, fair, runs = _hand_made_runs()
    t = methods.demand_example(runs, build, names)
    assert len(t) == 8 and list(t["tenant"]) == names * 2
    np.testing.assert_allclose(t["demand_ms"], np.concatenate([d, d]), rtol=1e-15)
    fair_rows, even_rows = t[t["policy"] == "fair"], t[t["policy"] == "even"]
    # conservation: the fair allocation hands out exactly the service delivered
    for rows in (fair_rows, even_rows):
        assert rows["fair_ms"].sum() == pytest.approx(busy, rel=1e-12)
        assert rows["service_ms"].sum() == pytest.approx(busy, rel=1e-12)
        np.testing.assert_allclose(rows["fair_ms"], fair, rtol=1e-12)
    np.testing.assert_allclose(fair_rows["service_ms"], fair, rtol=1e-12)
    assert fair_rows["jain_demand"].iloc[0] == pytest.approx(1.0, abs=1e-12)
    assert fair_rows["jain_raw"].iloc[0] == pytest.approx(jain_index(fair), rel=1e-14)
    assert even_rows["jain_raw"].iloc[0] == pytest.approx(1.0, abs=1e-15)
    assert even_rows["jain_demand"].iloc[0] < 0.99      # the light tenant got more than it asked


def test_demand_table_rows_and_water_filling_row():
    names, build, d, busy, fair, runs = _hand_made_runs()
    t = methods.demand_table(methods.demand_example(runs, build, names), names, {"even": "EVEN"})
    assert list(t.index) == ["fair", "EVEN", "water-filling"]
    assert list(t.columns) == names + ["Jain (raw)", "Jain (demand-normalised)"]
    np.testing.assert_allclose(t.loc["EVEN", names], 25.0, rtol=1e-12)
    np.testing.assert_allclose(t.loc["fair", names], fair / busy * 100, rtol=1e-12)
    # the water-filling row: the fair shares and both indices computed on them, no NaN
    np.testing.assert_allclose(t.loc["water-filling", names], fair / busy * 100, rtol=1e-12)
    assert t.loc["water-filling", "Jain (raw)"] == pytest.approx(jain_index(fair), rel=1e-12)
    assert t.loc["water-filling", "Jain (demand-normalised)"] == pytest.approx(1.0, abs=1e-12)
    assert not t.isna().any().any()
    np.testing.assert_allclose(t[names].sum(axis=1), 100.0, rtol=1e-12)


def test_within_published_counts_figures_within_tolerance():
    from fairlib.chapters import published
    names = list(presets.SEED000_TENANTS)
    pub = published.figure("ch1.share.rpm_quota")["value"]
    mm = published.figure("ch1.maxmin.rpm_quota")["value"]
    share_tol = published.figure("ch1.share.rpm_quota")["tolerance"]["abs"]
    table = pd.DataFrame([dict(zip(names, pub), **{"max/min": mm}),
                          dict(zip(names, [v + 2 * share_tol for v in pub]), **{"max/min": mm}),
                          dict(zip(names, pub), **{"max/min": 10 * mm})], index=["at", "off", "ratio"])
    got = methods.within_published(table, "ch1.share.rpm_quota", "ch1.maxmin.rpm_quota", names)
    assert got.to_dict() == {"at": 5, "off": 1, "ratio": 4}


def test_params_text():
    assert methods.params_text({}) == "\u2014"
    assert methods.params_text({"wp": 1.0, "wq": 15.41666666666667}) == "wp = 1, wq = 15.4167"
    assert methods.params_text({"cap": 6, "window": 5}) == "cap = 6, window = 5"
