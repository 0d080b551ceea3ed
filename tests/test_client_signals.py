"""A run that ends early says so everywhere: real ``fairlib run`` processes, real signals.

(a) SIGTERM with ``--workers 2`` mid-run: exit 143, no worker survives the parent (the server sees
no request after it exits), summary.json says interrupted and invalid, in-flight requests have
``interrupted`` records; (b) the same in one process; (c) SIGINT while the workers start stops
everything before a request leaves: exit 130; (d) an unreachable endpoint: exit 1, invalid, the
reason names it; (e) a run directory without summary.json (a killed client) reads as incomplete
with the planned count from config.json; (f) ``--workers`` is bounded by the CPU count.
"""
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from fairlib.analysis.run import validity
from fairlib.cli import main
from fairlib.client import EndpointConfig, build_schedule, load_records, load_summary, run
from fairlib.records import load_run
from fairlib.records.rundir import read_jsonl
from fairlib.serve.replay import ReplayServer, Synth

ROOT = Path(__file__).resolve().parents[1]

# Two tenants, one request each every 418 ms (rho 0.02 of the default engine at 8 + 4 tokens):
# 40 requests over 8 s, about 5 per second.
TINY = """
name = "tiny"
description = "Two tenants, periodic arrivals, short requests."
question = "Does the client stop cleanly?"
duration_s = 8.0
rho = 0.02
seeds = [0]
policy = "fcfs"
[[tenants]]
name = "a"
share = 0.5
prompt = 8
output = 4
arrival = { process = "periodic" }
ttft_slo_ms = 1000
tpot_slo_ms = 100
[[tenants]]
name = "b"
share = 0.5
prompt = 8
output = 4
arrival = { process = "periodic" }
ttft_slo_ms = 1000
tpot_slo_ms = 100
"""
N_PLANNED = 40
SLOW = Synth(ttft_s=0.6, itl_s=0.1)   # ~0.9 s a request: several in flight at any time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def schedule(n):
    df = pd.DataFrame({"arrival_ms": [10.0 * i for i in range(n)], "tenant": 0, "prompt_tokens": 8,
                       "output_tokens": 4, "priority": 0})
    return build_schedule(df, seed=0, tenant_names=["t"])


@pytest.fixture
def scenario(tmp_path):
    p = tmp_path / "tiny.toml"
    p.write_text(TINY)
    return p


@pytest.fixture
def server():
    with ReplayServer({"slow": SLOW}) as srv:
        yield srv


def start_cli(scenario, endpoint, out, *extra):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "fairlib.cli", "run", "--scenario", str(scenario), "--endpoint", endpoint,
           "--model", "m", "--out", str(out), "--no-metrics", *extra]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def children(pid) -> set:
    """Pids whose parent is ``pid`` (from /proc)."""
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(d.name))
    return out


def alive(pid) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(cond, timeout_s, proc):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if cond():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the client exited early ({proc.returncode}): {proc.communicate()}")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"timed out: {proc.communicate()}")


def finish(proc, timeout_s=30):
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        raise AssertionError(f"the client did not stop: {stdout}\n{stderr}")
    return proc.returncode, stdout, stderr, time.time()


def stopped_mid_run(server, scenario, tmp_path, sig, workers):
    out = tmp_path / "run"
    proc = start_cli(scenario, server.url("slow"), out, "--workers", str(workers))
    workers_seen = set()

    def records_done():
        workers_seen.update(children(proc.pid))
        rec = out / "records.jsonl"
        return rec.exists() and len(read_jsonl(rec)) >= 4
    try:
        wait_for(records_done, 60, proc)
        proc.send_signal(sig)
        code, stdout, stderr, t_exit = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(1.5)
    late = [r for r in server.state["requests"] if r["t"] > t_exit]
    return code, stderr, out, workers_seen, late


@pytest.mark.parametrize("workers", [2, 1])
def test_sigterm_mid_run_stops_everything_and_says_so(server, scenario, tmp_path, workers):
    code, stderr, out, pids, late = stopped_mid_run(server, scenario, tmp_path, signal.SIGTERM, workers)
    assert code == 143, stderr
    assert not late, f"{len(late)} requests reached the server after the client exited"
    assert not [p for p in pids if alive(p)], "a worker outlived the parent"
    if workers > 1:
        assert len(pids) >= workers
    s = load_summary(out)
    assert s["interrupted"] is True and s["valid"] is False and s["complete"] is False
    assert s["stopped_by"] == "SIGTERM" and "SIGTERM" in s["valid_reason"]
    assert s["n_planned"] == N_PLANNED and s["n_sent"] < N_PLANNED
    recs = load_records(out)
    # every request the server saw has a record; the ones in flight at the signal say so
    assert len(server.state["requests"]) <= len(recs) == s["n_records"] == s["n_sent"]
    assert (recs.error_class == "interrupted").sum() >= 1
    assert set(recs.error_class) <= {"none", "interrupted"}
    assert "Traceback" not in stderr


