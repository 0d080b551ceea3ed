"""The command line's errors and the secrets it keeps (issue 10, items 7, 8 and 9).

Credentials (--api-key, OPENAI_API_KEY, a header, a password in the URL) reach the server but no
file of the run directory and no line on stdout/stderr; a scenario name cannot lead a run
directory out of runs/; every CLI error is one line on stderr (exit 2 for usage errors, no
traceback); ``fairlib serve`` answers every error as OpenAI error JSON."""
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

import fairlib
from fairlib import scenarios
from fairlib.backend import default_run_dir
from fairlib.cli import main
from fairlib.client import EndpointConfig, build_schedule, run as client_run
from fairlib.client.endpoint import mask_url
from fairlib.serve import ServeConfig, ServerThread
from fairlib.sim.engine import Engine
from fairlib.progress import COMPILE_NOTICE
from fairlib.serve.replay import ReplayServer, Synth

from waiting import LineReader, stack_of

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ["--scenario", "fair_share", "--duration-s", "1", "--rho", "0.3", "--seed", "0"]
RUN = ["run", *SCENARIO, "--lag-threshold-ms", "1000"]   # valid (exit 0) on a busy machine too


def cli(argv, capfd):
    """``fairlib ARGV`` in this process: (exit code, stdout, stderr)."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out, err = capfd.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def run_env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_CACHE_DIR": str(ROOT / ".cache" / "numba")}


def grep_dir(path: Path, secret: str) -> list:
    """Files under ``path`` whose bytes contain ``secret``."""
    return [str(p) for p in path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


# --- item 7: credentials ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def replay():
    with ReplayServer({"ok": Synth(), "ok2": Synth()}) as srv:
        yield srv


def _auth_seen(srv, n_before):
    return [r["headers"].get("Authorization") for r in srv.state["requests"][n_before:]]


def test_api_key_is_sent_and_never_written(replay, tmp_path, capfd):
    secret = "sk-test-KEY-7f3a91c2"
    n0 = len(replay.state["requests"])
    code, out, err = cli([*RUN, "--endpoint", replay.url("ok"), "--api-key", secret,
                          "--out", tmp_path / "r"], capfd)
    assert code == 0, out + err
    seen = _auth_seen(replay, n0)
    assert seen and set(seen) == {f"Bearer {secret}"}
    assert grep_dir(tmp_path, secret) == [] and secret not in out + err
    assert json.loads((tmp_path / "r" / "config.json").read_text())["endpoint"]["api_key"] == "<set>"


def test_openai_api_key_variable_is_sent_and_never_written(replay, tmp_path, capfd, monkeypatch):
    secret = "sk-env-KEY-0b5d44e1"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    n0 = len(replay.state["requests"])
    code, out, err = cli([*RUN, "--endpoint", replay.url("ok"), "--out", tmp_path / "r"], capfd)
    assert code == 0, out + err
    assert set(_auth_seen(replay, n0)) == {f"Bearer {secret}"}
    assert grep_dir(tmp_path, secret) == [] and secret not in out + err


def test_secret_headers_are_sent_and_masked(replay, tmp_path, capfd):
    tok, key = "hdr-TOKEN-55aa1f", "hdr-APIKEY-9c0e77"
    n0 = len(replay.state["requests"])
    code, out, err = cli([*RUN, "--endpoint", replay.url("ok"), "--model", "replay-model",
                          "--header", f"Authorization: Bearer {tok}", "--header", f"x-api-key: {key}",
                          "--header", "X-Org: research", "--out", tmp_path / "r"], capfd)
    assert code == 0, out + err
    reqs = replay.state["requests"][n0:]
    assert reqs and all(r["headers"]["Authorization"] == f"Bearer {tok}" and r["headers"]["x-api-key"] == key
                        for r in reqs)
    for s in (tok, key):
        assert grep_dir(tmp_path, s) == [] and s not in out + err
    headers = json.loads((tmp_path / "r" / "config.json").read_text())["endpoint"]["headers"]
    assert headers == {"Authorization": "***", "x-api-key": "***", "X-Org": "research"}


def test_password_in_the_url_is_sent_as_basic_auth_and_never_written(replay, tmp_path, capfd):
    password = "pw-URL-3e8c2d19"
    url = replay.url("ok").replace("http://", f"http://alice:{password}@")
    n0 = len(replay.state["requests"])
    code, out, err = cli([*RUN, "--endpoint", url, "--out", tmp_path / "r"], capfd)
    assert code == 0, out + err
    basic = "Basic " + base64.b64encode(f"alice:{password}".encode()).decode()
    assert set(_auth_seen(replay, n0)) == {basic}
    for s in (password, basic.split()[1]):
        assert grep_dir(tmp_path, s) == [] and s not in out + err
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())["endpoint"]
    assert cfg["base_url"] == replay.url("ok").replace("http://", "http://***@")


def test_the_api_masks_a_header_given_in_code(replay, tmp_path):
    """fairlib.client.run with EndpointConfig(headers=...): the header is sent, not written."""
    secret = "api-HEADER-TOKEN-1d2c3b"
    df = pd.DataFrame({"arrival_ms": [0.0, 5.0], "tenant": [0, 1], "prompt_tokens": [4, 4], "output_tokens": [3, 3]})
    n0 = len(replay.state["requests"])
    cfg = EndpointConfig(base_url=replay.url("ok2"), model="replay-model",
                         headers={"Proxy-Authorization": f"Basic {secret}", "Cookie": f"session={secret}"})
    summary = client_run(build_schedule(df, seed=0), cfg, tmp_path / "r", scrape_metrics=True,
                         handle_sigint=False)
    assert summary["n_ok"] == 2
    reqs = replay.state["requests"][n0:]
    assert [r["headers"]["Proxy-Authorization"] for r in reqs] == [f"Basic {secret}"] * 2
    assert grep_dir(tmp_path, secret) == []


def test_mask_url_masks_userinfo_and_secret_query_parameters():
    assert mask_url("https://u:p@h:8/v1/metrics?api_key=A&x=1&TOKEN=B&key=C") == \
        "https://***@h:8/v1/metrics?api_key=***&x=1&TOKEN=***&key=***"
    assert mask_url("cannot reach http://bob:pw@host/v1 now") == "cannot reach http://***@host/v1 now"


# --- item 8: path traversal -------------------------------------------------------------------

def _scenario_file(tmp_path, name) -> Path:
    p = tmp_path / "evil.toml"
    p.write_text(f'name = "{name}"\ndescription = "x"\nrho = 0.5\nduration_s = 1.0\n'
                 '[[tenants]]\nname = "a"\nshare = 1\nprompt = 8\noutput = 4\nttft_slo_ms = 500\ntpot_slo_ms = 50\n')
    return p


@pytest.mark.parametrize("name", ["../x", "/abs", "a/b", "..", "a\\\\b"])
def test_a_scenario_name_cannot_leave_runs(name, tmp_path, capfd, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    path = _scenario_file(tmp_path, name)
    with pytest.raises(ValueError, match=r"evil.toml: name must be a plain name"):
        scenarios.load(path)
    code, out, err = cli(["simulate", "--scenario", path], capfd)
    assert code == 2 and "name must be a plain name" in one_line(err)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["evil.toml", "work"]   # nothing written anywhere


def test_default_run_dir_refuses_a_path_that_resolves_outside_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "fair_share").symlink_to(tmp_path / "elsewhere")
    spec = scenarios.load("fair_share")
    with pytest.raises(ValueError, match="outside"):
        default_run_dir(spec, "sim", 0)
    assert default_run_dir(scenarios.load("overload"), "sim", 3) == Path("runs/overload/sim/seed3")


# --- item 9: one-line errors ------------------------------------------------------------------

def test_an_existing_out_names_the_overwrite_option(tmp_path, capfd):
    out = tmp_path / "sim"
    argv = ["simulate", "--scenario", "victim_baseline", "--duration-s", "2", "--out", out]
    assert cli(argv, capfd)[0] == 0
    code, _, err = cli(argv, capfd)
    line = one_line(err)
    assert code == 2 and "--overwrite" in line and "overwrite=True" not in line and str(out) in line


@pytest.mark.parametrize("cmd", ["simulate", "run"])
def test_an_unwritable_out_is_one_line(cmd, tmp_path, capfd):
    (tmp_path / "file").write_text("x")
    extra = ["--endpoint", "http://127.0.0.1:9/v1", "--model", "m"] if cmd == "run" else []
    code, _, err = cli([cmd, *SCENARIO, *extra, "--out", tmp_path / "file" / "sub"], capfd)
    assert code == 2 and "--out" in one_line(err) and "not a directory" in err


@pytest.mark.parametrize("endpoint", ["ftp://127.0.0.1/v1", "127.0.0.1:8000/v1", "http:///v1"])
def test_a_non_http_endpoint_is_a_usage_error(endpoint, capfd):
    code, _, err = cli([*RUN, "--endpoint", endpoint, "--model", "m", "--out", "/tmp/never"], capfd)
    line = one_line(err)
    assert code == 2 and "--endpoint" in line and "http://HOST:PORT/v1" in line


def test_a_bad_endpoint_in_a_real_process_is_one_line_exit_2():
    r = subprocess.run([sys.executable, "-m", "fairlib.cli", "run", "--scenario", "fair_share", "--endpoint",
                        "ftp://u:hunter2pw@x/v1"], capture_output=True, text=True, timeout=120, cwd=ROOT, env=run_env())
    assert r.returncode == 2 and "--endpoint" in one_line(r.stderr) and "hunter2pw" not in r.stderr


@pytest.mark.parametrize("opt,value", [("--lag-threshold-ms", "-1"), ("--lag-threshold-ms", "nan"),
                                       ("--timeout-s", "0"), ("--duration-s", "-5"), ("--rho", "0")])
def test_run_options_out_of_range(opt, value, capfd):
    argv = ["run", "--scenario", "fair_share", "--endpoint", "http://127.0.0.1:9/v1", "--model", "m", opt, value]
    code, _, err = cli(argv, capfd)
    line = one_line(err)
    assert code == 2 and opt in line and "> 0" in line


def test_probe_failures_are_one_line(tmp_path, capfd):
    with socket.socket() as s:                        # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    code, _, err = cli(["probe", "--endpoint", dead, "--out", tmp_path / "p.json", "--quiet"], capfd)
    line = one_line(err)                                                # no model list: the server is down
    assert code == 1 and line.endswith(f"is the server up, and is {dead} its base URL (http://HOST:PORT/v1)?")
    assert "--model" not in line and "Connection refused" in line
    code, _, err = cli(["probe", "--endpoint", dead, "--model", "m", "--batches", "1,2", "--prefill-repeats", "1",
                        "--prefill-lengths", "16", "--out", tmp_path / "p.json", "--quiet"], capfd)
    line = one_line(err)
    assert code == 1 and "failed" in line and "B=1: 0/1 ok" in line and not (tmp_path / "p.json").exists()
    code, _, err = cli(["probe", "--endpoint", dead, "--model", "m", "--out", tmp_path, "--quiet"], capfd)
    assert code == 2 and "--out" in one_line(err)
    code, _, err = cli(["probe", "--endpoint", dead, "--decode-tokens", "4"], capfd)
    assert code == 2 and "--decode-tokens" in one_line(err) and ">= 8" in err


def test_serve_on_a_port_in_use_and_out_of_range():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "fairlib.cli", "serve", "--port", str(port)], capture_output=True,
                           text=True, timeout=120, cwd=ROOT, env=run_env())
    line = one_line(r.stderr)
    assert r.returncode == 1 and "in use" in line and "--port" in line
    r = subprocess.run([sys.executable, "-m", "fairlib.cli", "serve", "--port", "70000"], capture_output=True,
                       text=True, timeout=120, cwd=ROOT, env=run_env())
    assert r.returncode == 2 and "--port" in one_line(r.stderr) and "0..65535" in r.stderr


@pytest.mark.parametrize("stage", ["imports", "compiling"])
def test_ctrl_c_during_start_up_is_one_line(stage, tmp_path):
    """SIGINT while ``fairlib serve`` starts: 130 and one line, no traceback, at once. Each stage is
    reached by a state, not a delay: ``imports``, the first fairlib module imported (``-X
    importtime`` lines on stderr); ``compiling``, the compile notice with an empty numba cache
    (the engine model compiles in the app's start-up hook for 30-90 s: asyncio's own SIGINT
    handler deferred the interrupt to its end, longer than 60 s on a busy machine). A hang
    fails with the server's stacks (faulthandler), which say where it was."""
    env = {**run_env(), "PYTHONFAULTHANDLER": "1"}
    cmd = [sys.executable, "-m", "fairlib", "serve", "--port", "0"]
    if stage == "compiling":
        env["NUMBA_CACHE_DIR"] = str(tmp_path / "numba")
    else:
        cmd[1:1] = ["-X", "importtime"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    out, err = LineReader(p.stdout, p), LineReader(p.stderr, p)
    try:
        if stage == "compiling":
            out.wait_for(lambda ln: COMPILE_NOTICE in ln, msg="the compile notice")
        else:
            # a module of fairlib's own imported (not the editable install's finder, which site
            # imports: an interrupt there is Python's fatal init_import_site error, not fairlib's)
            err.wait_for(lambda ln: ln.startswith("import time:") and ln.rsplit("|", 1)[-1].strip().startswith("fairlib."),
                         msg="a fairlib module imported")
        p.send_signal(signal.SIGINT)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            raise AssertionError("no exit within 60 s of SIGINT; the server's stacks:\n" + stack_of(p, err)) from None
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    out.join()
    err.join()
    lines = [ln for ln in err.lines if not ln.startswith("import time:")]
    assert "listening on" not in out.text(), out.text()
    # 130, or ended by SIGINT itself: CPython re-raises SIGINT at exit (its "unhandled Ctrl-C" flag)
    # when a KeyboardInterrupt passed through exec() of a source string on its way, such as a
    # dataclass being made at import or numba's generated code, even though fairlib caught it (seen
    # with strace: the process signals itself after the one line); a shell reports both as $? = 130
    assert p.returncode in (130, -signal.SIGINT), (p.returncode, lines)
    assert not any("Traceback" in ln for ln in lines) and len(lines) == 1, lines
    assert "interrupted (SIGINT) while starting" in lines[0]


def test_a_tenant_id_of_a_billion_is_refused_at_once():
    df = pd.DataFrame({"arrival_ms": [0.0, 1.0], "tenant": [0, 10 ** 9], "prompt_tokens": [4, 4],
                       "output_tokens": [2, 2]})
    t = time.perf_counter()
    with pytest.raises(ValueError, match=r"column 'tenant' must lie in 0\.\.65535"):
        fairlib.simulate(df)
    with pytest.raises(ValueError, match=r"n_tenants must be an integer in 1\.\.65536"):
        fairlib.simulate(df.iloc[:1], n_tenants=10 ** 9)
    assert time.perf_counter() - t < 5


# --- serve: every error is OpenAI error JSON -------------------------------------------------------

@pytest.fixture(scope="module")
def serve():
    with ServerThread(ServeConfig(engine=Engine(1.0, 0.1, 0.0, 4), port=0)) as srv:
        yield srv


def _answer(srv, path, data=None, method=None, ctype="application/json"):
    req = urllib.request.Request(srv.root + path, data=data, method=method, headers={"Content-Type": ctype})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=60) as r:
            return r.status, r.headers.get("Content-Type"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read()


@pytest.mark.parametrize("case,status,type_", [
    ("unknown route", 404, "NotFoundError"),
    ("wrong method", 405, "MethodNotAllowedError"),
    ("too large", 413, "RequestEntityTooLargeError"),
    ("nested too deeply", 400, "BadRequestError"),
])
def test_serve_error_answers_are_openai_error_json(serve, case, status, type_):
    if case == "unknown route":
        got = _answer(serve, "/v1/nope")
    elif case == "wrong method":
        got = _answer(serve, "/v1/completions", method="GET")
    elif case == "too large":
        got = _answer(serve, "/v1/completions", data=b"x" * (64 * 2 ** 20 + 1))
    else:
        got = _answer(serve, "/v1/completions", data=b"[" * 200_000 + b"]" * 200_000)
    code, ctype, body = got
    assert code == status and ctype.startswith("application/json")
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status and err["type"] == type_ and err["message"]


def test_the_package_root_loads_its_api_on_first_use():
    """``import fairlib`` loads neither numba nor pandas (the command line starts fast, and a Ctrl-C
    while it loads is caught by ``fairlib.__main__``); ``fairlib.simulate`` and the rest resolve
    when used, to the same objects as their modules'."""
    code = ("import sys, fairlib; assert 'numba' not in sys.modules and 'pandas' not in sys.modules, 'eager'; "
            "from fairlib.sim.simulate import simulate; assert fairlib.simulate is simulate; "
            "from fairlib import Engine, POLICIES; assert 'numba' in sys.modules and 'fcfs' in POLICIES; "
            "assert set(fairlib.__all__) <= set(dir(fairlib)); print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env=run_env())
    assert r.stdout.strip() == "ok", r.stderr
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = fairlib.nope


def test_the_installed_script_is_the_entry_that_catches_start_up_interrupts():
    import tomllib
    import fairlib.__main__ as entry
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"fairlib": "fairlib.__main__:main"} and callable(entry.main)


class _EchoAuth:
    """An OpenAI-shaped server that answers every completion 401 with the key it got in its error
    text (as some servers do), and guards ``/metrics`` with the same credentials."""

    def __init__(self, want: str):
        import http.server
        import threading
        self.want, self.seen = want, []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body, ctype):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                auth = self.headers.get("Authorization")
                outer.seen.append(("GET", self.path, auth))
                if auth != outer.want:
                    return self._send(401, b"unauthorized", "text/plain")
                self._send(200, b"vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n", "text/plain")

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                auth = self.headers.get("Authorization")
                outer.seen.append(("POST", self.path, auth))
                err = {"error": {"message": f"Incorrect API key provided: {auth}", "type": "invalid_request_error"}}
                self._send(401, json.dumps(err).encode(), "application/json")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_key_the_server_echoes_and_the_metrics_credentials_are_masked(tmp_path):
    """The server's 401 text holds the key: records.jsonl has it masked; /metrics gets the same
    credentials as the completions (a guarded /metrics is sampled), and summary.json names it
    without them. A ``metrics_url`` with its own ``user:password@`` sends those, as Basic."""
    secret = "sk-echoed-KEY-4411aa"
    df = pd.DataFrame({"arrival_ms": [0.0, 300.0, 600.0], "tenant": [0, 1, 0], "prompt_tokens": [4, 4, 4],
                       "output_tokens": [3, 3, 3]})
    srv = _EchoAuth(f"Bearer {secret}")
    try:
        cfg = EndpointConfig(base_url=f"http://127.0.0.1:{srv.port}/v1", model="m", api_key=secret)
        s = client_run(build_schedule(df, seed=0), cfg, tmp_path / "a", scrape_metrics=True,
                       metrics_interval_s=0.2, handle_sigint=False)
        assert s["n_ok"] == 0 and s["server_metrics"]["samples"] >= 2 and s["server_metrics"]["errors"] == 0
        gets = [a for m, p, a in srv.seen if m == "GET" and p == "/metrics"]
        assert gets and set(gets) == {f"Bearer {secret}"}
        recs = [json.loads(x) for x in (tmp_path / "a" / "records.jsonl").read_text().splitlines()]
        assert [r["error_message"] for r in recs] == ['HTTP 401: Incorrect API key provided: Bearer ***'] * 3
        assert grep_dir(tmp_path / "a", secret) == []

        basic = "Basic " + base64.b64encode(b"bob:pw-METRICS-77e1").decode()
        srv.want, srv.seen[:] = basic, []
        cfg = EndpointConfig(base_url=f"http://127.0.0.1:{srv.port}/v1", model="m", api_key=secret,
                             metrics_url=f"http://bob:pw-METRICS-77e1@127.0.0.1:{srv.port}/metrics")
        s = client_run(build_schedule(df.iloc[:1], seed=0), cfg, tmp_path / "b", scrape_metrics=True,
                       metrics_interval_s=0.2, handle_sigint=False)
        assert {a for m, p, a in srv.seen if p == "/metrics"} == {basic} and s["server_metrics"]["samples"] >= 1
        assert s["server_metrics"]["url"] == f"http://127.0.0.1:{srv.port}/metrics"   # sent without userinfo
        assert grep_dir(tmp_path / "b", "pw-METRICS-77e1") == [] and grep_dir(tmp_path / "b", basic.split()[1]) == []
    finally:
        srv.close()
