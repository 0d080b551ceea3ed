"""Tests of fairlib.workload and fairlib.chapters.presets."""
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from fairlib.sim.engine import SEED000_ENGINE, Engine
from fairlib.chapters.presets import SEED000_OUTPUT_MEANS, seed000, spread_means
from fairlib.workload import (
    REQUEST_COLUMNS, Constant, Empirical, Gamma, Geometric, LogNormal, OnOff, Periodic, Poisson,
    Scenario, TenantSpec, Uniform, rng_for,
)


def two_tenants(out1=None):
    out1 = Geometric(100.0) if out1 is None else out1
    return Scenario([
        TenantSpec("a", output=Geometric(20.0), prompt=Uniform(10, 50), rate_rps=5.0),
        TenantSpec("b", output=out1, prompt=Constant(200), arrival="gamma", burstiness=0.5, rate_rps=3.0),
    ], engine=SEED000_ENGINE, duration_s=60.0)


# --- seeding ---------------------------------------------------------------------------------
def test_rng_for_is_the_documented_seed_sequence():
    a = rng_for(7, 2, "output").random(5)
    b = np.random.default_rng(np.random.SeedSequence([7, 2, 2])).random(5)
    assert np.array_equal(a, b)
    codes = {p: rng_for(7, 2, p).random() for p in ("arrivals", "prompt", "output", "content")}
    assert len(set(codes.values())) == 4
    with pytest.raises(ValueError, match="purpose"):
        rng_for(0, 0, "lengths")


def test_same_seed_identical_different_seed_different():
    sc = seed000(duration_s=30.0)
    a, b = sc.requests(3), sc.requests(3)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert a["arrival_ms"].to_numpy().tobytes() == b["arrival_ms"].to_numpy().tobytes()
    c = sc.requests(4)
    assert len(a) != len(c) or not np.array_equal(a["arrival_ms"], c["arrival_ms"])
    # the scenario's own seed is the default
    pd.testing.assert_frame_equal(seed000(seed=3, duration_s=30.0).requests(), a)


def test_request_table_schema_and_order():
    df = two_tenants().requests(1)
    assert tuple(df.columns) == REQUEST_COLUMNS
    assert df["arrival_ms"].dtype == np.float64
    for c in REQUEST_COLUMNS[1:]:
        assert df[c].dtype == np.int64, c
    assert df["arrival_ms"].is_monotonic_increasing
    assert (df["arrival_ms"] >= 0).all() and (df["arrival_ms"] < 60_000).all()
    assert set(df["tenant"]) == {0, 1}
    assert (df.loc[df.tenant == 1, "prompt_tokens"] == 200).all()
    assert df.loc[df.tenant == 0, "prompt_tokens"].between(10, 50).all()
    assert isinstance(df.index, pd.RangeIndex)


def test_ties_are_ordered_by_tenant_index():
    sc = Scenario([TenantSpec(n, output=5, prompt=5, arrival=Periodic(2.0)) for n in ("x", "y", "z")],
                  duration_s=3.0)
    df = sc.requests(0)
    assert list(df["arrival_ms"]) == [0.0] * 3 + [500.0] * 3 + [1000.0] * 3 + [1500.0] * 3 + \
        [2000.0] * 3 + [2500.0] * 3
    assert list(df["tenant"]) == [0, 1, 2] * 6


def test_changing_one_tenant_leaves_the_others_streams_alone():
    a = two_tenants(Geometric(100.0)).requests(11)
    b = two_tenants(LogNormal(400.0, 2.0)).requests(11)
    ta, tb = a[a.tenant == 0].reset_index(drop=True), b[b.tenant == 0].reset_index(drop=True)
    pd.testing.assert_frame_equal(ta, tb, check_exact=True)
    # tenant 1's own arrivals and prompts did not move either; only its outputs did
    ua, ub = a[a.tenant == 1].reset_index(drop=True), b[b.tenant == 1].reset_index(drop=True)
    assert np.array_equal(ua["arrival_ms"], ub["arrival_ms"])
    assert not np.array_equal(ua["output_tokens"], ub["output_tokens"])


def test_est_output_modes():
    def sc(est):
        return Scenario([TenantSpec("a", output=Geometric(23.7), prompt=10, rate_rps=20.0, est_output=est)],
                        duration_s=10.0)
    oracle, mean, none = sc("oracle").requests(0), sc("mean").requests(0), sc(None).requests(0)
    assert np.array_equal(oracle["est_output_tokens"], oracle["output_tokens"])
    assert (mean["est_output_tokens"] == 24).all() and (none["est_output_tokens"] == 24).all()
    assert oracle["output_tokens"].nunique() > 1


