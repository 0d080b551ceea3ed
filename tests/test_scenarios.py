"""fairlib.scenarios: the scenario files, capacity-relative load, and the loader's validation."""
import json

import numpy as np
import pytest

import fairlib
from fairlib import scenarios
from fairlib.chapters import presets
from fairlib.scenarios import SLO, engine_capacity_rps, load

GOOD = """
name = "t"
description = "a test scenario"
duration_s = 10.0
rho = 0.5
seeds = [0, 1, 2]

[[tenants]]
name = "a"
share = 1
prompt = 100
output = { dist = "geometric", mean = 20 }
ttft_slo_ms = 100
tpot_slo_ms = 20

[[tenants]]
name = "b"
share = 3
prompt = { dist = "uniform", low = 10, high = 30 }
output = { dist = "constant", value = 40 }
arrival = { process = "gamma", burstiness = 0.5 }
ttft_slo_ms = 1000
tpot_slo_ms = 50
priority = 1
"""


def write(tmp_path, text, name="t.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_every_shipped_scenario_loads():
    assert scenarios.available()[:7] == scenarios.SCENARIOS
    for name in scenarios.SCENARIOS:
        spec = load(name)
        assert spec.name == name and spec.scenario.name == name
        assert len(spec.seeds) == 3
        assert set(spec.slos) == set(spec.tenant_names)
        assert all(isinstance(s, SLO) and s.ttft_ms > 0 and s.tpot_ms > 0 for s in spec.slos.values())
        assert spec.description and spec.question
        json.dumps(spec.to_dict())                  # JSON-ready (it goes into config.json)
        assert len(spec.requests(0)) > 0


def test_engine_capacity_hand_computed():
    e = fairlib.Engine(9.0, 0.55, 0.06, 24)
    # B = 24: dt = 9 + 13.2 + 0.06 * 256 * 24 / 128 = 25.08 ms; capacity = 24000 / (128 * 25.08)
    assert engine_capacity_rps(e, 256, 128) == pytest.approx(24000 / (128 * 25.08), rel=1e-12)
    assert engine_capacity_rps(e, 256, 128) == pytest.approx(1000 / float(e.request_cost_ms(256, 128)), rel=1e-12)
    with pytest.raises(ValueError, match="mean_output"):
        engine_capacity_rps(e, 10, 0.5)


def test_rates_are_rho_times_share_times_capacity(tmp_path):
    spec = load(write(tmp_path, GOOD))
    e = spec.engine
    cap_a = engine_capacity_rps(e, 100, 20)
    cap_b = engine_capacity_rps(e, 20, 40)
    np.testing.assert_allclose(spec.scenario.rates_rps(), [0.5 * 0.25 * cap_a, 0.5 * 0.75 * cap_b], rtol=1e-12)
    # tenants together offer rho of the machine's milliseconds
    assert spec.scenario.offered_ms_per_s().sum() == pytest.approx(500.0, rel=1e-12)
    assert spec.slos == {"a": SLO(100.0, 20.0), "b": SLO(1000.0, 50.0)}
    assert spec.scenario.tenants[1].priority == 1
    assert load(write(tmp_path, GOOD), rho=1.0).scenario.offered_ms_per_s().sum() == pytest.approx(1000.0)
    assert load(write(tmp_path, GOOD), duration_s=3).duration_s == 3.0


def test_overload_is_1_4_and_seed000_matches_the_preset():
    assert load("overload").rho == 1.4
    assert load("overload").scenario.offered_ms_per_s().sum() == pytest.approx(1400.0)
    a, b = load("seed000").requests(3), presets.seed000(seed=3).requests(3)
    assert a.drop(columns="arrival_ms").equals(b.drop(columns="arrival_ms"))
    np.testing.assert_allclose(a["arrival_ms"], b["arrival_ms"], rtol=1e-12)
    np.testing.assert_allclose(load("seed000").scenario.rates_rps(), presets.seed000().rates_rps(), rtol=1e-12)


def test_victim_baseline_is_the_victim_alone_at_the_same_rate():
    nn, vb = load("noisy_neighbor"), load("victim_baseline")
    assert nn.victim == "interactive" and nn.baseline == "victim_baseline" and vb.baseline_of == "noisy_neighbor"
    assert vb.tenant_names == ("interactive",)
    assert vb.scenario.rates_rps()[0] == nn.scenario.rates_rps()[0]
    assert vb.slos["interactive"] == nn.slos["interactive"]
    a = nn.requests(1)
    b = vb.requests(1)
    mine = a[a["tenant"] == 0].reset_index(drop=True)
    np.testing.assert_array_equal(mine["arrival_ms"], b["arrival_ms"])        # the very same requests
    np.testing.assert_array_equal(mine["output_tokens"], b["output_tokens"])
    # overrides reach the baseline through its base
    assert load("victim_baseline", rho=0.45).scenario.rates_rps()[0] == pytest.approx(nn.scenario.rates_rps()[0] / 2)


def test_capacity_inputs(tmp_path):
    base = load("fair_share")
    # a number: requests/s of the share-weighted mean request, scaled by the model's cost ratios
    spec = load("fair_share", capacity=2 * engine_capacity_rps(base.engine, 256, 128))
    np.testing.assert_allclose(spec.scenario.rates_rps(), 2 * base.scenario.rates_rps(), rtol=1e-9)
    assert spec.capacity_source == "given"
    # a probe result: its fitted engine is the engine
    probe = {"engine": {"iter_base_ms": 5.0, "iter_slope_ms": 1.0, "prefill_ms_per_token": 0.02, "max_batch": 16,
                        "max_prefill_tokens": None, "kv_capacity_tokens": None}, "capacity": {"requests_per_s": 1}}
    p = tmp_path / "probe.json"
    p.write_text(json.dumps(probe))
    spec = load("fair_share", capacity=p)
    assert spec.engine == fairlib.Engine(5.0, 1.0, 0.02, 16) and spec.capacity_source == str(p)
    assert spec.capacity_rps["a"] == pytest.approx(engine_capacity_rps(spec.engine, 256, 128))
    assert load("fair_share", capacity=probe).engine == spec.engine
    with pytest.raises(ValueError, match="capacity"):
        load("fair_share", capacity=-1)
    with pytest.raises(ValueError, match="capacity"):
        load("fair_share", capacity={"nothing": 1})
    eng = fairlib.Engine(8.0, 1.0, 0.1, 8)
    assert load("fair_share", engine=eng).engine == eng


@pytest.mark.parametrize("edit,field", [
    (lambda s: s.replace("rho = 0.5", "rhoo = 0.5"), "rhoo"),
    (lambda s: s.replace("rho = 0.5\n", ""), "rho"),
    (lambda s: s.replace("rho = 0.5", "rho = -1"), "rho"),
    (lambda s: s.replace('description = "a test scenario"\n', ""), "description"),
    (lambda s: s.replace("ttft_slo_ms = 100\n", ""), "tenants[0] (a).ttft_slo_ms"),
    (lambda s: s.replace("tpot_slo_ms = 50", 'tpot_slo_ms = "fast"'), "tenants[1] (b).tpot_slo_ms"),
    (lambda s: s.replace("share = 3", "share = 0"), "tenants[1] (b).share"),
    (lambda s: s.replace('dist = "geometric"', 'dist = "zipf"'), "tenants[0] (a).output.dist"),
    (lambda s: s.replace("mean = 20", "mean = 20, sigma = 1"), "tenants[0] (a).output.sigma"),
    (lambda s: s.replace('process = "gamma"', 'process = "hawkes"'), "tenants[1] (b).arrival.process"),
    (lambda s: s.replace("burstiness = 0.5", "burstiness = 0"), "tenants[1] (b).arrival.burstiness"),
    (lambda s: s.replace("prompt = 100", "prompt = 0"), "tenants[0] (a).prompt"),
    (lambda s: s.replace("prompt = 100\n", ""), "tenants[0] (a).prompt"),
    (lambda s: s.replace('name = "b"', 'name = "a"'), "tenants"),
    (lambda s: s.replace("priority = 1", "priority = 1.5"), "tenants[1] (b).priority"),
    (lambda s: s.replace("seeds = [0, 1, 2]", "seeds = []"), "seeds"),
    (lambda s: s.replace('seeds = [0, 1, 2]', 'seeds = [0]\npolicy = "lottery"'), "policy"),
    (lambda s: s + '\nvictim = "c"\n', "victim"),
    (lambda s: s.replace("[[tenants]]", "[[tenant]]"), "tenant"),
    (lambda s: s + "\n[engine]\nmax_batch = 0\n", "engine"),
    (lambda s: s + "\n[engine]\nmax_bach = 8\n", "engine.max_bach"),
    (lambda s: s.replace("ttft_slo_ms = 100", "ttft_slo_ms = 100\ncolour = 1"), "tenants[0].colour"),
])
def test_bad_files_name_the_field(tmp_path, edit, field):
    p = write(tmp_path, edit(GOOD))
    with pytest.raises(ValueError) as e:
        load(p)
    msg = str(e.value)
    assert str(p) in msg and field in msg, msg


def test_bad_toml_and_unknown_names(tmp_path):
    with pytest.raises(ValueError, match="not valid TOML"):
        load(write(tmp_path, "name = \n"))
    with pytest.raises(ValueError, match="unknown scenario 'nope'"):
        load("nope")
    with pytest.raises(ValueError, match="rho must be"):
        load("fair_share", rho=0)


def test_baseline_files_are_checked(tmp_path):
    write(tmp_path, GOOD, "base.toml")
    ok = 'name = "alone"\ndescription = "a alone"\nbaseline_of = "base"\nkeep_tenants = ["a"]\n'
    spec = load(write(tmp_path, ok, "alone.toml"))
    assert spec.tenant_names == ("a",) and spec.baseline_of == "t" and spec.victim == "a"
    assert spec.scenario.rates_rps()[0] == load(tmp_path / "base.toml").scenario.rates_rps()[0]
    with pytest.raises(ValueError, match="keep_tenants"):
        load(write(tmp_path, ok.replace('["a"]', '["zz"]'), "bad1.toml"))
    with pytest.raises(ValueError, match="rho"):
        load(write(tmp_path, ok + "rho = 2\n", "bad2.toml"))
    with pytest.raises(ValueError, match="keep_tenants"):
        load(write(tmp_path, GOOD + '\nkeep_tenants = ["a"]\n', "bad3.toml"))


def test_list_parameters_as_papermill_passes_them():
    from fairlib.chapters.tenantbench import as_list, load_scenarios, scenario_overview
    assert as_list("[0, 1, 2]") == [0, 1, 2] and as_list("0,1") == [0, 1] and as_list(None) is None
    assert as_list('["fair_share", "overload"]') == ["fair_share", "overload"] and as_list("overload") == ["overload"]
    assert as_list((3,)) == [3] and as_list(7) == [7]
    with pytest.raises(ValueError, match="seeds"):
        as_list("[0, 1", "seeds")
    specs = load_scenarios(["fair_share", "victim_baseline"], duration_s=5)
    table = scenario_overview(specs)
    assert list(table.index) == [("fair_share", n) for n in "abcd"] + [("victim_baseline", "interactive")]
    assert table["offered load (rho share)"].sum() == pytest.approx(0.9 + 0.3)
