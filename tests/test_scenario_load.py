"""Scenario load knobs and tenant weights: ``rho`` against ``offered_load``, ``--rate-scale`` on a
baseline, the tenants' ``weight`` reaching the weighted policies, and seed 000's one source."""
import numpy as np
import pytest

from fairlib import scenarios
from fairlib.chapters import presets
from fairlib.cli import load_spec, main
from fairlib.records import load_run, simulate_run
from fairlib.scenarios import load
from fairlib.sim.engine import SEED000_ENGINE

# --- rho (the knob) and offered_load (what the tenants offer) ----------------------------------

def test_rho_is_the_knob_and_offered_load_what_the_tenants_offer():
    nn, vb = load("noisy_neighbor"), load("victim_baseline")
    # victim_baseline's rates come from noisy_neighbor at rho 0.9; its one tenant offers a third of it
    assert nn.rho == 0.9 and vb.rho == 0.9
    assert nn.offered_load == 0.9 and vb.offered_load == pytest.approx(0.3, rel=1e-12)
    assert vb.shares == {"interactive": nn.shares["interactive"]} and nn.shares["interactive"] == pytest.approx(1 / 3)
    # rate_i = rho * share_i * capacity_i in every scenario, the baseline included
    for spec in (nn, vb):
        for t, r in zip(spec.tenant_names, spec.scenario.rates_rps()):
            assert r == pytest.approx(spec.rho * spec.shares[t] * spec.capacity_rps[t], rel=1e-12)
    # load(name, rho=r).rho == r for a baseline too (r is its base's rho)
    assert load("victim_baseline", rho=0.45).rho == 0.45
    d = vb.to_dict()
    assert d["rho"] == 0.9 and d["offered_load"] == pytest.approx(0.3)
    assert d["tenants"][0]["share"] == pytest.approx(1 / 3)


def test_a_baseline_file_with_rho_is_told_where_rho_lives(tmp_path):
    p = tmp_path / "alone.toml"
    p.write_text('name = "alone"\ndescription = "x"\nbaseline_of = "noisy_neighbor"\n'
                 'keep_tenants = ["interactive"]\nrho = 0.3\n')
    with pytest.raises(ValueError, match=r"rho .*baseline_of.*noisy_neighbor"):
        load(p)


# --- --rate-scale multiplies every tenant's rate, in every scenario -----------------------------

@pytest.mark.parametrize("k", [None, 1, 2])
def test_rate_scale_moves_the_victim_equally_in_both_scenarios(k):
    nn = load_spec("noisy_neighbor", rate_scale=k, duration_s=600.0)
    vb = load_spec("victim_baseline", rate_scale=k, duration_s=600.0)
    base = load("noisy_neighbor").scenario.rates_rps()[0]          # 4.0236 req/s
    scale = 1 if k is None else k
    # the spec's own rate: the victim's rate is k times its unscaled rate in both (was 2.68 vs 8.05 at k=2)
    assert nn.scenario.rates_rps()[0] == pytest.approx(scale * base, rel=1e-12)
    assert vb.scenario.rates_rps()[0] == nn.scenario.rates_rps()[0]
    # 0.9 * 1/3 * 1000 / (0.06 * 256 + 64 * (9 + 0.55 * 24) / 24) = 0.3 * 1000 / 74.56 = 4.0236 req/s
    assert vb.scenario.rates_rps()[0] == pytest.approx(4.0236 * scale, rel=1e-4)
    # every tenant scales: the batch tenant too
    batch = load("noisy_neighbor").scenario.rates_rps()[1]
    assert nn.scenario.rates_rps()[1] == pytest.approx(scale * batch, rel=1e-12)
    # the requests sent: count / duration, the same requests in both (the victim is tenant 0 in both)
    a, b = nn.requests(0), vb.requests(0)
    mine = a[a["tenant"] == 0]
    assert len(mine) == len(b)
    np.testing.assert_array_equal(mine["arrival_ms"].to_numpy(), b["arrival_ms"].to_numpy())
    assert len(b) / 600.0 == pytest.approx(scale * base, rel=0.05)


def test_rate_scale_on_the_command_line(tmp_path):
    for name in ("noisy_neighbor", "victim_baseline"):
        out = tmp_path / name
        assert main(["simulate", "--scenario", name, "--duration-s", "60", "--rate-scale", "2",
                     "--out", str(out)]) == 0
        run = load_run(out)
        t = run.config["extra"]["scenario"]["tenants"][0]
        assert t["name"] == "interactive" and t["rate_rps"] == pytest.approx(8.0472, rel=1e-4)
        n = int((run.records["tenant_name"] == "interactive").sum())
        assert n / 60.0 == pytest.approx(8.05, rel=0.12)
    with pytest.raises(SystemExit, match="rate.scale"):
        main(["simulate", "--scenario", "victim_baseline", "--rate-scale", "0", "--out", str(tmp_path / "x")])


# --- tenant weights reach the weighted policies --------------------------------------------------

WEIGHTED = """
name = "w13"
description = "two always-backlogged tenants with weights 1 and 3"
duration_s = 40.0
rho = 3.0
policy = "{policy}"
{params}

[[tenants]]
name = "light"
share = 0.5
prompt = 100
output = 50
ttft_slo_ms = 1000
tpot_slo_ms = 100
weight = 1
klass = 0

[[tenants]]
name = "heavy"
share = 0.5
prompt = 100
output = 50
ttft_slo_ms = 1000
tpot_slo_ms = 100
weight = 3
klass = 1
"""


def shares_of_service(spec, policy=None, **params):
    """Each tenant's share of the output tokens generated in the load window (both stay backlogged)."""
    run = simulate_run(spec, 0, policy, horizon_ms=1000.0 * spec.duration_s, **params)
    rec = run.records
    tok = rec.groupby("tenant_name")["n_token_chunks"].sum()
    return (tok / tok.sum()).to_dict(), run.config["policy"]["params"]


