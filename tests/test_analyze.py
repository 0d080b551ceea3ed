"""fairlib.analysis: hand-computed cases, the residency reconstruction against the simulator's
exact accounting, and one code path for simulated and measured (run-directory) records."""
import copy

import numpy as np
import pandas as pd
import pytest

import fairlib
from fairlib import analysis as an
from fairlib import records, scenarios
from fairlib.client import RECORD_FIELDS
from fairlib.analysis.indices import demand_normalised_jain, jain_index, percentile_cis, water_fill
from fairlib.analysis import run as an_run
from fairlib.analysis import service as an_service
from fairlib.records import Run


def rec(tenant, send, chunks, *, prompt=10, max_tokens=None, error="none", first=None):
    """One record with the client's fields; times in seconds."""
    r = dict.fromkeys(RECORD_FIELDS)
    chunks = list(chunks)
    n = len(chunks)
    r.update(tenant=0 if tenant in ("a", "x") else 1, tenant_name=tenant, prompt_tokens=prompt,
             max_tokens=max_tokens or max(n, 1), intended_send_s=send, actual_send_s=send, error_class=error,
             chunk_times_s=chunks, chunk_tokens=[1] * n, n_token_chunks=n, completion_tokens=n if n else None)
    if n:
        r["first_token_s"], r["last_token_s"] = chunks[0], chunks[-1]
        r["ttft_s"] = chunks[0] - send
        if error == "none":
            r["e2e_s"] = chunks[-1] - send
            if n > 1:
                r["tpot_s"] = (r["e2e_s"] - r["ttft_s"]) / (n - 1)
    return r


def frame(rows):
    return pd.DataFrame(rows, columns=list(RECORD_FIELDS))


def run_of(rows, slos=None, duration_s=10.0, names=("a", "b"), **scen):
    slos = slos or {n: (100.0, 50.0) for n in names}
    tenants = [{"name": n, "ttft_slo_ms": slos[n][0], "tpot_slo_ms": slos[n][1], "rate_rps": 1.0} for n in names]
    cfg = {"extra": {"scenario": {"name": scen.get("name", "hand"), "duration_s": duration_s, "tenants": tenants,
                                  **{k: v for k, v in scen.items() if k != "name"}}, "seed": 0, "backend": "hand"}}
    return Run(frame(rows), cfg, {})


# --- latency -------------------------------------------------------------------------------------
def test_latency_percentiles_hand_computed():
    rows = [rec("a", 0.0, [t / 1000, t / 1000 + 0.02]) for t in (10, 20, 30, 40, 50)]
    rows.append(rec("a", 0.0, [0.9], error="timeout"))               # not completed: left out
    lat = an.latency(frame(rows), ["a"], n_boot=200)
    ttft = lat[lat.metric == "ttft"].set_index("q")
    # np.percentile (linear) of 10..50 ms: p50 30, p90 46, p99 49.6
    np.testing.assert_allclose(ttft["estimate"], [30.0, 46.0, 49.6])
    assert (ttft["n"] == 5).all()
    assert (ttft["low"] <= ttft["estimate"]).all() and (ttft["estimate"] <= ttft["high"]).all()
    tpot = lat[lat.metric == "tpot"]
    np.testing.assert_allclose(tpot["estimate"], 20.0)
    wide = an.latency_wide(lat)
    assert wide.loc["a", "e2e_p50"] == pytest.approx(50.0)


def test_percentile_cis_is_deterministic_and_brackets():
    x = np.random.default_rng(1).exponential(10, 300)
    a = percentile_cis(x, (50, 99), n_boot=300, seed=3)
    b = percentile_cis(x, (50, 99), n_boot=300, seed=3)
    pd.testing.assert_frame_equal(a, b)
    np.testing.assert_allclose(a["estimate"], np.percentile(x, [50, 99]))
    assert (a["low"] <= a["estimate"]).all() and (a["estimate"] <= a["high"]).all()
    assert percentile_cis([], (50,)).isna().all().all()


