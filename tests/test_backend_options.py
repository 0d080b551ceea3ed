"""run_scenario's typed options: each field checked once, when the options are made; the backend
is the options' kind; both backends give the same records for the same requests."""
import pytest

from fairlib import scenarios
from fairlib.backend import BACKENDS, HttpOptions, SimOptions, options_for, run_scenario
from fairlib.kinds import FIT_KINDS, REAL_ENGINES, STARTABLE, EngineKind


@pytest.mark.parametrize("kw, match", [
    (dict(policy="nope"), r"SimOptions\.policy must be one of \[.*'fcfs'.*\]"),
    (dict(api="embeddings"), r"SimOptions\.api must be one of \('completions', 'chat'\)"),
    (dict(policy_params=[1]), r"SimOptions\.policy_params must be a mapping"),
])
def test_sim_options_name_the_field_and_the_allowed_values(kw, match):
    with pytest.raises(ValueError, match=match):
        SimOptions(**kw)


@pytest.mark.parametrize("kw, match", [
    (dict(run_dir="r"), r"HttpOptions needs endpoint"),
    (dict(run_dir=None, endpoint="http://x/v1"), r"HttpOptions\.run_dir is required"),
    (dict(run_dir="r", endpoint="http://x/v1", workers=0), r"HttpOptions\.workers must be an integer >= 1, got 0"),
    (dict(run_dir="r", endpoint="http://x/v1", timeout_s=-1), r"HttpOptions\.timeout_s must be a number > 0"),
    (dict(run_dir="r", endpoint="http://x/v1", lag_threshold_ms=float("nan")), r"lag_threshold_ms must be"),
    (dict(run_dir="r", endpoint="http://x/v1", max_error_rate=1.5), r"max_error_rate must be between 0 and 1"),
    (dict(run_dir="r", endpoint="http://x/v1", api="x"), r"HttpOptions\.api must be one of"),
])
def test_http_options_name_the_field_and_the_allowed_values(kw, match):
    with pytest.raises(ValueError, match=match):
        HttpOptions(**kw)


def test_options_for_a_backend_and_an_unknown_field():
    assert isinstance(options_for("sim", policy="vtc"), SimOptions)
    assert isinstance(options_for("http", endpoint="http://x/v1", run_dir="r"), HttpOptions)
    with pytest.raises(ValueError, match=r"backend must be one of \('sim', 'http'\), got 'gpu'"):
        options_for("gpu")
    with pytest.raises(TypeError, match="endpoint"):
        options_for("sim", endpoint="http://x/v1")
    with pytest.raises(ValueError, match="options must be SimOptions or HttpOptions, got dict"):
        run_scenario(scenarios.load("fair_share", duration_s=2), 0, {"policy": "vtc"})


def test_the_default_is_the_scenarios_own_policy_and_another_gets_only_its_params(tmp_path):
    spec = scenarios.load("noisy_neighbor", duration_s=5)
    own = run_scenario(spec, 0)
    same = run_scenario(spec, 0, SimOptions(run_dir=tmp_path / "r", config_extra={"label": "x"}))
    assert own.config["extra"]["policy"] == spec.policy == same.config["extra"]["policy"]
    assert own.records.equals(same.records)
    assert own.config["extra"]["label"] == f"sim:{spec.policy}" and same.config["extra"]["label"] == "x"
    assert (tmp_path / "r" / "records.jsonl").exists() and same.path == str(tmp_path / "r")
    other = run_scenario(spec, 0, SimOptions(policy="fcfs"))
    assert other.config["extra"]["policy"] == "fcfs" and len(other.records) == len(own.records)


def test_the_kinds_are_one_enum_and_each_subset_its_values():
    assert BACKENDS == ("sim", "http")
    assert set(REAL_ENGINES) < set(FIT_KINDS) and set(REAL_ENGINES) < set(STARTABLE)
    assert set(FIT_KINDS) | set(STARTABLE) == {k.value for k in EngineKind}
    assert EngineKind("vllm") is EngineKind.VLLM and EngineKind.VLLM == "vllm"