def test_klass_priority_and_weights():
    sc = Scenario([TenantSpec("p", output=3, prompt=3, rate_rps=10.0, klass=2, priority=-1, weight=3.0),
                   TenantSpec("q", output=3, prompt=3, rate_rps=10.0)], duration_s=5.0)
    df = sc.requests(0)
    assert (df.loc[df.tenant == 0, ["klass", "priority"]].to_numpy() == [2, -1]).all()
    assert (df.loc[df.tenant == 1, ["klass", "priority"]].to_numpy() == [0, 0]).all()
    assert list(sc.weights) == [3.0, 1.0] and sc.tenant_names == ("p", "q")


# --- arrival processes -----------------------------------------------------------------------
def test_poisson_rate_within_a_few_sigma():
    rate, dur_ms = 50.0, 2_000_000.0  # 100,000 expected arrivals
    t = Poisson(rate).times(rng_for(5, 0, "arrivals"), dur_ms)
    expected = rate * dur_ms / 1000
    assert abs(t.size - expected) < 4 * math.sqrt(expected)
    gaps = np.diff(t)
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.02  # exponential: CV 1


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_burstiness_sets_dispersion(burstiness):
    rate, dur_ms = 20.0, 5_000_000.0
    t = Gamma(rate, burstiness).times(rng_for(1, 0, "arrivals"), dur_ms)
    gaps = np.diff(t)
    assert abs(gaps.mean() - 1000 / rate) / (1000 / rate) < 0.03
    assert abs(gaps.std() / gaps.mean() - 1 / math.sqrt(burstiness)) < 0.05 / math.sqrt(burstiness)


def test_gamma_burstiness_one_and_poisson_agree_in_law_not_in_stream():
    t = TenantSpec("g", output=2, prompt=2, arrival="gamma", burstiness=1.0, rate_rps=4.0)
    assert t.arrival_process(SEED000_ENGINE) == Gamma(4.0, 1.0)


def test_periodic_and_onoff():
    assert list(Periodic(4.0).times(None, 1000.0)) == [0.0, 250.0, 500.0, 750.0]
    assert list(Periodic(4.0, offset_ms=100.0).times(None, 1000.0)) == [100.0, 350.0, 600.0, 850.0]
    a = OnOff(10.0, on_s=2.0, off_s=3.0)
    assert a.peak_rps == 25.0
    t = a.times(rng_for(0, 0, "arrivals"), 1_000_000.0)
    phase = np.mod(t, 5000.0)
    assert (phase < 2000.0).all()  # nothing in the off-windows
    assert abs(t.size - 10_000) < 4 * math.sqrt(10_000)  # long-run mean rate = rate_rps


def test_zero_rate_and_unset_rate():
    assert Poisson(0.0).times(np.random.default_rng(0), 1e6).size == 0
    with pytest.raises(ValueError, match="rate_rps is not set"):
        Poisson().times(np.random.default_rng(0), 1000.0)


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["poisson", "gamma", "periodic", "onoff"]),
       rate=st.floats(0.01, 500.0), dur=st.floats(0.0, 20_000.0),
       b=st.floats(0.05, 20.0), seed=st.integers(0, 2**32))
def test_arrivals_sorted_and_in_range(kind, rate, dur, b, seed):
    proc = {"poisson": Poisson(rate), "gamma": Gamma(rate, b), "periodic": Periodic(rate),
            "onoff": OnOff(rate, on_s=b, off_s=1.0)}[kind]
    t = proc.times(np.random.default_rng(seed), dur)
    assert t.dtype == np.float64 and t.ndim == 1
    assert np.all(np.diff(t) >= 0)
    assert np.all((t >= 0) & (t < dur))


# --- length distributions --------------------------------------------------------------------
length_dists = st.one_of(
    st.integers(1, 10_000).map(Constant),
    st.floats(1.0, 5_000.0).map(Geometric),
    st.tuples(st.floats(1.0, 5_000.0), st.floats(0.0, 3.0)).map(lambda a: LogNormal(*a)),
    st.lists(st.integers(1, 100_000), min_size=1, max_size=50).map(Empirical),
    st.tuples(st.integers(1, 1000), st.integers(0, 1000)).map(lambda a: Uniform(a[0], a[0] + a[1])),
)


