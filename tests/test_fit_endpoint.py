"""``fairlib fit --endpoint``: the cost model of an endpoint started elsewhere, and the check the
chapters make before they use a fit with ``backend="http"`` (``fairlib.calibrate.fit.fit_for_endpoint``).

Against ``fairlib serve`` (a test double whose timing is a known engine model,
``dt = 6 + 1.0 B + 0.04 P`` ms, max_batch 8): the quick fit (two contexts, four batch sizes, three
repeats; about 10 s) must find iter_base and the slope within 10 %, no context term to speak of
(the served model has none), the prefill cost within 15 % and the batch limit the server states;
it writes the format of ``fairlib.calibrate.fit.fit_engine`` (the committed ``data/engines/*.json``) with
the endpoint's identity. The check accepts that fit against its own endpoint and refuses fits
made for another model, engine kind, server version, machine or endpoint, naming both sides and
the command that fits the endpoint. Command-line errors are one line, and Ctrl-C / SIGTERM stop a
fit with one line and no file.
"""
import json
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fairlib import Engine, scenarios
from fairlib.calibrate import fit, identity
from fairlib.calibrate.probe import load_probed_engine
from fairlib.cli import main
from fairlib.serve import ServerProcess

pytestmark = [pytest.mark.slow]   # a real-time server, fits and interrupted fits

ROOT = Path(__file__).resolve().parents[1]
TRUE = {"iter_base_ms": 6.0, "iter_slope_ms": 1.0, "prefill_ms_per_token": 0.04, "max_batch": 8}
SERVE = ["--iter-base-ms", 6, "--iter-slope-ms", 1.0, "--prefill-ms-per-token", 0.04, "--max-batch", 8]
QUICK = ["--batches", "1,2,4,8", "--prompt-tokens", "16,256", "--decode-tokens", "32",
         "--prefill-lengths", "16,512,1024", "--repeats", "3", "--prefill-repeats", "3", "--quiet"]


@pytest.fixture(scope="module")
def server():
    with ServerProcess(SERVE) as srv:
        yield srv


@pytest.fixture(scope="module")
def fitted(server, tmp_path_factory):
    out = tmp_path_factory.mktemp("fit") / "serve.json"
    assert main(["fit", "--endpoint", server.base_url, "--out", str(out), *QUICK]) == 0
    return json.loads(out.read_text()), out


def _variant(d: dict, path: Path, **engine_info) -> Path:
    v = json.loads(json.dumps(d))
    v["engine_info"].update(engine_info)
    path.write_text(json.dumps(v))
    return path


def _cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "fairlib.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def _one_line_error(r):
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


# --- the fit ------------------------------------------------------------------------------------

def test_fit_recovers_the_served_cost_model(fitted):
    d, _ = fitted
    s = d["fit"]["summary"]
    assert s["iter_base_ms"] == pytest.approx(TRUE["iter_base_ms"], rel=0.10)
    assert s["slope_0_ms"] == pytest.approx(TRUE["iter_slope_ms"], rel=0.10)
    for ctx in (16, 352, 1000):       # the served model has no context term
        assert fit.engine_at(d, ctx).iter_slope_ms == pytest.approx(TRUE["iter_slope_ms"], rel=0.10)
    assert s["prefill_ms_per_token"] == pytest.approx(TRUE["prefill_ms_per_token"], rel=0.15)
    assert s["max_batch"] == TRUE["max_batch"] and s["decode_r2"] > 0.97
    assert s["decode_B_range"] == [1, 8] and not s["small_batch_regime"]


