"""fairlib.calibrate.lifecycle' lifecycle, without a real engine: a tiny Python HTTP server stands in.

Health wait, the clear error (exit code, timeout, log tail), stopping by process group (SIGTERM,
then SIGKILL; children too), the context manager, the atexit hook, ``external`` endpoints, and
the set-up checks and tokenizer of the tiny models.
"""
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fairlib.calibrate import lifecycle as engines
from fairlib.calibrate.lifecycle import (DEFAULT_NICE, DEFAULT_SCHED_IDLE, EngineStartError, ModelTokenizer, nice_of, sched_of, _flag_args, group_members, engine_available,
                             free_port, port_is_free, start_engine)

ROOT = Path(__file__).resolve().parents[1]

SERVER = textwrap.dedent("""
    import http.server, json, os, signal, subprocess, sys, time
    port, delay, mode = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    t0 = time.monotonic()
    print("fake engine starting on", port, flush=True)
    if mode == "crash":
        print("fatal: cannot load model xyz", flush=True)
        sys.exit(3)
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "child":  # a grandchild in the same process group, like vLLM's engine core
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def do_GET(self):
            if self.path == "/health":
                ok = mode != "never" and time.monotonic() - t0 >= delay
                self.send_response(200 if ok else 503)
                self.end_headers()
            elif self.path == "/v1/models":
                body = json.dumps({"data": [{"id": "fake-model"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)
            else:
                self.send_response(404)
                self.end_headers()
    http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
""")


@pytest.fixture()
def fake(tmp_path, monkeypatch):
    monkeypatch.setenv("FAIRLIB_ENGINES_LOG_DIR", str(tmp_path / "logs"))
    script = tmp_path / "fake_engine.py"
    script.write_text(SERVER)

    def cmd(delay=0.3, mode="ok"):
        return [sys.executable, str(script), "{port}", str(delay), mode]
    return cmd


def _gone(pgid, timeout=5.0):
    deadline = time.monotonic() + timeout
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not group_members(pgid)


def test_start_health_stop(fake, tmp_path):
    eng = start_engine("fairlib", command=fake(0.5), model="m", log_path=tmp_path / "e.log")
    try:
        assert eng.alive and eng.healthy()
        assert eng.base_url == f"http://127.0.0.1:{eng.port}/v1"
        assert eng.startup_s >= 0.5
        cfg = eng.endpoint_config(timeout_s=30)
        assert cfg.base_url == eng.base_url and cfg.model == "m" and cfg.timeout_s == 30
        assert cfg.resolved_metrics_url == f"http://127.0.0.1:{eng.port}/metrics"
        assert eng.rss_bytes() > 0 and eng.pids() == [eng.pid]
        assert "fake engine starting" in eng.log_tail()
    finally:
        pgid, port = eng.pid, eng.port
        eng.stop()
    assert eng.proc.returncode is not None and _gone(pgid) and port_is_free(port)
    assert not eng.alive
    eng.stop()  # idempotent


def test_exit_before_healthy_raises_with_log_tail(fake):
    with pytest.raises(EngineStartError) as ei:
        start_engine("fairlib", command=fake(mode="crash"))
    msg = str(ei.value)
    assert "exited with code 3" in msg and "fatal: cannot load model xyz" in msg


def test_timeout_raises_and_stops(fake):
    t0 = time.monotonic()
    with pytest.raises(EngineStartError) as ei:
        start_engine("fairlib", command=fake(mode="never"), startup_timeout_s=1.5)
    assert time.monotonic() - t0 < 10
    msg = str(ei.value)
    assert "not healthy after 2 s" in msg and "last answered 503" in msg and "fake engine starting" in msg
    assert not engines._LIVE  # it was stopped, not left running