# --- SLOs ----------------------------------------------------------------------------------------
def test_goodput_on_a_tiny_table():
    # SLOs a: TTFT 100 ms, TPOT 50 ms
    rows = [rec("a", 0.0, [0.05, 0.09, 0.13]),        # TTFT 50, TPOT 40: meets both
            rec("a", 1.0, [1.2, 1.22]),                # TTFT 200: misses TTFT
            rec("a", 2.0, [2.05, 2.15]),               # TPOT 100: misses TPOT
            rec("a", 3.0, [3.01]),                      # one token: no TPOT, meets it
            rec("a", 4.0, [], error="http_429"),        # refused
            rec("b", 0.0, [0.5, 0.6])]                  # b: TTFT 500 > 300
    g = an.goodput(frame(rows), {"a": (100, 50), "b": (300, 200)}, duration_s=10.0, tenant_names=["a", "b"])
    assert g.loc["a", ["sent", "completed", "met_ttft", "met_tpot", "met_both"]].tolist() == [5, 4, 3, 3, 2]
    assert g.loc["a", "attainment"] == pytest.approx(2 / 5)
    assert g.loc["a", "goodput_rps"] == pytest.approx(0.2)
    assert g.loc["a", "throughput_rps"] == pytest.approx(0.4)
    assert g.loc["b", "met_both"] == 0 and g.loc["b", "goodput_rps"] == 0
    with pytest.raises(ValueError, match="no SLO"):
        an.goodput(frame(rows), {"a": (1, 1)}, 10.0, ["a", "b"])


def test_starvation_incidence():
    rows = [rec("a", 0.0, [0.5]),                       # TTFT 500 < 10 x 100
            rec("a", 0.0, [1.5]),                       # TTFT 1500 > 1000: starved
            rec("a", 0.0, [], error="timeout"),         # never a first token: starved
            rec("a", 0.0, [], error="http_429"),        # refused: not counted
            rec("a", 0.0, [], error="connect_error")]   # never reached the server: not counted
    s = an.starvation(frame(rows), {"a": (100, 50)}, tenant_names=["a"])
    assert s.loc["a"].tolist() == [3, 2, pytest.approx(2 / 3), 2]


# --- fairness numbers ----------------------------------------------------------------------------
def test_water_fill_and_demand_normalised_jain():
    np.testing.assert_allclose(water_fill([1, 4, 4], 6), [1, 2.5, 2.5])
    np.testing.assert_allclose(water_fill([1, 4, 4], 20), [1, 4, 4])
    np.testing.assert_allclose(water_fill([10, 10], 6, weights=[1, 2]), [2, 4])
    np.testing.assert_allclose(water_fill([0, 5], 3), [0, 3])
    # a light tenant that got all it asked for and two that split the rest: fair
    assert demand_normalised_jain([1, 2.5, 2.5], [1, 4, 4]) == pytest.approx(1.0)
    assert jain_index([1, 2.5, 2.5]) == pytest.approx(36 / (3 * 13.5))      # raw: 0.889
    # (2, 4) served of demands (10, 10): fair share 3 each -> y = (2/3, 4/3): 4 / (2 * 20/9) = 0.9
    assert demand_normalised_jain([2, 4], [10, 10]) == pytest.approx(0.9)


def test_token_service_weights_one_and_two():
    rows = [rec("a", 0.0, [1.0, 2.0, 3.0], prompt=10, max_tokens=3),      # served 10 + 2*3 = 16
            rec("b", 0.0, [4.0, 12.0], prompt=5, max_tokens=4)]           # in [0, 10): 5 + 2*1 = 7
    ts = an.token_service(run_of(rows, duration_s=10.0))
    assert ts.loc["a", ["prompt_tokens", "output_tokens", "service", "demand"]].tolist() == [10, 3, 16, 16]
    assert ts.loc["b", ["prompt_tokens", "output_tokens", "service", "demand"]].tolist() == [5, 1, 7, 13]
    assert ts["share"].tolist() == pytest.approx([16 / 23, 7 / 23])
    assert an.token_service(run_of(rows), window="all").loc["b", "service"] == 9


# --- residency -----------------------------------------------------------------------------------
def hand_timeline():
    """a: sent 0, tokens at 1 2 3 4; b: sent 1.5, tokens at 3.001 (same iteration as a's 3) and 4;
    c (tenant b too): sent 5.5 to an idle engine, tokens at 6 and 7.

    Intervals: a (0,1] (1,2] (2,3] (3,4]; b (2,3.001] (its first iteration began at the previous
    tick, 2) (3.001,4]; c (5.5,6] (6,7]. Split equally: [0,2) a alone = 2 s; [2,4) a and b share,
    1 s each; [5.5,7) c alone = 1.5 s. a = 3, b = 2.5."""
    return [rec("a", 0.0, [1.0, 2.0, 3.0, 4.0]), rec("b", 1.5, [3.001, 4.0]), rec("b", 5.5, [6.0, 7.0])]