@settings(max_examples=100, deadline=None)
@given(dist=length_dists, n=st.integers(0, 300), seed=st.integers(0, 2**32))
def test_length_samples_are_int64_at_least_one(dist, n, seed):
    x = dist.sample(np.random.default_rng(seed), n)
    assert x.dtype == np.int64 and x.shape == (n,)
    assert np.all(x >= 1)
    assert dist.mean >= 1


@pytest.mark.parametrize("dist, tol", [
    (Geometric(23.7), 0.02), (Geometric(353.8), 0.02), (LogNormal(177.0, 1.0), 0.03),
    (Uniform(5, 15), 0.01), (Empirical([1, 2, 3, 10]), 0.02), (Constant(387), 0.0),
])
def test_length_means(dist, tol):
    x = dist.sample(np.random.default_rng(0), 200_000)
    assert abs(x.mean() - dist.mean) <= tol * dist.mean
    if isinstance(dist, Geometric):
        assert x.min() == 1


@pytest.mark.parametrize("make, field", [
    (lambda: Geometric(-3.0), "Geometric.mean"),
    (lambda: Geometric(0.5), "Geometric.mean"),
    (lambda: LogNormal(100.0, -1.0), "LogNormal.sigma"),
    (lambda: Constant(0), "Constant.value"),
    (lambda: Constant(2.5), "Constant.value"),
    (lambda: Uniform(10, 5), "Uniform.high"),
    (lambda: Empirical([]), "Empirical.values"),
    (lambda: Empirical([3, 0]), "Empirical.values"),
    (lambda: Gamma(5.0, 0.0), "Gamma.burstiness"),
    (lambda: Poisson(-1.0), "Poisson.rate_rps"),
    (lambda: OnOff(1.0, on_s=0.0), "OnOff.on_s"),
])
def test_bad_distribution_parameters(make, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        make()


# --- tenants and offered load ----------------------------------------------------------------
def test_machine_ms_per_s_matches_the_hand_computed_seed000_rates():
    # cost of a mean request at B = 24: 0.06*387 + mean_out * (9 + 0.55*24)/24
    #   = 23.22 + mean_out * 22.2/24 = 23.22 + 0.925 * mean_out  ms
    # classify: 23.22 + 0.925*23.7  = 23.22 +  21.9225 =  45.1425 ms -> 750/45.1425 = 16.6140...
    # chat:     23.22 + 0.925*48.0  = 23.22 +  44.4    =  67.62   ms -> 750/67.62   = 11.0914...
    # summarise:23.22 + 0.925*177.0 = 23.22 + 163.725  = 186.945  ms -> 750/186.945 =  4.0119...
    # agent:    23.22 + 0.925*353.8 = 23.22 + 327.265  = 350.485  ms -> 750/350.485 =  2.1399...
    expected = [750 / 45.1425, 750 / 67.62, 750 / 186.945, 750 / 350.485]
    sc = seed000()
    np.testing.assert_allclose(sc.rates_rps(), expected, rtol=1e-12)
    assert abs(sc.rates_rps()[0] - 16.6140) < 1e-4
    np.testing.assert_allclose(sc.offered_ms_per_s(), 750.0, rtol=1e-12)
    assert sc.engine == Engine(9.0, 0.55, 0.06, 24)
    assert sc.tenant_names == ("classify", "chat", "summarise", "agent")


def test_load_batch_changes_the_conversion():
    t = TenantSpec("a", output=Constant(100), prompt=Constant(100), machine_ms_per_s=500.0, load_batch=8)
    cost = 0.06 * 100 + 100 * (9 + 0.55 * 8) / 8
    assert math.isclose(t.resolved_rate_rps(SEED000_ENGINE), 500.0 / cost, rel_tol=1e-12)


def test_seed000_empirical_rates_and_lengths():
    df = seed000(duration_s=600.0).requests(0)
    counts = df.groupby("tenant").size().to_numpy()
    expected = seed000().rates_rps() * 600.0
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))
    means = df.groupby("tenant")["output_tokens"].mean().to_numpy()
    np.testing.assert_allclose(means, SEED000_OUTPUT_MEANS, rtol=0.08)
    assert (df["prompt_tokens"] == 387).all()


def test_seed000_flood_and_output_dists():
    base = seed000().rates_rps()
    f = seed000(flood=3.0).rates_rps()
    assert math.isclose(f[0], 3 * base[0]) and np.array_equal(f[1:], base[1:])
    g = seed000(flood=2.0, flood_tenant="agent").rates_rps()
    assert math.isclose(g[3], 2 * base[3]) and np.array_equal(g[:3], base[:3])
    assert np.array_equal(seed000(flood=2.0, flood_tenant=3).rates_rps(), g)
    c = seed000(output_dist="constant", duration_s=10.0)
    df = c.requests(0)
    assert sorted(df.groupby("tenant")["output_tokens"].unique().map(lambda a: int(a[0]))) == [24, 48, 177, 354]
    assert isinstance(seed000(output_dist="lognormal").tenants[0].output, LogNormal)