def test_fit_writes_the_fit_format_with_the_endpoints_identity(fitted, server):
    d, out = fitted
    committed = fit.load_fit(fit.fit_data_path("vllm"))
    assert set(committed) <= set(d)                                  # the same top-level fields
    assert set(committed["fit"]["summary"]) <= set(d["fit"]["summary"])
    assert d["fit_version"] == fit.FIT_VERSION and d["engine_kind"] == "fairlib"
    i = d["engine_info"]
    assert i["base_url"] == server.base_url and i["model"] == "fairlib-sim" and i["models"] == ["fairlib-sim"]
    assert i["kind"] == "fairlib" and i["version"].startswith("fairlib-serve")
    assert i["max_num_seqs"] == 8 and "fairlib/stats" in i["max_num_seqs_source"]
    assert i["max_model_len"] == 8192 and i["host"] == "127.0.0.1" and i["local"] is True
    assert "test double" in i["engine"] and i["fitted_with"].startswith("fairlib fit --endpoint")
    assert d["machine"] == fit.machine_info() and re.fullmatch(r"\d{4}-\d\d-\d\d", d["date"])
    assert d["params"]["batches"] == [1, 2, 4, 8] and d["params"]["prompt_tokens"] == [16, 256]
    # words are tokens on fairlib serve: the contexts the server counted are the planned ones
    assert {q["context"] for q in d["points"]["decode"]} == {16 + 16.0, 256 + 16.0}
    # every reader of a fit reads it
    eng = fit.load_fitted_engine(out)
    assert isinstance(eng, Engine) and eng.max_batch == 8
    assert eng == load_probed_engine(out) == fit.load_fitted_engine(d)
    assert eng.iter_slope_ms == pytest.approx(fit.engine_at(out, fit.REFERENCE_CONTEXT).iter_slope_ms)
    spec = scenarios.load("fair_share", capacity=str(out))
    assert spec.engine.max_batch == 8


def test_batches_reach_a_larger_batch_limit():
    assert fit.batches_for(16) == list(fit.DEFAULTS["vllm"].batches)
    assert fit.batches_for(24) == [1, 2, 4, 6, 8, 12, 18, 24]
    assert max(fit.batches_for(256)) == 256 and fit.batches_for(1) == [1]


# --- the check ----------------------------------------------------------------------------------

def test_check_accepts_the_matching_fit(fitted, server):
    d, out = fitted
    assert fit.fit_for_endpoint(str(out), server.base_url) == d
    assert fit.fit_for_endpoint(out, server.base_url, engine_kind="fairlib", model="fairlib-sim") == d
    # a bare server URL is the same endpoint
    assert fit.fit_for_endpoint(out, server.base_url[:-3]) == d


def test_check_refuses_a_fit_for_another_model(fitted, server, tmp_path):
    d, _ = fitted
    other = _variant(d, tmp_path / "other-model.json", model="llama-3-8b", model_root="llama-3-8b")
    with pytest.raises(ValueError) as e:
        fit.fit_for_endpoint(other, server.base_url)
    msg = str(e.value)
    assert str(other) in msg and server.base_url in msg
    assert "'llama-3-8b'" in msg and "'fairlib-sim'" in msg and "model:" in msg
    assert f"fairlib fit --endpoint {server.base_url}" in msg and "fit_file" in msg
    # the same name, another checkpoint
    same_name = _variant(d, tmp_path / "root.json", model_root="/models/another-checkpoint")
    with pytest.raises(ValueError, match="another-checkpoint"):
        fit.fit_for_endpoint(same_name, server.base_url)
    # a model the endpoint does not serve
    with pytest.raises(ValueError, match="does not serve 'nope'"):
        fit.fit_for_endpoint(fitted[1], server.base_url, model="nope")


def test_check_refuses_a_fit_for_another_engine_kind(fitted, server):
    committed = fit.fit_data_path("vllm")           # the 2-core CPU machine's vLLM with the tiny model
    with pytest.raises(ValueError) as e:
        fit.fit_for_endpoint(committed, server.base_url)
    msg = str(e.value)
    assert str(committed) in msg and server.base_url in msg
    assert "the fit is for 'vllm', the endpoint is 'fairlib'" in msg
    assert "'tiny-llama'" in msg and "0.32.0" in msg and "fairlib-serve" in msg
    assert "fairlib fit --endpoint" in msg
    # the chapter's own engine_kind disagrees with the fit
    with pytest.raises(ValueError, match="engine_kind is 'vllm'"):
        fit.fit_for_endpoint(fitted[1], server.base_url, engine_kind="vllm")
    # fit_file None: the committed default of that kind, refused the same way
    with pytest.raises(ValueError) as e:
        fit.fit_for_endpoint(None, server.base_url, engine_kind="llamacpp")
    assert str(fit.fit_data_path("llamacpp")) in str(e.value) and "b1-0c1e570" in str(e.value)


def test_check_refuses_another_server_version(fitted, server, tmp_path):
    old = _variant(fitted[0], tmp_path / "old.json", version="fairlib-serve 0.0.1")
    with pytest.raises(ValueError, match=r"server version: the fit is for 'fairlib-serve 0\.0\.1'"):
        fit.fit_for_endpoint(old, server.base_url)


