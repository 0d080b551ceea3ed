"""A run that ends early says so everywhere: real ``fairlib run`` processes, real signals.

(a) SIGTERM with ``--workers 2`` mid-run: exit 143, no worker survives the parent (the server sees
no request after it exits), summary.json says interrupted and invalid, in-flight requests have
``interrupted`` records; (b) the same in one process; the same for SIGHUP (a closed terminal or a
dropped ssh session, sent to the whole process group: exit 129), SIGINT mid-run (a Ctrl-C to the
group: exit 130) and SIGQUIT (131); (c) SIGINT while the workers start stops everything before a
request leaves (but the preflight request): exit 130; (c') SIGKILL of the parent mid-run: every
worker dies with it and the server gets no request after; (d) an unreachable endpoint: the
preflight stops the run before it starts, exit 1, one line asking whether the server is up;
(e) a run directory without summary.json (a killed client) reads as incomplete with the planned
count from config.json; (f) ``--workers`` is bounded by the CPU count; (g) a run with more than
1% failed answers is invalid and exits 1, ``max_error_rate`` loosens the rule.
"""
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from fairlib.analysis.run import validity
from fairlib.cli import main, run_exit_status
from fairlib.client import EndpointConfig, build_schedule, load_records, load_summary, run
from fairlib.client.measure import exit_status
from fairlib.records import load_run
from fairlib.records.run import records_summary
from fairlib.records.rundir import read_jsonl
from fairlib.records.summary import MAX_ERROR_RATE, error_messages, summarize
from fairlib.serve.replay import ByTenant, HttpError, ReplayServer, Synth

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


def start_cli(scenario, endpoint, out, *extra, new_session=False):
    """``fairlib run`` in a child process (``new_session``: its own process group, which a test
    can signal as a terminal signals its foreground group)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "fairlib.cli", "run", "--scenario", str(scenario), "--endpoint", endpoint,
           "--model", "m", "--out", str(out), "--no-metrics", *extra]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=new_session)


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


def scheduled(server) -> list:
    """The requests of the schedule the server saw: all but ``fairlib run``'s preflight request (the
    first request with max_tokens 1; TINY's requests ask for 4)."""
    return [r for r in server.state["requests"] if r["body"].get("max_tokens") != 1]


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
        raise AssertionError(f"the client did not stop: {stdout}\n{stderr}") from None
    return proc.returncode, stdout, stderr, time.time()


def records_done(proc, out, seen: set, n=4):
    """A ``wait_for`` condition: ``n`` records written (the pids of ``proc``'s children go to ``seen``)."""
    def cond():
        seen.update(children(proc.pid))
        rec = out / "records.jsonl"
        return rec.exists() and len(read_jsonl(rec)) >= n
    return cond


def stopped_mid_run(server, scenario, tmp_path, sig, workers, group=False):
    """``fairlib run`` stopped by ``sig`` after 4 records: to the client alone, or (``group``) to
    its whole process group, workers included, as a terminal's Ctrl-C or hang-up is."""
    out = tmp_path / "run"
    proc = start_cli(scenario, server.url("slow"), out, "--workers", str(workers), new_session=group)
    workers_seen = set()
    try:
        wait_for(records_done(proc, out, workers_seen), 60, proc)
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        code, stdout, stderr, t_exit = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(1.5)
    late = [r for r in server.state["requests"] if r["t"] > t_exit]
    return code, stderr, out, workers_seen, late


def assert_stopped_by(sig, workers, server, code, stderr, out, pids, late):
    """What every caught stop signal leaves: summary.json interrupted and invalid, naming the
    signal; the completed requests' records kept, the in-flight ones ``interrupted``; no worker
    alive, no request after the exit; exit 128 + the signal's number."""
    assert not late, f"{len(late)} requests reached the server after the client exited"
    assert not [p for p in pids if alive(p)], "a worker outlived the parent"
    if workers > 1:
        assert len(pids) >= workers
    s = load_summary(out)
    assert s["interrupted"] is True and s["valid"] is False and s["complete"] is False, s
    assert s["stopped_by"] == sig.name and sig.name in s["valid_reason"]
    assert s["n_planned"] == N_PLANNED and s["n_sent"] < N_PLANNED
    recs = load_records(out)
    # every request of the schedule the server saw has a record; the ones in flight at the signal say so
    assert len(scheduled(server)) <= len(recs) == s["n_records"] == s["n_sent"]
    assert (recs.error_class == "none").sum() == s["n_ok"] >= 4   # the completed ones kept (4 before the signal)
    assert (recs.error_class == "interrupted").sum() >= 1
    assert set(recs.error_class) <= {"none", "interrupted"}
    assert "Traceback" not in stderr
    want = 128 + int(sig)
    assert exit_status(s) == want
    assert run_exit_status(s) == want      # fairlib.cli's mapping is the client's (the xfail it had is gone)
    assert code == want, stderr


