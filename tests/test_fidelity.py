"""``fairlib.calibrate.fit`` and ``fairlib.chapters.fidelity`` without engines: the fits on synthetic points, the
saved engine fits and live runs in ``data/`` (what chapters 1 and 8 analyse by default), and the
bounds the chapters assert on them. The live counterparts are in ``tests/test_real_engines.py``."""
import copy
import json
import re
from pathlib import Path

import numpy as np
import pytest

from fairlib import Engine
from fairlib import analysis as an
from fairlib.calibrate import fit
from fairlib.chapters import fidelity as fd
from fairlib.calibrate.probe import load_probed_engine
from fairlib.scenarios import load

ROOT = Path(__file__).resolve().parents[1]


def synthetic_points(base=2.0, s0=0.3, sc=0.001, dt1=None, contexts=(64.0, 352.0, 800.0), batches=(1, 2, 4, 8, 12, 16)):
    pts = []
    for c in contexts:
        for b in batches:
            dt = base + (s0 + sc * c) * b
            if b == 1 and dt1 is not None:
                dt = dt1
            for rep in range(2):
                pts.append({"B": b, "context": c, "prompt_tokens": c - 32, "dt_ms": dt, "concurrent": b, "rep": rep,
                            "server_ms_per_token": dt * 1.02, "server_source": "test"})
    return pts


def test_joint_fit_recovers_the_context_term():
    d = fit.fit_decode(synthetic_points(), max_batch=16)
    j = d["joint"]
    assert j["iter_base_ms"] == pytest.approx(2.0) and j["slope_0_ms"] == pytest.approx(0.3)
    assert j["slope_ctx_ms_per_token"] == pytest.approx(0.001) and j["r2"] == pytest.approx(1.0)
    assert not d["small_batch_regime"] and not d["piecewise_demanded"]
    assert d["server"]["client_over_server_median"] == pytest.approx(1 / 1.02)


def test_small_batch_regime_is_fitted_apart():
    d = fit.fit_decode(synthetic_points(dt1=0.5), max_batch=16)
    assert d["small_batch_regime"] and d["joint"]["B_range"] == [2, 16]
    assert d["joint"]["slope_0_ms"] == pytest.approx(0.3)            # B = 1 left out of the line
    one = d["per_context"]["352.0"]["small_batch_regime"]
    assert one["separate"] and one["dt1_ms"] == 0.5


def test_piecewise_is_demanded_by_a_kink():
    pts = [{"B": b, "context": 100.0, "dt_ms": (1 + 2 * b) if b <= 8 else 12 + 0.1 * b, "concurrent": b}
           for b in (1, 2, 4, 6, 8, 10, 12, 14, 16)]
    d = fit.fit_decode_one(pts, 16)
    assert d["piecewise"]["break_after"] == 8.0 and d["piecewise_demanded"]


def test_prefill_fit_and_quadratic():
    pts = [{"P": p, "ttft_ms": 5 + 0.2 * p + 1e-4 * p * p, "error_class": "none", "server_prefill_ms": 0.2 * p}
           for p in (16, 128, 256, 512, 768) for _ in range(2)]
    f = fit.fit_prefill(pts)
    assert f["quadratic"]["c2"] == pytest.approx(1e-4) and f["quadratic"]["slope_at_256"] == pytest.approx(0.2 + 2e-4 * 256)
    assert f["linear"]["r2"] > 0.99 and f["server"]["linear"]["slope"] == pytest.approx(0.2)


@pytest.mark.parametrize("kind", fd.KINDS)
def test_saved_fit_loads_into_an_engine(kind):
    d = fit.load_fit(kind)
    for key in ("engine", "engine_info", "machine", "date", "params", "fit", "points", "capacity"):
        assert key in d, key
    assert d["engine_info"]["version"] and d["engine_info"]["model_shape"]["layers"] == 4
    assert d["machine"]["cores"] >= 1 and d["machine"]["cpu_model"]
    e = fit.load_fitted_engine(kind)
    assert isinstance(e, Engine) and e == load_probed_engine(fit.fit_data_path(kind))
    assert e == fit.engine_at(d)                                            # the reference context
    s = d["fit"]["summary"]
    assert s["decode_r2"] > 0.9 and s["prefill_r2"] > 0.95 and s["slope_ctx_ms_per_1k_tokens"] > 0
    assert fit.engine_at(d, 800).iter_slope_ms > fit.engine_at(d, 64).iter_slope_ms
    assert 0.8 < s["client_over_server_per_token"] < 1.2
    # a probe-style capacity file: scenarios load relative to the fitted engine
    spec = load("fair_share", capacity=fit.fit_data_path(kind))
    assert spec.engine == e
    assert len(d["points"]["decode"]) >= 30 and len(d["points"]["prefill"]) >= 15


