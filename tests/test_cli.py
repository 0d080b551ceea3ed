"""The ``fairlib`` command line: serve's options, probe -> run (load relative to the probed engine)
-> analyze over HTTP against ``fairlib serve``, and simulate writing the same run-directory shape."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fairlib.cli import build_parser, main
from fairlib.client import load_records, load_summary
from fairlib.calibrate.probe import load_probed_engine
from fairlib.records import load_run
from fairlib.serve import ServerProcess, config_from_args

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--iter-base-ms", 2, "--iter-slope-ms", 0.2, "--prefill-ms-per-token", 0.01, "--max-batch", 8]


@pytest.fixture(scope="module")
def server():
    with ServerProcess(FAST) as srv:
        yield srv


@pytest.fixture(scope="module")
def probe_file(server, tmp_path_factory):
    p = tmp_path_factory.mktemp("cli") / "probe.json"
    rc = main(["probe", "--endpoint", server.base_url, "--batches", "1,2,4", "--decode-tokens", "24",
               "--prefill-lengths", "16,512,1024", "--prefill-repeats", "2", "--out", str(p), "--quiet"])
    assert rc == 0
    return p


def test_help_lists_the_subcommands(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("serve", "run", "simulate", "probe", "fit", "analyze"):
        assert cmd in out


def test_serve_options_make_a_config(tmp_path):
    toml = tmp_path / "engine.toml"
    toml.write_text("iter_base_ms = 3.0\nmax_batch = 4\n")
    a = build_parser().parse_args(["serve", "--engine-params", str(toml), "--iter-slope-ms", "0.25", "--policy",
                                   "vtc", "--policy-param", "wq=2", "--policy-param", "weights=[1, 2]",
                                   "--tenants", "2", "--tenant-names", "x,y", "--max-waiting", "5", "--port", "0"])
    cfg = config_from_args(a)
    assert (cfg.engine.iter_base_ms, cfg.engine.iter_slope_ms, cfg.engine.max_batch) == (3.0, 0.25, 4)
    assert cfg.policy == "vtc" and cfg.policy_params == {"wq": 2, "weights": [1, 2]}
    assert cfg.tenant_names == ("x", "y") and cfg.max_waiting == 5 and cfg.n_tenants == 2
    a = build_parser().parse_args(["serve", "--engine-params", '{"iter_base_ms": 1, "prefill_ms_per_token": 0}'])
    assert config_from_args(a).engine.prefill_ms_per_token == 0.0


def test_serve_refuses_bad_options():
    r = subprocess.run([sys.executable, "-m", "fairlib.cli", "serve", "--port", "0", "--policy", "nope"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode != 0 and "nope" in r.stderr
    r = subprocess.run([sys.executable, "-m", "fairlib.cli", "serve", "--port", "0", "--host", "0.0.0.0"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode != 0 and "loopback" in r.stderr


def test_probe_cli_writes_a_loadable_engine(probe_file):
    eng = load_probed_engine(probe_file)
    assert eng.iter_base_ms == pytest.approx(2.0, abs=0.5)
    assert eng.iter_slope_ms == pytest.approx(0.2, abs=0.1)
    assert eng.max_batch == 4   # the largest batch tried (a lower bound: the sweep never filled it)
    assert json.loads(probe_file.read_text())["capacity"]["max_batch_is_lower_bound"] is True


def test_run_against_serve_then_analyze(server, probe_file, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["run", "--scenario", "fair_share", "--endpoint", server.base_url, "--duration-s", "2",
               "--capacity-file", str(probe_file), "--rho", "0.5", "--seed", "1", "--out", str(out),
               "--server-policy", "fcfs"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "fair_share seed 1" in printed and str(out) in printed
    recs = load_records(out)
    assert len(recs) > 5 and (recs["error_class"] == "none").all()
    assert (recs["completion_tokens"] == recs["max_tokens"]).all()
    cfg = json.loads((out / "config.json").read_text())
    scen = cfg["extra"]["scenario"]
    assert scen["engine"] == json.loads(probe_file.read_text())["engine"]   # load relative to the probed engine
    assert scen["rho"] == pytest.approx(0.5) and cfg["extra"]["backend"] == "http" and cfg["extra"]["seed"] == 1
    assert load_summary(out)["n_ok"] == len(recs)
    assert (out / "server_metrics.jsonl").exists() and (out / "env.json").exists()
    report = tmp_path / "report.md"
    assert main(["analyze", "--run", str(out), "--out", str(report), "--n-boot", "50"]) == 0
    assert "fair_share" in report.read_text()


def test_simulate_writes_the_same_run_directory_shape(tmp_path):
    out = tmp_path / "sim"
    assert main(["simulate", "--scenario", "victim_baseline", "--duration-s", "4", "--out", str(out)]) == 0
    run = load_run(out)
    assert run.backend == "sim" and len(run.records) > 0
    assert set(load_records(out).columns) >= {"ttft_s", "chunk_times_s", "actual_send_s"}
    with pytest.raises(SystemExit) as e:   # one line naming --overwrite (tests/test_cli_errors.py)
        main(["simulate", "--scenario", "victim_baseline", "--duration-s", "4", "--out", str(out)])
    assert e.value.code == 2 and "--overwrite" in str(e.value)
    assert main(["simulate", "--scenario", "victim_baseline", "--duration-s", "4", "--out", str(out),
                 "--overwrite", "--policy", "vtc", "--rate-scale", "2"]) == 0
    assert load_run(out).config["extra"]["policy"] == "vtc"


def test_probe_refuses_a_bad_url_in_one_line():
    with pytest.raises(SystemExit) as e:
        main(["probe", "--endpoint", "localhost:8000", "--out", "/tmp/x.json"])
    assert str(e.value).startswith("fairlib probe: ") and "not an endpoint URL" in str(e.value)


def test_fit_help_names_its_options(capsys):
    with pytest.raises(SystemExit) as e:
        main(["fit", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for opt in ("--endpoint", "--model", "--kind", "--max-batch", "--out", "vllm,llamacpp,openai"):
        assert opt in out


def test_unknown_scenario_is_a_clean_error():
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--scenario", "no_such_scenario", "--out", "/tmp/x"])
    assert "no_such_scenario" in str(e.value)
