"""The open-loop runner against a tiny local test server (127.0.0.1, a free port).

(a) the fixture streams replayed with known delays give the known TTFT / E2E / token counts;
(b) every failure mode becomes a record with the right error class and the run completes;
(c) the schedule is kept when the server is slow, records are written while the run goes, and
Ctrl-C leaves a valid, interrupted run directory.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from fairlib.client import EndpointConfig, build_schedule, load_records, load_summary, run
from fairlib.serve.replay import ByTenant, Hang, HttpError, Replay, ReplayServer, Synth, load_frames, sse
from fairlib.records.rundir import read_jsonl

FIX = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parents[1]

FIRST_S, GAP_S = 0.15, 0.03  # fixture replay: first token frame, then one every GAP_S
TOKEN_FRAMES = {  # which frames of each fixture carry tokens (by reading the files)
    "vllm_completions.sse": ([1, 2, 3, 4, 5, 7, 8], 8, "completions"),
    "vllm_completions_token_ids.sse": ([0, 1, 2, 3, 4, 5, 6], 8, "completions"),
    "vllm_chat.sse": ([1, 2, 3, 5, 6, 7, 8], 8, "chat"),
    "llamacpp_completions.sse": ([0, 1, 2, 3, 4, 5], 6, "completions"),
    "llamacpp_chat.sse": ([1, 2, 3, 4, 5, 6], 6, "chat"),
}


def replay_of(name):
    frames = load_frames(FIX / name)
    tok = set(TOKEN_FRAMES[name][0])
    offsets, j = [], 0
    for k in range(len(frames)):
        if k in tok:
            offsets.append(FIRST_S + GAP_S * j)
            j += 1
        else:
            offsets.append(offsets[-1] if offsets else 0.05)
    return Replay(frames, offsets)


ERROR_FRAME = sse({"error": {"object": "error", "message": "engine died", "type": "InternalServerError",
                             "param": None, "code": 500}})
NO_END = [sse({"id": "c", "object": "text_completion", "created": 1, "model": "m",
               "choices": [{"index": 0, "text": " a", "logprobs": None, "finish_reason": None}]})]

FAILURES = {  # route -> (behaviour, error class)
    "e400": (HttpError(400, "bad request"), "http_4xx"),
    "e429": (HttpError(429, "queue full"), "http_429"),
    "e500": (HttpError(500), "http_5xx"),
    "hang": (Hang(30), "timeout"),
    "abort": (Synth(itl_s=0.005, abort_after=2), "disconnect"),
    "noend": (Replay(NO_END), "disconnect"),
    "garbage": (Synth(garbage_after=2), "malformed_sse"),
    "short": (Synth(n_tokens=3), "short_stream"),
    "instream": (Replay([NO_END[0], ERROR_FRAME, sse("[DONE]")]), "http_5xx"),
    "ok": (Synth(ttft_s=0.01, itl_s=0.002), "none"),
}


@pytest.fixture(scope="module")
def server():
    routes = {f"fx_{n.split('.')[0]}": replay_of(n) for n in TOKEN_FRAMES}
    routes.update({k: v[0] for k, v in FAILURES.items()})
    routes["mixed"] = ByTenant({k: v[0] for k, v in FAILURES.items()})
    routes["incr"] = ByTenant({"fast": Synth(itl_s=0.001), "slow": Synth(ttft_s=2.0)})
    routes["metrics"] = Synth(ttft_s=0.05, itl_s=0.01)
    with ReplayServer(routes) as srv:
        yield srv


def schedule(n=1, gap_ms=10.0, tenants=None, api="completions", out=8, prompt=16, seed=0):
    tenants = tenants or ["t"]
    df = pd.DataFrame({"arrival_ms": [i * gap_ms for i in range(n)], "tenant": [i % len(tenants) for i in range(n)],
                       "prompt_tokens": prompt, "output_tokens": out, "priority": 0})
    return build_schedule(df, seed=seed, api=api, tenant_names=tenants)


def go(sched, base, path, **kw):
    kw.setdefault("scrape_metrics", False)
    kw.setdefault("collect_env", False)
    kw.setdefault("start_delay_s", 0.05)
    cfg = EndpointConfig(base_url=base, model="m", timeout_s=kw.pop("timeout_s", 5.0))
    summary = run(sched, cfg, path, **kw)
    return summary, load_records(path)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- (a) fixtures replayed with known delays ---------------------------------------------------

@pytest.mark.parametrize("name", sorted(TOKEN_FRAMES))
def test_fixture_replay_timings(server, tmp_path, name):
    frames_idx, total, api = TOKEN_FRAMES[name]
    n_chunks = len(frames_idx)
    summary, df = go(schedule(api=api, out=total), server.url(f"fx_{name.split('.')[0]}"), tmp_path / "r")
    r = df.iloc[0]
    assert r.error_class == "none", r.error_message
    assert r.completion_tokens == total and r.tokens_source == "usage" and r.finish_reason == "length"
    assert r.n_token_chunks == n_chunks and len(r.chunk_times_s) == n_chunks
    # never earlier than the server's delays; later only by scheduling noise (a busy 2-core box)
    assert FIRST_S - 1e-3 <= r.ttft_s <= FIRST_S + 0.1
    e2e = FIRST_S + GAP_S * (n_chunks - 1)
    assert e2e - 1e-3 <= r.e2e_s <= e2e + 0.1
    gaps = pd.Series(r.chunk_times_s).diff().dropna()
    assert len(gaps) == n_chunks - 1 and abs(gaps.median() - GAP_S) < 0.01
    assert r.tpot_s == pytest.approx((r.e2e_s - r.ttft_s) / (total - 1))
    assert r.chunk_times_s[0] == pytest.approx(r.actual_send_s + r.ttft_s)
    if name.startswith("llamacpp"):
        assert r.server_timings["predicted_n"] == total
    if "token_ids" in name:
        assert list(r.chunk_tokens) == [1, 1, 2, 1, 1, 1, 1]
    assert summary["n_ok"] == 1 and summary["valid"]


# --- (b) every failure mode is a record ---------------------------------------------------------

@pytest.mark.parametrize("route", sorted(FAILURES))
def test_failure_mode_becomes_a_record(server, tmp_path, route):
    cls = FAILURES[route][1]
    summary, df = go(schedule(n=2), server.url(route), tmp_path / "r", timeout_s=0.5)
    assert list(df.error_class) == [cls, cls], list(df.error_message)
    assert summary["error_counts"][cls] == 2 and summary["n_records"] == 2
    if cls != "none":
        assert df.error_message.notna().all()
        assert df.e2e_s.isna().all() or cls == "short_stream"
    if cls.startswith("http_4") or cls in ("http_429",) or route == "e500":
        assert set(df.http_status) == {int(route[1:])}
    if route == "short":
        assert (df.completion_tokens == 3).all() and df.e2e_s.notna().all()
    if route in ("abort", "garbage"):
        assert df.ttft_s.notna().all() and (df.n_token_chunks == 2).all()  # partial streams kept


def test_connection_refused(tmp_path):
    summary, df = go(schedule(n=3), f"http://127.0.0.1:{free_port()}/v1", tmp_path / "r")
    assert list(df.error_class) == ["connect_error"] * 3
    assert df.http_status.isna().all() and summary["n_sent"] == 3


def test_all_failure_modes_in_one_run(server, tmp_path):
    names = sorted(FAILURES)
    sched = schedule(n=3 * len(names), gap_ms=5, tenants=names)
    summary, df = go(sched, server.url("mixed"), tmp_path / "r", timeout_s=0.7)
    assert len(df) == len(sched) and summary["n_records"] == len(sched)
    for name, (_, cls) in FAILURES.items():
        assert set(df[df.tenant_name == name].error_class) == {cls}, name
    assert summary["error_counts"]["timeout"] == 3 and not summary["interrupted"]


# --- (c) open loop, incremental records, Ctrl-C -------------------------------------------------

def test_slow_server_does_not_delay_sends(tmp_path):
    """100 requests 10 ms apart; each takes ~0.9 s, so ~90 are in flight: sends keep the schedule."""
    with ReplayServer({"slow": Synth(ttft_s=0.3, itl_s=0.02)}, process=True) as srv:
        sched = schedule(n=100, gap_ms=10.0, out=30)
        summary, df = go(sched, srv.url("slow"), tmp_path / "r")
    assert summary["n_ok"] == 100
    lag = summary["schedule_lag_ms"]
    # Each response takes >= 0.9 s: a sender that waited on any would lag by seconds and send at
    # ~1 req/s. Margins allow for a busy shared 2-core box (where `valid` may rightly be false).
    msg = (lag, list(df.send_lag_ms.round(1)))
    assert lag["p50"] < 5.0 and lag["p90"] < 25.0 and lag["max"] < 300.0, msg
    assert summary["valid"] == (lag["p99"] <= summary["lag_threshold_ms"])
    assert summary["achieved_rate_rps"] == pytest.approx(summary["requested_rate_rps"], rel=0.1), msg
    assert df.ttft_s.min() >= 0.3 and df.e2e_s.min() >= 0.3 + 29 * 0.02
    in_flight = ((df.actual_send_s.values[:, None] >= df.actual_send_s.values[None, :])
                 & (df.actual_send_s.values[:, None] < df.last_token_s.values[None, :])).sum(axis=1)
    assert in_flight.max() >= 50  # truly open loop: many requests overlapped


def test_records_written_while_running(server, tmp_path):
    sched = schedule(n=6, gap_ms=20, tenants=["fast", "fast", "fast", "fast", "fast", "slow"], out=4)
    path = tmp_path / "r"
    box = {}
    th = threading.Thread(target=lambda: box.update(s=go(sched, server.url("incr"), path)))
    th.start()
    seen = []
    deadline = time.time() + 10
    while th.is_alive() and time.time() < deadline:
        rec = path / "records.jsonl"
        if rec.exists():
            seen = read_jsonl(rec)
            if len(seen) >= 5:
                break
        time.sleep(0.02)
    assert th.is_alive(), "the run ended before the fast records were seen"
    assert not (path / "summary.json").exists()
    assert sorted(r["tenant_name"] for r in seen) == ["fast"] * 5
    th.join(15)
    summary, df = box["s"]
    assert summary["n_ok"] == 6 and len(df) == 6


SIGINT_SCRIPT = textwrap.dedent("""
    import sys
    import pandas as pd
    from fairlib.client import EndpointConfig, build_schedule, run

    if __name__ == "__main__":
        base, out, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
        df = pd.DataFrame({"arrival_ms": [0, 10, 20, 30, 40, 60000, 61000],
                           "tenant": [0, 1, 0, 1, 0, 1, 1], "prompt_tokens": 8, "output_tokens": 4, "priority": 0})
        sched = build_schedule(df, seed=0, tenant_names=["fast", "slow"])
        s = run(sched, EndpointConfig(base_url=base, model="m", timeout_s=120), out, workers=workers,
                collect_env=False, metrics_interval_s=0.2, start_delay_s=0.1)
        print("SUMMARY", s["interrupted"], s["n_records"], flush=True)