@pytest.mark.parametrize("sig, workers, group", [
    (signal.SIGTERM, 2, False), (signal.SIGTERM, 1, False),   # CI cancellation, timeout, docker stop
    (signal.SIGHUP, 2, True), (signal.SIGHUP, 1, True),       # a closed terminal, a dropped ssh session
    (signal.SIGINT, 2, True), (signal.SIGINT, 1, True),       # Ctrl-C mid-run
    (signal.SIGQUIT, 2, False),                               # a quit from the terminal (Ctrl-backslash)
], ids=lambda v: v.name if isinstance(v, signal.Signals) else str(v))
def test_a_signal_mid_run_stops_everything_and_says_so(server, scenario, tmp_path, sig, workers, group):
    code, stderr, out, pids, late = stopped_mid_run(server, scenario, tmp_path, sig, workers, group)
    assert_stopped_by(sig, workers, server, code, stderr, out, pids, late)


def test_sigkill_of_the_parent_kills_every_worker(server, scenario, tmp_path):
    """SIGKILL cannot be caught: the workers die with the parent (``PR_SET_PDEATHSIG``), so the
    server gets no request after, and the run directory reads as incomplete."""
    out = tmp_path / "run"
    proc = start_cli(scenario, server.url("slow"), out, "--workers", "2")
    try:
        wait_for(records_done(proc, out, set()), 60, proc)
        tree = psutil.Process(proc.pid).children(recursive=True)
        workers = [p for p in tree if "spawn_main" in " ".join(p.cmdline())]
        assert len(workers) == 2, [p.cmdline() for p in tree]
        proc.kill()
        proc.wait(10)
        gone, left = psutil.wait_procs(tree, timeout=5)
        t_dead = time.time()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not left, f"still alive 5 s after the parent's SIGKILL: {[(p.pid, p.cmdline()) for p in left]}"
    time.sleep(1.5)   # the schedule runs 8 s: a surviving worker would be sending now
    late = [r for r in server.state["requests"] if r["t"] > t_dead]
    assert not late, f"{len(late)} requests reached the server after the workers died"
    assert len(server.state["requests"]) < N_PLANNED
    assert not (out / "summary.json").exists()
    s = load_run(out).summary
    assert s["valid"] is False and s["interrupted"] is True and s["n_planned"] == N_PLANNED


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
    assert scheduled(server) == [] and len(server.state["requests"]) == 1   # the preflight request alone
    assert not [p for p in pids if alive(p)]
    s = load_summary(out)
    assert s["interrupted"] is True and s["valid"] is False and s["stopped_by"] == "SIGINT"
    assert s["n_planned"] == N_PLANNED and s["n_sent"] == 0 and s["n_records"] == 0
    assert "Traceback" not in stderr


def test_unreachable_endpoint_stops_before_the_run_with_a_hint(scenario, tmp_path):
    """Nothing answers: the preflight request fails, the run never starts (no run directory),
    one line says so and asks whether the server is up at that base URL; exit 1."""
    out = tmp_path / "run"
    url = f"http://127.0.0.1:{free_port()}/v1"
    proc = start_cli(scenario, url, out, "--duration-s", "1")
    code, stdout, stderr, _ = finish(proc, timeout_s=60)
    assert code == 1, (stdout, stderr)
    assert not out.exists()
    line = stderr.strip().splitlines()[-1]
    assert line.startswith(f"fairlib run: POST {url}/completions: ConnectError") and "ConnectionRefusedError" in line
    assert line.endswith(f"is the server up, and is {url} its base URL (http://HOST:PORT/v1)?")
    assert "Traceback" not in stderr


def test_more_than_one_percent_failed_is_invalid_and_exits_1(tmp_path):
    """1 success and 39 HTTP 500s: complete and on schedule, but the server failed 97.5% of the
    answers: INVALID (exit 1), the reason counts them and the summary keeps the server's message;
    --max-error-rate 1 loosens the rule (then valid, exit 0)."""
    df = pd.DataFrame({"arrival_ms": [10.0 * i for i in range(40)], "tenant": [0] + [1] * 39,
                       "prompt_tokens": 8, "output_tokens": 4})
    sched = build_schedule(df, seed=0, tenant_names=["ok", "bad"])
    bad = HttpError(500, "the engine fell over")
    with ReplayServer({"mixed": ByTenant({"ok": Synth(ttft_s=0.005, itl_s=0.001)}, default=bad)}) as srv:
        s = run(sched, EndpointConfig(base_url=srv.url("mixed"), model="m"), tmp_path / "r",
                collect_env=False, scrape_metrics=False, start_delay_s=0.05, handle_sigint=False)
        lenient = run(sched, EndpointConfig(base_url=srv.url("mixed"), model="m"), tmp_path / "r1",
                      collect_env=False, scrape_metrics=False, start_delay_s=0.05, handle_sigint=False,
                      max_error_rate=1.0, lag_threshold_ms=1000.0)     # the error rule alone, on a busy machine too
    assert s["valid"] is False and s["complete"] is True and s["n_ok"] == 1
    assert s["n_errors"] == 39 and s["error_counts"]["http_5xx"] == 39 and s["n_refused"] == 0
    assert s["error_rate"] == pytest.approx(39 / 40) and s["max_error_rate"] == MAX_ERROR_RATE == 0.01
    assert s["error_rate_exceeded"] is True
    assert "39 of 40 answered requests failed (97.5% > --max-error-rate 1%: http_5xx 39)" in s["valid_reason"]
    assert s["error_messages"] == [{"error_class": "http_5xx", "message": "HTTP 500: the engine fell over",
                                    "count": 39}]
    assert exit_status(s) == 1 and load_summary(tmp_path / "r")["valid"] is False
    assert lenient["valid"] and not lenient["error_rate_exceeded"] and exit_status(lenient) == 0
    # analyze's rebuilt summary applies the run's own threshold (config.json records it)
    r = load_run(tmp_path / "r1")
    assert r.config["max_error_rate"] == 1.0 and records_summary(r.records, r.config)["valid"]
    rebuilt = records_summary(r.records, {**r.config, "max_error_rate": 0.01})
    assert not rebuilt["valid"] and rebuilt["error_messages"] == s["error_messages"]
    with pytest.raises(ValueError, match="max_error_rate must be between 0 and 1"):
        run(sched, EndpointConfig(base_url=srv.url("mixed"), model="m"), tmp_path / "r2", max_error_rate=1.5)