def test_old_loader_names_are_deprecated_aliases():
    """``probe.load_engine`` and ``fit.load_engine`` (the book's old names) warn and give what
    ``load_probed_engine`` and ``load_fitted_engine`` give; ``fit.data_path`` is gone (nothing
    outside the package documented it)."""
    from fairlib.calibrate import probe
    e = fit.load_fitted_engine("vllm")
    with pytest.warns(DeprecationWarning, match="load_fitted_engine"):
        assert fit.load_engine("vllm") == e
    with pytest.warns(DeprecationWarning, match="load_probed_engine"):
        assert probe.load_engine(fit.fit_data_path("vllm")) == e
    assert not hasattr(fit, "data_path")


def test_mean_decode_context_of_constant_lengths():
    from fairlib.workload import Constant, Scenario, TenantSpec
    from fairlib.scenarios import ScenarioSpec, SLO
    sc = Scenario((TenantSpec("a", output=Constant(10), prompt=Constant(100), rate_rps=1.0),), engine=Engine(), duration_s=1)
    spec = ScenarioSpec("x", sc, {"a": SLO(1, 1)}, "", 1.0)
    assert fit.mean_decode_context(spec) == pytest.approx(100 + 11 / 2)


def test_victim_baseline_keeps_the_neighbor_scenarios_rates():
    d = fit.load_fit("vllm")
    nn, nn_info = fd.scenario_spec(d, "noisy_neighbor", 15)
    vb, vb_info = fd.scenario_spec(d, "victim_baseline", 15)
    assert vb.scenario.tenants[0].rate_rps == pytest.approx(nn.scenario.tenants[0].rate_rps)
    a, b = nn.requests(0), vb.requests(0)
    assert np.array_equal(a[a.tenant == 0]["arrival_ms"].to_numpy(), b["arrival_ms"].to_numpy())
    assert vb_info["decode_context"] < nn_info["decode_context"]          # simulated at its own context
    assert vb.engine.iter_slope_ms < nn.engine.iter_slope_ms


def _saved_table():
    names = list(fd.RECORD_SCENARIOS) + ["seed000"]
    runs = [r for k in fd.KINDS for r in fd.load_saved(k, names)]
    return runs, fd.compare_all(fd.simulate_pairs(runs))


def test_saved_runs_meet_the_chapter_bounds():
    runs, table = _saved_table()
    names = set(fd.RECORD_SCENARIOS) | {"seed000"}
    for k in fd.KINDS:
        mine = [r for r in runs if r.extra.get("engine_kind") == k]
        assert {(r.name, r.seed) for r in mine} == {(n, s) for n in names for s in fd.RECORD_SEEDS}
        # the chapter leaves invalid runs out; at least two thirds of each engine's are valid
        assert sum(bool(r.summary["valid"]) for r in mine) >= 2 * len(mine) / 3
    for r in runs:
        assert r.backend == "http" and set(p.name for p in Path(r.path).iterdir()) == set(fd.STORED_FILES)
        if r.name == "seed000":    # cut after its window at 3x overload: some requests time out
            assert r.summary["n_ok"] > 0 and set(r.records["error_class"]) <= {"none", "timeout"}
        else:
            assert r.summary["n_ok"] == r.summary["n_planned"] > 0
    checks = fd.check(table, valid_only=True)
    assert all(ok for c in checks.values() for _, _, ok in c.values()), checks
    summary = fd.error_summary(table, valid_only=True)
    pub = fd.published_table(summary)
    assert {"Vidur", "BLIS", "LLMServingSim 2.0"} <= set(pub["simulator"])