@pytest.mark.parametrize("s", [1.0, 2.0, 14.928, 40.0])
def test_spread_keeps_order_and_geometric_mean_and_hits_the_ratio(s):
    sc = seed000(spread=s)
    m = np.array([t.output.mean for t in sc.tenants])
    # the means are rounded to 12 significant digits (portable across CPUs): each within 5e-13, ratios within 1e-11
    assert math.isclose(m.max() / m.min(), s, rel_tol=1e-11)
    pub = np.array(SEED000_OUTPUT_MEANS)
    assert math.isclose(np.exp(np.log(m).mean()), np.exp(np.log(pub).mean()), rel_tol=1e-11)
    if s > 1:
        assert np.all(np.diff(m) > 0)
    np.testing.assert_allclose(sc.offered_ms_per_s(), 750.0, rtol=1e-12)
    # the published spread reproduces the published means
    np.testing.assert_allclose(spread_means(pub, pub.max() / pub.min()), pub, rtol=1e-12)


@pytest.mark.parametrize("call, field", [
    (lambda: TenantSpec("a", output=Geometric(10.0), prompt=Constant(5), rate_rps=1.0, machine_ms_per_s=10.0),
     "exactly once"),
    (lambda: TenantSpec("a", output=Geometric(10.0), prompt=Constant(5)), "exactly once"),
    (lambda: TenantSpec("a", output=Geometric(10.0), prompt=Constant(5), arrival=Poisson(2.0), rate_rps=1.0),
     "exactly once"),
    (lambda: TenantSpec("a", output=Geometric(10.0), prompt=Constant(5), rate_rps=-1.0), "rate_rps"),
    (lambda: TenantSpec("a", output=Geometric(10.0), prompt=Constant(5), machine_ms_per_s=-5.0), "machine_ms_per_s"),
    (lambda: TenantSpec("a", output=Geometric(10.0), prompt=Constant(5), rate_rps=1.0, arrival="bursty"), "arrival"),
    (lambda: TenantSpec("a", output=Geometric(10.0), prompt=Constant(5), rate_rps=1.0, burstiness=2.0), "burstiness"),
    (lambda: TenantSpec("a", output=Geometric(10.0), prompt=Constant(5), rate_rps=1.0, est_output="psychic"),
     "est_output"),
    (lambda: TenantSpec("a", output="long", prompt=Constant(5), rate_rps=1.0), "output"),
    (lambda: TenantSpec("a", output=Geometric(10.0), prompt=Constant(5), rate_rps=1.0, weight=0.0), "weight"),
    (lambda: TenantSpec("a", output=Geometric(10.0), prompt=Constant(5), rate_rps=1.0, load_batch=0), "load_batch"),
    (lambda: TenantSpec("", output=Geometric(10.0), prompt=Constant(5), rate_rps=1.0), "name"),
    (lambda: Scenario([]), "tenants"),
    (lambda: Scenario([TenantSpec("a", output=1, prompt=1, rate_rps=1.0)] * 2), "distinct names"),
    (lambda: Scenario([TenantSpec("a", output=1, prompt=1, rate_rps=1.0)], duration_s=0.0), "duration_s"),
    (lambda: seed000(output_dist="pareto"), "output_dist"),
    (lambda: seed000(flood=-1.0), "flood"),
    (lambda: seed000(flood_tenant="billing"), "flood_tenant"),
    (lambda: seed000(spread=0.5), "spread"),
    (lambda: seed000(spread=1e9), "spread"),
])
def test_bad_input_names_the_field(call, field):
    with pytest.raises(ValueError, match=field):
        call()


def test_arrival_object_with_its_own_rate():
    t = TenantSpec("a", output=2, prompt=2, arrival=OnOff(6.0, on_s=1.0, off_s=2.0))
    assert t.resolved_rate_rps(SEED000_ENGINE) == 6.0
    t2 = TenantSpec("a", output=2, prompt=2, arrival=OnOff(on_s=1.0, off_s=2.0), machine_ms_per_s=100.0)
    assert t2.arrival_process(SEED000_ENGINE) == OnOff(100.0 / SEED000_ENGINE.request_cost_ms(2, 2), 1.0, 2.0)