def test_default_fit_must_be_of_this_endpoint_and_machine(fitted, server, tmp_path, monkeypatch):
    """fit_file None: the default file is used only for the engine it was made on: a loopback
    engine on the machine the fit was made on, or the same remote endpoint."""
    d, out = fitted
    default = tmp_path / "default.json"
    monkeypatch.setattr(identity, "fit_data_path", lambda kind: default)   # where fit_for_endpoint reads it
    default.write_text(out.read_text())
    assert fit.fit_for_endpoint(None, server.base_url)["date"] == d["date"]       # this machine, loopback
    v = json.loads(out.read_text())
    v["machine"] = {**v["machine"], "cpu_model": "Some GPU host CPU", "cores": 64}
    default.write_text(json.dumps(v))
    with pytest.raises(ValueError) as e:
        fit.fit_for_endpoint(None, server.base_url)
    assert "machine:" in str(e.value) and "Some GPU host CPU" in str(e.value) and str(default) in str(e.value)
    # an explicit fit_file is trusted for the machine (a fresh fit passes against its own endpoint)
    assert fit.fit_for_endpoint(default, server.base_url)["machine"]["cores"] == 64
    # a fit of a remote endpoint describes only that endpoint
    _variant(d, default, base_url="http://gpu-host:8000/v1", server_root="http://gpu-host:8000", host="gpu-host")
    with pytest.raises(ValueError, match="made for http://gpu-host:8000/v1"):
        fit.fit_for_endpoint(None, server.base_url)


def test_check_refuses_what_is_not_a_fit(server, tmp_path):
    probe_like = tmp_path / "probe.json"
    probe_like.write_text(json.dumps({"probe_version": 1, "engine": {"iter_base_ms": 1.0}}))
    with pytest.raises(ValueError, match="not a fit"):
        fit.fit_for_endpoint(probe_like, server.base_url)
    with pytest.raises(ValueError, match="cannot read the fit file"):
        fit.fit_for_endpoint(tmp_path / "missing.json", server.base_url)
    with pytest.raises(ValueError, match="does not answer"):
        fit.fit_for_endpoint(probe_like, "http://127.0.0.1:1/v1")
    with pytest.raises(ValueError, match="not an endpoint URL"):
        fit.fit_for_endpoint(probe_like, "127.0.0.1:8000")


# --- the command line ---------------------------------------------------------------------------

def test_cli_errors_are_one_line(server, tmp_path):
    out = tmp_path / "x.json"
    for url, says in (("not a url", "not an endpoint URL"), ("http://127.0.0.1:1/v1", "does not answer")):
        line = _one_line_error(_cli("fit", "--endpoint", url, "--out", out))     # the real process: stderr
        assert line.startswith("fairlib fit: ") and says in line, line
    for args, says in ((["--endpoint", "ftp://host/v1"], "not an endpoint URL"),
                       (["--endpoint", server.base_url, "--model", "nope"], "not 'nope'"),
                       (["--endpoint", server.base_url, "--kind", "vllm"], "says it is fairlib"),
                       (["--endpoint", server.base_url, "--max-batch", "20"], "at most 8"),
                       (["--endpoint", server.base_url, "--batches", "1,x"], "comma-separated integers")):
        with pytest.raises(SystemExit) as e:
            main(["fit", *args, "--out", str(out)])
        assert len(str(e.value).splitlines()) == 1 and says in str(e.value), e.value
    assert not out.exists()


def _lines(p):
    """The child's stdout lines through a queue (a reader thread), so a wait can time out."""
    q = queue.Queue()
    threading.Thread(target=lambda: [q.put(line) for line in p.stdout], daemon=True).start()
    return q