def test_doubling_iter_base_moves_latency_more_than_shares():
    """Chapter 8's sensitivity section on the saved runs: doubling iter_base moves the median share
    error by less than two points and the median E2E p50 error by more than ten points of %."""
    runs, _ = _saved_table()
    sens = fd.sensitivity(runs, params=("iter_base_ms",), factors=(1.0, 2.0))
    t = fd.sensitivity_table(sens)
    for k in fd.KINDS:
        fit1, dbl = t.loc[(k, "iter_base", 1.0)], t.loc[(k, "iter_base", 2.0)]
        assert abs(dbl["machine share"] - fit1["machine share"]) < 2.0
        assert abs(dbl["E2E p50"] - fit1["E2E p50"]) > 10.0


def test_a_changed_schedule_is_refused():
    run = fd.load_saved("llamacpp", ["fair_share"])[0]
    bad = copy.copy(run)
    bad.records = run.records.iloc[:-1]
    with pytest.raises(ValueError, match="not the scenario's"):
        fd.simulate_pairs([bad])


def test_chapter1_saved_split_within_bound():
    run = fd.load_saved("vllm", ["seed000"])[0]
    split = fd.seed000_compare(run)
    worst = split[["difference, split (points)", "difference, priced (points)"]].abs().max().max()
    assert worst <= fd.SEED000_SHARE_PTS
    assert split["simulated, prefill split"].sum() == pytest.approx(100)


def test_saved_data_is_small():
    total = sum(p.stat().st_size for p in (ROOT / "data" / "runs").rglob("*") if p.is_file())
    total += sum(p.stat().st_size for p in (ROOT / "data" / "engines").glob("*.json"))
    # 15.6 MiB on 2026-12-02: chapters 1-4 (5.5), 5 (5.6: 15 runs), 6 (2.4: 5 runs), 7-8 (3.6), fits;
    # the bound catches raw records or uncompressed logs committed by mistake (each run is 0.1-0.6 MiB)
    assert total < 20 * 2 ** 20, f"data/runs + data/engines hold {total / 2**20:.1f} MiB"


def test_live_validity_table_is_the_analysis_one_renamed_plus_the_live_columns():
    runs = fd.load_saved("llamacpp", ["fair_share", "seed000"])
    live = fd.live_validity_table(runs)
    base = an.validity_table(runs)
    assert not hasattr(fd, "validity_table")                      # one validity_table: fairlib.analysis's
    assert list(live.index.names) == ["engine", "scenario", "seed"]
    assert list(live.index) == [("llamacpp", r.name, r.seed) for r in runs]
    for col, shown in fd.LIVE_VALIDITY_COLUMNS.items():
        assert live[shown].tolist() == base[col].tolist(), col
    assert list(live.columns) == [*fd.LIVE_VALIDITY_COLUMNS.values(), "machine load (1 min)", "client pauses",
                                  "client paused (ms)"]
    assert live["client pauses"].tolist() == [fd.stalls(r)["n"] for r in runs]


def test_chart_colours_name_one_thing():
    """Chapter 8's engine colours are none of the policy colours nor chapter 7's measured and
    simulated greys, and its other categories are drawn with dashes and shapes."""
    from fairlib.analysis.charts import POLICY_COLOURS
    import altair as alt
    taken = {c.lower() for c in POLICY_COLOURS.values()} | {"#1a1a1a", "#a0a0a0"}  # + live.live_chart's
    mine = [c.lower() for c in [*fd.ENGINE_COLOURS.values(), fd.OTHER_ENGINE_COLOUR]]
    assert len(set(mine)) == len(mine) and not set(mine) & taken
    runs, _ = _saved_table()
    fits = {k: fit.load_fit(k) for k in fd.KINDS}
    sens = fd.sensitivity([r for r in runs if r.name == "victim_baseline"], params=("iter_base_ms", "prefill_ms_per_token"),
                          factors=(1.0, 2.0))
    for chart in (fd.fit_chart(fits, alt), fd.sensitivity_chart(sens, alt)):
        spec = json.dumps(chart.to_dict())
        used = {c.lower() for c in re.findall(r'"(#[0-9a-fA-F]{6})"', spec)}
        assert used and used <= set(mine), used