""")


@pytest.mark.parametrize("workers", [1, 2])
def test_sigint_stops_cleanly(tmp_path, workers):
    routes = {"sig": ByTenant({"fast": Synth(itl_s=0.001), "slow": Hang(60)})}
    script = tmp_path / "client.py"
    script.write_text(SIGINT_SCRIPT)
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with ReplayServer(routes) as srv:
        proc = subprocess.Popen([sys.executable, str(script), srv.url("sig"), str(out), str(workers)],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 30
            while time.time() < deadline:
                rec = out / "records.jsonl"
                if rec.exists() and len(read_jsonl(rec)) >= 3:  # the fast ones are done
                    break
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.05)
            time.sleep(0.2)
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, stderr
    assert "SUMMARY True 5" in stdout, (stdout, stderr)
    summary = load_summary(out)
    assert summary["interrupted"] is True
    assert summary["n_planned"] == 7 and summary["n_sent"] == 5 and summary["n_not_sent"] == 2
    assert summary["error_counts"]["interrupted"] == 2 and summary["error_counts"]["none"] == 3
    lines = (out / "records.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]  # every line is valid JSON
    assert sorted(r["request_id"] for r in recs) == [0, 1, 2, 3, 4]
    assert {r["tenant_name"] for r in recs if r["error_class"] == "interrupted"} == {"slow"}
    assert {r["worker"] for r in recs} == ({0} if workers == 1 else {0, 1})
    assert (out / "config.json").exists() and (out / "server_metrics.jsonl").exists()


def test_workers_shard_and_share_one_clock(tmp_path):
    with ReplayServer({"ok": Synth(ttft_s=0.01, itl_s=0.002)}, process=True) as srv:
        sched = schedule(n=40, gap_ms=10.0, tenants=["a", "b", "c"])
        summary, df = go(sched, srv.url("ok"), tmp_path / "r", workers=2, start_delay_s=0.2)
    assert summary["workers"] == 2 and summary["n_ok"] == 40 and not summary["worker_failures"]
    assert list(df.request_id) == list(range(40))
    assert set(df[df.request_id % 2 == 0].worker) == {0} and set(df[df.request_id % 2 == 1].worker) == {1}
    # both processes send on one shared start time: every lag is small, whichever worker sent it
    assert df.send_lag_ms.abs().max() < 300.0 and summary["schedule_lag_ms"]["p50"] < 5.0


def test_metrics_env_and_config(server, tmp_path):
    sched = schedule(n=5, gap_ms=100, out=20)
    summary, df = go(sched, server.url("metrics"), tmp_path / "r", scrape_metrics=True, collect_env=True,
                     metrics_interval_s=0.1, config_extra={"scenario": "test"}, lag_threshold_ms=7.5)
    rows = read_jsonl(tmp_path / "r" / "server_metrics.jsonl")
    assert len(rows) >= 4 and summary["server_metrics"]["samples"] == len(rows)
    assert all(k.startswith("vllm:") for r in rows for k in r["metrics"])
    assert max(r["metrics"]['vllm:num_requests_running{engine="0",model_name="replay-model"}'] for r in rows) >= 1
    env = json.loads((tmp_path / "r" / "env.json").read_text())
    assert env["endpoint"]["models"]["body"]["data"][0]["id"] == "replay-model"
    assert env["endpoint"]["server_version"] == "fairlib-replay" and env["packages"]["aiohttp"]
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert cfg["schedule"]["sha256"] == sched.sha256() and cfg["extra"] == {"scenario": "test"}
    assert cfg["endpoint"]["base_url"] == server.url("metrics") and cfg["read_bufsize"] == 2 ** 20
    assert summary["lag_threshold_ms"] == 7.5
    sent = [r for r in server.state["requests"] if r["path"] == "/metrics/v1/completions"]
    assert len(sent) == 5 and all(r["headers"]["X-Tenant"] == "t" for r in sent)
    assert all(r["body"]["ignore_eos"] and r["body"]["stream_options"] == {"include_usage": True} for r in sent)


def test_existing_run_dir_is_not_overwritten(server, tmp_path):
    go(schedule(), server.url("ok"), tmp_path / "r")
    with pytest.raises(FileExistsError):
        go(schedule(), server.url("ok"), tmp_path / "r")
    summary, df = go(schedule(), server.url("ok"), tmp_path / "r", overwrite=True)
    assert len(df) == 1


def test_run_inside_a_running_event_loop(server, tmp_path):
    """As in a notebook: ``run`` is synchronous even when the caller's thread runs a loop."""
    import asyncio

    async def notebook_cell():
        return go(list(schedule(n=3)), server.url("ok"), tmp_path / "r")

    summary, df = asyncio.run(notebook_cell())
    assert summary["n_ok"] == 3 and len(df) == 3