def test_stream_intervals_hand_drawn():
    s, e, t = an.stream_intervals(frame(hand_timeline()), ["a", "b"])
    got = sorted(zip(t.tolist(), s.round(6).tolist(), e.round(6).tolist()))
    assert got == [(0, 0.0, 1.0), (0, 1.0, 2.0), (0, 2.0, 3.0), (0, 3.0, 4.0),
                   (1, 2.0, 3.001), (1, 3.001, 4.0), (1, 5.5, 6.0), (1, 6.0, 7.0)]


def test_residency_hand_drawn():
    r = an.residency(run_of(hand_timeline()), window="all")
    assert r.loc["a", "machine_s"] == pytest.approx(3.0, abs=1e-3)
    assert r.loc["b", "machine_s"] == pytest.approx(2.5, abs=1e-3)
    assert r["busy_s"].iloc[0] == pytest.approx(5.5)
    assert r["share"].sum() == pytest.approx(1.0)
    w = an.residency(run_of(hand_timeline()), window=(0.0, 2.0))
    assert w.loc["a", "machine_s"] == pytest.approx(2.0) and w.loc["b", "machine_s"] == 0.0
    win = an.windowed_fairness(run_of(hand_timeline(), duration_s=8.0), window_s=2.0)
    assert win["t_start_s"].tolist() == [0.0, 2.0, 4.0, 6.0]
    assert win.loc[0, "residency_s_a"] == pytest.approx(2.0)
    assert win.loc[1, ["residency_s_a", "residency_s_b"]].tolist() == pytest.approx([1.0, 1.0], abs=2e-3)
    assert win.loc[1, "jain_residency"] == pytest.approx(1.0, abs=1e-5)
    assert win.loc[3, "active"] == 1                      # only b (its second request) outstanding in [6, 8)
    assert win.loc[3, "jain_residency"] == pytest.approx(1.0)
    assert win.loc[2, "active"] == 1                      # [4, 6): a and b's first done at 4; c sent at 5.5