def test_sigint_while_workers_start_stops_everything(server, scenario, tmp_path):
    out = tmp_path / "run"
    proc = start_cli(scenario, server.url("slow"), out, "--workers", "2")
    pids = set()

    def workers_started():   # the parent has spawned its workers; they are still importing
        for p in children(proc.pid):
            try:
                if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes():
                    pids.add(p)
            except OSError:
                pass
        return len(pids) >= 2
    try:
        wait_for(workers_started, 60, proc)
        assert not (out / "records.jsonl").exists() or not read_jsonl(out / "records.jsonl")
        proc.send_signal(signal.SIGINT)
        code, stdout, stderr, t_exit = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(3.0)   # a worker left behind would be sending by now
    assert code == 130, stderr
    assert server.state["requests"] == []
    assert not [p for p in pids if alive(p)]
    s = load_summary(out)
    assert s["interrupted"] is True and s["valid"] is False and s["stopped_by"] == "SIGINT"
    assert s["n_planned"] == N_PLANNED and s["n_sent"] == 0 and s["n_records"] == 0
    assert "Traceback" not in stderr


def test_unreachable_endpoint_is_invalid_and_exits_nonzero(scenario, tmp_path):
    out = tmp_path / "run"
    proc = start_cli(scenario, f"http://127.0.0.1:{free_port()}/v1", out, "--duration-s", "1")
    code, stdout, stderr, _ = finish(proc, timeout_s=60)
    assert code == 1, (stdout, stderr)
    s = load_summary(out)
    assert s["valid"] is False and s["n_ok"] == 0 and s["complete"] is True and not s["interrupted"]
    n = s["n_planned"]
    assert n >= 2 and s["error_counts"]["connect_error"] == n
    assert s["valid_reason"].startswith("no request succeeded") and f"connect_error {n}" in s["valid_reason"]
    assert "INVALID (no request succeeded" in stdout


def test_run_without_summary_reads_incomplete(tmp_path):
    with ReplayServer({"ok": Synth(ttft_s=0.01, itl_s=0.002)}) as srv:
        summary = run(schedule(n=5), EndpointConfig(base_url=srv.url("ok"), model="m"), tmp_path / "r",
                      collect_env=False, scrape_metrics=False, start_delay_s=0.05)
    assert summary["valid"] and summary["complete"] and summary["n_ok"] == 5
    # a client killed after 3 of its 5 records: summary.json never written
    (tmp_path / "r" / "summary.json").unlink()
    lines = (tmp_path / "r" / "records.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "r" / "records.jsonl").write_text("".join(lines[:3]))
    r = load_run(tmp_path / "r")
    s = r.summary
    assert s["n_planned"] == 5 and s["n_records"] == 3 and s["n_not_sent"] == 2
    assert s["valid"] is False and s["interrupted"] is True and s["complete"] is False
    assert "summary.json" in s["valid_reason"] and "3 of 5" in s["valid_reason"]
    v = validity(tmp_path / "r")
    assert v["valid"] is False and v["n_planned"] == 5 and v["interrupted"] is True


def test_workers_bounded_by_cpu_count(scenario, tmp_path, capsys):
    n = os.cpu_count()
    with pytest.raises(SystemExit) as e:
        main(["run", "--scenario", str(scenario), "--endpoint", f"http://127.0.0.1:{free_port()}/v1",
              "--model", "m", "--duration-s", "1", "--no-metrics", "--workers", str(n + 1),
              "--out", str(tmp_path / "run")])
    assert str(e.value) == f"fairlib run: --workers must be between 1 and {n} (the CPU count), got {n + 1}"
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match=r"workers must be between 1 and \d+"):
        run(schedule(n=1), EndpointConfig(base_url="http://127.0.0.1:9/v1", model="m"), tmp_path / "r2",
            workers=0, collect_env=False, scrape_metrics=False)


def test_run_help_documents_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    for code in ("0 ", "1 ", "130", "143"):
        assert code in text
    assert "--workers" in text and "CPU count" in text