def _readline(q, p, timeout_s: float = 120.0) -> str:
    """The next line; a child that prints nothing for ``timeout_s`` is a hang (killed, the test
    fails), not a slow machine."""
    try:
        return q.get(timeout=timeout_s)
    except queue.Empty:
        p.kill()
        pytest.fail(f"no output from the child for {timeout_s:g} s")


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_cli_stops_cleanly_on_a_signal(server, tmp_path, sig, code):
    out = tmp_path / "x.json"
    p = subprocess.Popen([sys.executable, "-m", "fairlib.cli", "fit", "--endpoint", server.base_url, "--out",
                          str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        q = _lines(p)
        first = _readline(q, p)              # the identity line: the sweep is starting
        assert first.startswith("fairlib fit: "), first
        _readline(q, p)                      # the first timed batch: requests in flight
        p.send_signal(sig)
        err = p.stderr.read() if p.wait(timeout=60) is not None else ""
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == code
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and f"interrupted by {sig.name}" in lines[0], err
    assert not out.exists()


def test_sigterm_stops_a_fit_started_with_sigint_ignored(server, tmp_path):
    """A background job (``cmd &`` in a shell without job control) starts with SIGINT ignored;
    SIGTERM went SIGINT's way and was ignored with it: the fit ran on and exited 0."""
    out = tmp_path / "x.json"
    p = subprocess.Popen([sys.executable, "-m", "fairlib.cli", "fit", "--endpoint", server.base_url, "--out",
                          str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        q = _lines(p)
        assert _readline(q, p).startswith("fairlib fit: ")
        _readline(q, p)
        p.send_signal(signal.SIGTERM)
        err = p.stderr.read() if p.wait(timeout=60) is not None else ""
    finally:
        if p.poll() is None:
            p.kill()
    lines = err.strip().splitlines()
    assert p.returncode == 143 and not out.exists()
    assert len(lines) == 1 and "Traceback" not in err and "interrupted by SIGTERM" in lines[0], err


def test_fit_of_a_guarded_endpoint_sends_the_key_and_never_writes_it(tmp_path, capfd):
    """``fairlib serve --api-key`` guards /v1 as vLLM's does: the fit with ``--api-key`` measures it
    (the key on every request, none in the file or the output); without it, one line naming 401."""
    key = "sk-fit-KEY-93b0c1d4"
    out = tmp_path / "guarded.json"
    quick = ["--batches", "1,2,4,8", "--prompt-tokens", "16,256", "--decode-tokens", "16",
             "--prefill-lengths", "16,256,512", "--repeats", "1", "--prefill-repeats", "1", "--quiet"]
    with ServerProcess([*SERVE, "--api-key", key]) as srv:
        with pytest.raises(SystemExit) as e:
            main(["fit", "--endpoint", srv.base_url, "--out", str(out), *quick])
        assert "401" in str(e.value) and len(str(e.value).splitlines()) == 1 and not out.exists()
        assert main(["fit", "--endpoint", srv.base_url, "--api-key", key, "--out", str(out), *quick]) == 0
    d = json.loads(out.read_text())
    assert d["engine_info"]["model"] == "fairlib-sim" and d["fit"]["summary"]["max_batch"] == 8
    assert key.encode() not in out.read_bytes() and key not in "".join(capfd.readouterr())


# --- chapter 7 on http: its loads relative to the endpoint's engine, checked -----------------------

def test_chapter7_specs_use_the_checked_fit_or_the_served_engine(fitted, server):
    from fairlib.chapters import tenantbench as tb
    from fairlib.sim.engine import Engine
    d, out = fitted
    specs, info = tb.endpoint_specs(["fair_share"], server.base_url, duration_s=5, fit_file=out)
    assert info["file"] == str(out) and info["date"] == d["date"]
    assert specs[0].scenario.engine.max_batch == TRUE["max_batch"]
    # no fit_file: fairlib serve reports the engine model it runs, which sets the load
    specs, info = tb.endpoint_specs(["fair_share"], server.base_url, duration_s=5)
    assert info["file"] is None and specs[0].scenario.engine == Engine(**info["engine"])
    assert specs[0].scenario.engine.iter_base_ms == TRUE["iter_base_ms"]


def test_chapter7_refuses_a_fit_or_capacity_made_elsewhere(server):
    from fairlib.chapters import tenantbench as tb
    with pytest.raises(ValueError, match="the fit is for 'vllm', the endpoint is 'fairlib'"):
        tb.endpoint_specs(["fair_share"], server.base_url, fit_file=fit.fit_data_path("vllm"))
    with pytest.raises(ValueError, match="engine_kind is 'vllm'|the endpoint is 'fairlib'"):
        tb.endpoint_specs(["fair_share"], server.base_url, engine_kind="vllm")
    with pytest.raises(ValueError, match="`capacity`.*is for backend='sim'.*fit_file"):
        tb.endpoint_specs(["fair_share"], server.base_url, capacity=3.0)