@pytest.mark.parametrize("policy", ["fcfs", "vtc", "rpm_quota"])
@pytest.mark.parametrize("name", ["fair_share", "noisy_neighbor", "seed000"])
def test_residency_matches_the_simulator_under_decode_only_load(name, policy):
    engine = fairlib.Engine(9.0, 0.55, 0.0, 24)        # no prefill cost: residency is dt/B exactly
    spec = scenarios.load(name, engine=engine, duration_s=20)
    params = {"limit": 40} if policy == "rpm_quota" else {}
    run = records.simulate_run(spec, 1, policy, **params)
    r = an.residency(run, window="all")
    np.testing.assert_allclose(r["machine_s"], run.sim.tenants["machine_ms"] / 1e3, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(r["share"], run.sim.tenants["share"], atol=1e-9)


@pytest.mark.parametrize("name", ["prefill_mix", "slo_mix", "seed000"])
def test_fitted_prefill_recovers_the_exact_charges(name):
    spec = scenarios.load(name, duration_s=15)
    run = records.simulate_run(spec, 0)
    fit = an.fit_iteration_cost(run.records)
    assert fit["iter_base_ms"] == pytest.approx(9.0, rel=1e-6)
    assert fit["iter_slope_ms"] == pytest.approx(0.55, rel=1e-6)
    assert fit["prefill_ms_per_token"] == pytest.approx(0.06, rel=1e-6)
    r = an.residency(run, window="all", prefill="fitted")
    np.testing.assert_allclose(r["machine_s"], run.sim.tenants["machine_ms"] / 1e3, rtol=1e-7)
    assert r["busy_s"].iloc[0] == pytest.approx(run.sim.run["busy_ms"] / 1e3)
    split = an.residency(run, window="all")
    assert np.abs(split["share"] - run.sim.tenants["share"].to_numpy()).max() > 1e-3   # equal split differs


def test_fairness_reports_raw_and_demand_normalised():
    spec = scenarios.load("noisy_neighbor", duration_s=30)
    f = an.fairness(records.simulate_run(spec, 0))
    assert set(f) == {"jain_tokens", "jain_tokens_demand", "max_min_tokens", "jain_residency",
                      "jain_residency_demand", "max_min_residency"}
    assert f["jain_tokens"] < 0.99 < f["jain_tokens_demand"] <= 1.0       # different demands, not unfair


# --- victim, validity ----------------------------------------------------------------------------
def test_victim_degradation_ratio_hand_computed():
    slos = {"a": (100.0, 50.0), "b": (100.0, 50.0)}
    cont = run_of([rec("a", float(i), [i + 0.01 * (i + 1), i + 0.5]) for i in range(5)]
                  + [rec("b", 0.0, [0.1, 0.2])], slos, victim="a")
    alone = run_of([rec("a", float(i), [i + 0.01, i + 0.02]) for i in range(5)], slos, names=("a",))
    vd = an.victim_degradation(cont, alone)                 # the tenant named by the scenario
    # TTFT contention 10..50 ms: p99 49.6; alone all 10 ms
    assert vd.loc["ttft_p99_ms", "contention"] == pytest.approx(49.6)
    assert vd.loc["ttft_p99_ms", "alone"] == pytest.approx(10.0)
    assert vd.loc["ttft_p99_ms", "ratio"] == pytest.approx(4.96)
    # goodput: contention TPOT (500 - ttft) ms > 50 for all: 0/s; alone 5 / 10 s = 0.5/s
    assert vd.loc["goodput_rps", "contention"] == 0 and vd.loc["goodput_rps", "alone"] == pytest.approx(0.5)
    assert vd.loc["goodput_rps", "ratio"] == 0
    assert vd.attrs["tenant"] == "a"


def test_validity_reads_the_summary():
    run = Run(frame([rec("a", 0.0, [0.1])]), {}, {
        "valid": False, "valid_reason": "p99 schedule lag 12.000 ms > 10.0 ms: the client fell behind",
        "schedule_lag_ms": {"p50": 1.0, "p99": 12.0, "max": 20.0}, "lag_threshold_ms": 10.0,
        "requested_rate_rps": 10.0, "achieved_rate_rps": 9.5, "n_planned": 5, "n_ok": 4,
        "error_counts": {"none": 4, "timeout": 1, "http_429": 0}})
    v = an.validity(run)
    assert v["valid"] is False and v["lag_p99_ms"] == 12.0 and v["threshold_ms"] == 10.0
    assert v["achieved_over_requested"] == pytest.approx(0.95)
    assert v["errors"] == {"timeout": 1}


# --- one code path ---------------------------------------------------------------------------------
def test_same_numbers_in_memory_and_from_a_run_directory(tmp_path):
    spec = scenarios.load("slo_mix", duration_s=10)
    run = records.simulate_run(spec, 0)
    records.write_run_dir(run.records, tmp_path / "r", run.config, run.summary)
    a = an.tenant_table(an.analyze_run(run, n_boot=100))
    b = an.tenant_table(an.analyze_run(tmp_path / "r", n_boot=100))
    pd.testing.assert_frame_equal(a, b)


def test_cli_report(tmp_path, capsys):
    dirs = {}
    for name in ("noisy_neighbor", "victim_baseline"):
        spec = scenarios.load(name, duration_s=8)
        for seed in (0, 1):
            run = records.simulate_run(spec, seed)
            d = tmp_path / name / f"seed{seed}"
            records.write_run_dir(run.records, d, run.config, run.summary)
            dirs.setdefault(name, []).append(str(d))
    out = tmp_path / "rep" / "report.md"
    assert an.main(["--run", *dirs["noisy_neighbor"], "--baseline", *dirs["victim_baseline"], "--out", str(out),
                    "--plots", "--n-boot", "50"]) == 0
    text = out.read_text()
    for s in ("## noisy_neighbor [sim:fcfs]", "### Validity", "### Per tenant", "### Victim degradation (interactive",
              "### Fairness", "jain_tokens_demand", "p99", "![noisy_neighbor ttft](report_plots/", "**Question.**",
              "**Answer.** Latency isolation", "## Glossary", "- **jain_residency_demand**: "):
        assert s in text, s
    assert "('interactive', 'ttft')" not in text and "| nan" not in text     # no Python tuples, no nan cells
    plots = tmp_path / "rep" / "report_plots"
    for kind in ("ttft", "jain", "shares", "ttft_over_time", "goodput", "engine", "victim"):
        svg, png = plots / f"noisy_neighbor_sim-fcfs_{kind}.svg", plots / f"noisy_neighbor_sim-fcfs_{kind}.png"
        assert svg.read_text().startswith("<svg") and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", kind
        assert int.from_bytes(png.read_bytes()[16:20], "big") >= 700, kind     # the PNG's width (IHDR)
    assert an.main(["--run", str(tmp_path / "missing"), "--out", str(out)]) == 2
    from fairlib import cli
    assert cli.main(["analyze", "--run", *dirs["noisy_neighbor"], "--out", str(tmp_path / "r2.md"),
                     "--n-boot", "20"]) == 0
    assert "Victim degradation" in (tmp_path / "r2.md").read_text()   # says the baseline is missing


def test_cli_needs_slos_for_runs_without_a_scenario(tmp_path):
    run = records.simulate_run(scenarios.load("fair_share", duration_s=5), 0)
    cfg = {k: v for k, v in run.config.items() if k != "extra"}          # as a bare client run
    d = records.write_run_dir(run.records, tmp_path / "bare", cfg, run.summary)
    out = tmp_path / "r.md"
    assert an.main(["--run", str(d), "--out", str(out), "--n-boot", "20"]) == 2
    assert an.main(["--run", str(d), "--out", str(out), "--n-boot", "20", "--slo", "1000,50"]) == 0
    assert "| a " in out.read_text()
    assert an.main(["--run", str(d), "--out", str(out), "--slo", "1000"]) == 2


# --- report leaves its inputs alone; analyze_run builds the stream intervals once ----------------
def test_report_leaves_the_runs_it_is_given_unchanged():
    bare = records.simulate_run(scenarios.load("fair_share", duration_s=5), 0)
    bare.config = {k: v for k, v in bare.config.items() if k != "extra"}      # no scenario: no SLOs
    named = records.simulate_run(scenarios.load("fair_share", duration_s=5), 1)
    before = [(copy.deepcopy(r.config), copy.deepcopy(r.summary), r.records.copy()) for r in (bare, named)]
    text = an.report([bare, named], n_boot=20, default_slo=(1000.0, 50.0))
    assert "| a " in text
    for r, (config, summary, recs) in zip((bare, named), before):
        assert r.config == config and r.summary == summary
        pd.testing.assert_frame_equal(r.records, recs)
    assert bare.slos == {}                                    # the SLOs went into the report's copy only


def test_analyze_run_builds_the_intervals_once_and_gives_the_same_tables(monkeypatch):
    run = records.simulate_run(scenarios.load("prefill_mix", duration_s=12), 0)
    names = run.tenant_names
    # each public function on its own (building its own intervals)
    res = an.residency(run, "load", names)
    fitted = an.residency(run, "load", names, prefill="fitted")
    fair = an.fairness(run, "load", names)
    win = an.windowed_fairness(run, 4.0, names)
    calls = []
    build = an_service.build_intervals

    def counting(*args, **kw):
        calls.append(args[1:])
        return build(*args, **kw)
    # every name it is built through (intervals_for, which residency, fairness and the windowed
    # indices call when given none, reads the intervals module's own)
    from fairlib.analysis import intervals as an_intervals
    for mod in (an_service, an_run, an_intervals):
        monkeypatch.setattr(mod, "build_intervals", counting)
    an.residency(run, "load", names)                # built on its own: the counter sees it
    assert len(calls) == 1
    calls.clear()
    a = an.analyze_run(run, window_s=4.0, n_boot=20)
    assert len(calls) == 1
    pd.testing.assert_frame_equal(a.residency, res, check_exact=True)
    pd.testing.assert_frame_equal(a.residency_fitted, fitted, check_exact=True)
    assert a.residency_fitted.attrs["fit"] == fitted.attrs["fit"] == a.cost_fit
    assert a.cost_fit["prefill_ms_per_token"] == pytest.approx(0.06, rel=1e-6)   # the engine model's
    assert pd.Series(a.fairness).equals(pd.Series(fair))
    pd.testing.assert_frame_equal(a.windowed, win, check_exact=True)


def test_intervals_built_for_other_tenants_or_tolerance_are_refused():
    run = run_of(hand_timeline())
    iv = an.build_intervals(run.records, ["a", "b"])
    pd.testing.assert_frame_equal(an.residency(run, "all", intervals=iv), an.residency(run, "all"))
    with pytest.raises(ValueError, match="intervals: built for tenants"):
        an.residency(run, "all", ["b", "a"], intervals=iv)
    with pytest.raises(ValueError, match="tick_tol_s"):
        an.windowed_fairness(run, 2.0, tick_tol_s=1e-3, intervals=iv)


def test_validity_table_of_runs_and_of_analyses_is_the_same():
    runs = [records.simulate_run(scenarios.load("fair_share", duration_s=5), s) for s in (0, 1)]
    of_runs = an.validity_table(runs)
    of_analyses = an.validity_table([an.analyze_run(r, n_boot=20) for r in runs])
    pd.testing.assert_frame_equal(of_runs, of_analyses)
    assert of_runs["seed"].tolist() == [0, 1] and of_runs["scenario"].tolist() == ["fair_share"] * 2
    assert of_runs["errors"].tolist() == ["-", "-"] and of_runs["backend"].tolist() == ["sim", "sim"]