@pytest.mark.parametrize("policy", ["vtc", "weighted"])
def test_tenant_weights_1_and_3_give_shares_25_75(tmp_path, policy):
    p = tmp_path / "w13.toml"
    p.write_text(WEIGHTED.format(policy=policy, params=""))
    spec = load(p)
    # 3x overload, equal shares: each tenant offers 1.5x the machine alone, so both stay backlogged.
    # vtc: counters c_i += tokens / w_i stay level, so tokens_heavy = 3 tokens_light -> 25/75.
    # weighted: the rotation 0,1,1,1 admits 1 light request per 3 heavy ones, all alike -> 25/75.
    sh, params = shares_of_service(spec)
    assert sh["light"] == pytest.approx(0.25, abs=0.02) and sh["heavy"] == pytest.approx(0.75, abs=0.02)
    assert params == ({"wp": 1.0, "wq": 2.0, "weights": [1.0, 3.0]} if policy == "vtc" else {"w": [1, 3]})
    # an explicit parameter wins over the file's weights: equal weights, equal shares
    explicit = {"weights": [1.0, 1.0]} if policy == "vtc" else {"w": [1, 1]}
    sh, params = shares_of_service(spec, policy, **explicit)
    assert sh["light"] == pytest.approx(0.5, abs=0.02)
    assert {k: params[k] for k in explicit} == explicit
    # ... and so do the file's own policy_params
    p.write_text(WEIGHTED.format(policy=policy, params="policy_params = { %s = [1, 1] }" % list(explicit)[0]))
    sh, _ = shares_of_service(load(p))
    assert sh["light"] == pytest.approx(0.5, abs=0.02)


def test_tenant_weights_follow_the_scenario_into_another_policy(tmp_path):
    p = tmp_path / "w13.toml"
    p.write_text(WEIGHTED.format(policy="fcfs", params=""))
    spec = load(p)
    sh, params = shares_of_service(spec, "residency")
    assert params == {"wp": 0.0, "wq": 0.0, "weights": [1.0, 3.0]}
    assert sh["heavy"] == pytest.approx(0.75, abs=0.02)
    sh, params = shares_of_service(spec)                      # fcfs takes no weights: 50/50
    assert params == {} and sh["light"] == pytest.approx(0.5, abs=0.03)


def test_weights_that_a_class_policy_cannot_take_are_refused(tmp_path):
    p = tmp_path / "w.toml"
    p.write_text(WEIGHTED.format(policy="weighted", params="").replace("klass = 1", "klass = 0"))
    with pytest.raises(ValueError, match=r"weighted.*class 0.*light.*heavy.*policy_params"):
        shares_of_service(load(p))
    p.write_text(WEIGHTED.format(policy="weighted", params="").replace("weight = 3", "weight = 2.5"))
    with pytest.raises(ValueError, match=r"weighted.*integer.*heavy.*2.5"):
        shares_of_service(load(p))


def test_equal_weights_fill_in_nothing():
    spec = load("fair_share")
    assert spec.scenario.policy_params("vtc", {}) == {}
    assert spec.scenario.policy_params("weighted", {}) == {}


# --- seed 000: the TOML is the one source --------------------------------------------------------

def test_seed000_preset_is_built_from_the_toml():
    spec = load("seed000")
    assert presets.SEED000_TENANTS == spec.tenant_names
    means = tuple(t.output.mean for t in spec.scenario.tenants)
    assert presets.SEED000_OUTPUT_MEANS == means == (23.7, 48.0, 177.0, 353.8)
    assert presets.SEED000_PROMPT_TOKENS == 387 and presets.SEED000_MACHINE_MS_PER_S == 750.0
    assert spec.engine == SEED000_ENGINE and presets.seed000().engine == spec.engine
    assert presets.seed000().duration_s == spec.duration_s == 120.0
    # 750 ms/s = 1000 * rho * share exactly; the preset's rates: 750 / cost of the mean request at B=24
    assert all(1000.0 * spec.rho * spec.shares[n] == 750.0 for n in spec.tenant_names)
    sc = presets.seed000()
    assert sc.rates_rps()[0] == pytest.approx(750.0 / (0.06 * 387 + 23.7 * (9 + 0.55 * 24) / 24), rel=1e-15)
    np.testing.assert_allclose(sc.rates_rps(), spec.scenario.rates_rps(), rtol=1e-15)


def test_seed000_preset_reads_the_file(tmp_path):
    text = (scenarios.SCENARIO_DIR / "seed000.toml").read_text()
    p = tmp_path / "seed000.toml"
    p.write_text(text.replace("mean = 48.0", "mean = 50.0").replace("rho = 3.0", "rho = 2.0"))
    base = presets.read_seed000(p)
    assert base.output_means == (23.7, 50.0, 177.0, 353.8) and base.machine_ms_per_s == 500.0
    assert base.tenants == ("classify", "chat", "summarise", "agent") and base.prompt_tokens == 387
    p.write_text(text.replace('output = { dist = "geometric", mean = 48.0 }',
                              'output = { dist = "lognormal", mean = 48.0, sigma = 1.0 }'))
    with pytest.raises(ValueError, match=r"seed000.*chat.*geometric"):
        presets.read_seed000(p)
    p.write_text(text.replace("share = 0.25\nprompt = 387\noutput = { dist = \"geometric\", mean = 48.0 }",
                              "share = 0.5\nprompt = 387\noutput = { dist = \"geometric\", mean = 48.0 }"))
    with pytest.raises(ValueError, match=r"seed000.*equal shares"):
        presets.read_seed000(p)