def test_error_rate_and_exit_status_rules():
    def rows(**n):   # n records of each class, all sent on time
        return [(0.01 * i, 0.01 * i, cls) for i, cls in enumerate(c for c, k in n.items() for _ in range(k))]

    # one failure in 100 is within 1%, two in 101 are not
    one = summarize(rows(none=99, http_5xx=1), n_planned=100, requested_rate_rps=100.0)
    assert one["error_rate"] == 0.01 and one["valid"] and exit_status(one) == 0
    two = summarize(rows(none=99, http_4xx=2), n_planned=101, requested_rate_rps=100.0)
    assert two["error_rate_exceeded"] and not two["valid"] and exit_status(two) == 1
    assert two["valid_reason"].startswith("2 of 101 answered requests failed")
    # a refusal (429: a rate limit, an admission control) is the policy's decision, not a failure
    half = summarize(rows(none=5, http_429=5), n_planned=10, requested_rate_rps=100.0)
    assert half["n_refused"] == 5 and half["n_errors"] == 0 and half["error_rate"] == 0.0
    assert half["valid"] and exit_status(half) == 0 and "5 refused" in half["valid_reason"]
    assert half["warnings"] and "refused (HTTP 429" in half["warnings"][0]
    loose = summarize(rows(none=9, timeout=1), n_planned=10, requested_rate_rps=100.0, max_error_rate=0.1)
    assert loose["valid"] and not loose["error_rate_exceeded"] and exit_status(loose) == 0
    # requests the client itself stopped are not the server's errors
    stopped = summarize(rows(none=2, interrupted=8), n_planned=20, requested_rate_rps=100.0,
                        interrupted=True, stopped_by="SIGHUP")
    assert stopped["n_errors"] == 0 and stopped["error_rate"] == 0.0 and not stopped["valid"]
    assert exit_status(stopped) == 129
    nothing = summarize(rows(connect_error=4), n_planned=4, requested_rate_rps=100.0)
    assert nothing["error_rate"] == 1.0 and nothing["error_rate_exceeded"] and not nothing["valid"]
    assert exit_status(nothing) == 1 and nothing["valid_reason"].startswith("no request succeeded")
    assert summarize([], n_planned=0, requested_rate_rps=None)["error_rate"] is None
    with pytest.raises(ValueError):
        summarize([], n_planned=0, requested_rate_rps=None, max_error_rate=-0.1)
    for name, code in (("SIGHUP", 129), ("SIGINT", 130), ("KeyboardInterrupt", 130), ("SIGQUIT", 131),
                       ("SIGTERM", 143)):
        assert exit_status({"stopped_by": name, "valid": False}) == code
    assert exit_status({"stopped_by": "RuntimeError", "valid": False}) == 1


def test_error_messages_first_distinct_with_counts():
    recs = [("none", None), ("http_4xx", "HTTP 400: a"), ("http_5xx", "HTTP 503:  b\n"), ("http_4xx", "HTTP 400: a"),
            ("interrupted", "stopped"), ("http_5xx", "HTTP 503: b"), ("timeout", None)]
    assert error_messages(recs) == [{"error_class": "http_4xx", "message": "HTTP 400: a", "count": 2},
                                    {"error_class": "http_5xx", "message": "HTTP 503: b", "count": 2},
                                    {"error_class": "timeout", "message": "(no message)", "count": 1}]
    assert len(error_messages([("http_4xx", f"m{i}") for i in range(9)])) == 5


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
    for code in ("0 ", "1 ", "129", "130", "131", "143", "--max-error-rate"):
        assert code in text
    assert "--workers" in text and "CPU count" in text