def test_stop_escalates_and_kills_children(fake):
    eng = start_engine("fairlib", command=fake(0.0, "stubborn"), stop_timeout_s=1.0)
    pgid = eng.pid
    t0 = time.monotonic()
    eng.stop()
    assert eng.proc.returncode == -9 and time.monotonic() - t0 < 6
    assert _gone(pgid)

    eng = start_engine("fairlib", command=fake(0.2, "child"))
    pgid = eng.pid
    deadline = time.monotonic() + 5
    while len(eng.pids()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(eng.pids()) == 2
    eng.stop()
    assert _gone(pgid)


def test_context_manager_stops_on_error(fake):
    with pytest.raises(KeyError):
        with start_engine("fairlib", command=fake(0.0)) as eng:
            pgid, port = eng.pid, eng.port
            raise KeyError("boom")
    assert _gone(pgid) and port_is_free(port)


def test_port_in_use_is_a_clear_error(fake):
    with start_engine("fairlib", command=fake(0.0)) as eng:
        with pytest.raises(EngineStartError, match="already in use"):
            start_engine("fairlib", port=eng.port, command=fake(0.0))


def test_external_endpoint_is_not_started_or_stopped(fake):
    with start_engine("fairlib", command=fake(0.0)) as server:
        ext = start_engine("external", base_url=server.base_url)
        assert ext.model == "fake-model" and ext.pid is None
        assert ext.endpoint_config().base_url == server.base_url
        ext.stop()
        with ext:
            pass
        assert server.alive and server.healthy()
    with pytest.raises(EngineStartError, match="not healthy"):
        start_engine("external", base_url=f"http://127.0.0.1:{free_port()}/v1", startup_timeout_s=0.5)
    with pytest.raises(ValueError, match="base_url"):
        start_engine("external")


def test_atexit_stops_a_forgotten_engine(fake, tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from fairlib.calibrate.lifecycle import start_engine
        eng = start_engine("fairlib", command={fake(0.0)!r})
        print(eng.pid, eng.port, flush=True)
    """)  # exits without stopping it
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    pid, port = map(int, out.stdout.split())
    assert _gone(pid) and port_is_free(port)


def test_parent_killed_engine_follows(fake):
    code = textwrap.dedent(f"""
        import os, signal
        from fairlib.calibrate.lifecycle import start_engine
        eng = start_engine("fairlib", command={fake(0.0)!r})
        print(eng.pid, eng.port, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # no atexit: the parent-death signal must do it
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    pid, port = map(int, out.stdout.split())
    assert _gone(pid) and port_is_free(port)


def test_unknown_kind_and_missing_setup(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown engine kind"):
        start_engine("tgi")
    monkeypatch.setenv("FAIRLIB_ENGINES_DIR", str(tmp_path / "nowhere"))
    for kind, hint in (("vllm", "setup_vllm.sh"), ("llamacpp", "setup_llamacpp.sh")):
        ok, why = engine_available(kind)
        assert not ok and hint in why
        with pytest.raises(EngineStartError, match=hint):
            start_engine(kind)


def test_flag_args():
    assert _flag_args({"max_batch": 8, "verbose": True, "quiet": False, "x": None, "pp": ["a=1", "b=2"]}) == \
        ["--max-batch", "8", "--verbose", "--pp", "a=1", "--pp", "b=2"]


def test_model_tokenizer(tmp_path):
    vocab = [["<unk>", 0.0], ["<s>", 0.0], ["</s>", 0.0], ["<0x0A>", 0.0],
             ["\u2581", -1], ["\u2581ti", -1], ["\u2581time", -1], ["a", -1], ["b", -1], ["\u2581a", -1]]
    tj = {"model": {"type": "Unigram", "unk_id": 0, "vocab": vocab},
          "added_tokens": [{"id": i, "content": s} for i, s in enumerate(["<unk>", "<s>", "</s>"])]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tj))
    tok = ModelTokenizer(tmp_path)
    assert tok.encode("time tiab a") == [6, 5, 7, 8, 9]
    assert tok.decode([6, 5, 7, 8, 9]) == "time tiab a"
    assert all(i >= 4 for i in tok.encode("<s> </s> ? time"))


def test_default_model_settings(tmp_path, monkeypatch):
    """The engine-specific request settings, without starting anything."""
    monkeypatch.setenv("FAIRLIB_ENGINES_DIR", str(tmp_path))
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    folder = tmp_path / "models" / "tiny-llama-4l-512h-8192v-s0"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer.json").write_text("{}")
    (folder / "fairlib_model.json").write_text("{}")
    (tmp_path / "models" / "tiny-llama-4l-512h-8192v-s0.gguf").write_bytes(b"GGUF")
    for exe in (engines.vllm_python(), engines.llama_server_path()):
        exe.parent.mkdir(parents=True)
        exe.write_text("")
    cmd, env, name, path, st = engines._vllm(1234, scheduling_policy="priority")
    assert path == folder and "--scheduling-policy" in cmd and st["send_priority"]
    assert st["extra_body"] == {"return_token_ids": True}
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and env["HF_HUB_OFFLINE"] == "1"
    assert str(env["VLLM_CACHE_ROOT"]).startswith(str(ROOT))
    cmd, env, name, path, st = engines._llamacpp(1234, n_parallel=4)
    assert path.suffix == ".gguf" and st["extra_body"] == {"cache_prompt": False}
    i = cmd.index("-c")
    assert cmd[i + 1] == 4 * 2048 and "--metrics" in cmd and cmd[cmd.index("--poll") + 1] == 0
    assert st["tokenizer_folder"] == str(folder)


def test_fairlib_serve_end_to_end(tmp_path, monkeypatch):
    """kind="fairlib" starts ``fairlib serve`` (the test double) and the client measures it."""
    pytest.importorskip("fairlib.cli")
    import pandas as pd

    from fairlib.client import build_schedule, load_records, run

    monkeypatch.setenv("FAIRLIB_ENGINES_LOG_DIR", str(tmp_path / "logs"))
    with start_engine("fairlib", iter_base_ms=2.0, iter_slope_ms=0.2, max_batch=8) as eng:
        pgid, port = eng.pid, eng.port
        assert eng.model == "fairlib-sim" and eng.command[1:4] == ["-m", "fairlib.cli", "serve"]
        wl = pd.DataFrame({"arrival_ms": [0.0, 20.0, 40.0, 60.0], "tenant": [0, 1, 0, 1],
                           "prompt_tokens": [8, 8, 8, 8], "output_tokens": [4, 5, 6, 7]})
        summary = run(build_schedule(wl, seed=0), eng.endpoint_config(), tmp_path / "run")
    assert summary["n_ok"] == 4
    df = load_records(tmp_path / "run")
    assert (df.completion_tokens == df.max_tokens).all()
    assert _gone(pgid) and port_is_free(port)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_engine_runs_below_the_client_and_its_children_inherit(fake):
    """A real engine shares the machine with the client: it runs ``nice`` steps below it, and so
    does every process it starts (vLLM's engine core and workers)."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    eng = start_engine("fairlib", command=fake(0.2, "child"), nice=7)
    try:
        assert nice_of(eng.pid) == min(own + 7, 19)
        deadline = time.monotonic() + 5
        while len(eng.pids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        kids = [p for p in eng.pids() if p != eng.pid]
        assert kids and all(nice_of(p) == min(own + 7, 19) for p in kids)
    finally:
        eng.stop()
    assert DEFAULT_NICE["vllm"] == DEFAULT_NICE["llamacpp"] == 10 and DEFAULT_NICE["fairlib"] == 0
    with start_engine("fairlib", command=fake(0.0)) as same:       # the test double: unchanged
        assert nice_of(same.pid) == own


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE is Linux's")
def test_a_real_engine_runs_under_sched_idle_and_its_children_inherit(fake):
    """Nice 10 left a nice-0 client waiting 0.6-4.5 s for a core beside vLLM (DEFAULT_SCHED_IDLE):
    a real engine runs under SCHED_IDLE, and so does every process it starts."""
    eng = start_engine("fairlib", command=fake(0.2, "child"), sched_idle=True)
    try:
        assert sched_of(eng.pid) == "idle"
        deadline = time.monotonic() + 5
        while len(eng.pids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        kids = [p for p in eng.pids() if p != eng.pid]
        assert kids and all(sched_of(p) == "idle" for p in kids)
    finally:
        eng.stop()
    assert DEFAULT_SCHED_IDLE["vllm"] and DEFAULT_SCHED_IDLE["llamacpp"] and not DEFAULT_SCHED_IDLE["fairlib"]
    with start_engine("fairlib", command=fake(0.0)) as same:       # the test double: unchanged
        assert sched_of(same.pid) == "other" and sched_of(os.getpid()) == "other"


def affinity_or(tid: int, default):
    """A thread's CPUs, or ``default`` when it ended in between (the fake server's handler threads)."""
    try:
        return os.sched_getaffinity(tid)
    except ProcessLookupError:
        return default


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two CPUs")
def test_an_engine_confined_to_cpus_and_its_children_inherit(fake):
    """``cpus``: the engine and every process it starts run on those CPUs only (split_cpus gives
    the engine the first CPU this process may use and the caller the rest); bad CPUs are refused."""
    from fairlib.calibrate.processes import check_cpus, split_cpus
    engine_cpus, rest = split_cpus()
    allowed = os.sched_getaffinity(0)
    assert engine_cpus | rest == allowed and not engine_cpus & rest and len(engine_cpus) == 1
    eng = start_engine("fairlib", command=fake(0.2, "child"), cpus=engine_cpus)
    try:
        assert os.sched_getaffinity(eng.pid) == engine_cpus
        deadline = time.monotonic() + 5
        while len(eng.pids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        kids = [p for p in eng.pids() if p != eng.pid]
        assert kids and all(os.sched_getaffinity(p) == engine_cpus for p in kids)
    finally:
        eng.stop()
    assert os.sched_getaffinity(0) == allowed                       # the caller's own: unchanged
    with start_engine("fairlib", command=fake(0.0)) as anywhere:   # default: not confined
        assert os.sched_getaffinity(anywhere.pid) == allowed
    assert check_cpus(None) is None and check_cpus([min(allowed)]) == {min(allowed)}
    with pytest.raises(ValueError, match="cpus must be a non-empty set of the CPUs"):
        check_cpus([max(allowed) + 64])
    with pytest.raises(ValueError, match="cpus must be a non-empty set"):
        start_engine("fairlib", command=fake(0.0), cpus=[])
    with pytest.raises(ValueError, match="cpus must be CPU numbers"):
        check_cpus(["x"])
    with pytest.raises(ValueError, match="cpus must be CPU numbers"):
        check_cpus("01")                 # a string is not a set of CPUs
    with pytest.raises(ValueError, match="unexpected flags \\['cpus'\\]"):
        start_engine("external", base_url="http://127.0.0.1:9/v1", cpus=engine_cpus)
    # front_cpus: once up, the first process moves (its threads), its children stay on cpus
    eng = start_engine("fairlib", command=fake(0.2, "child"), cpus=engine_cpus, front_cpus=rest)
    try:
        deadline = time.monotonic() + 5
        while len(eng.pids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(affinity_or(int(t), rest) == rest for t in os.listdir(f"/proc/{eng.pid}/task"))
        kids = [p for p in eng.pids() if p != eng.pid]
        assert kids and all(os.sched_getaffinity(p) == engine_cpus for p in kids)
    finally:
        eng.stop()
    with pytest.raises(ValueError, match="front_cpus must be a non-empty set"):
        start_engine("fairlib", command=fake(0.0), front_cpus=[])
