"""The faults of issue 26 (item 6) that a fault harness found on main, each against ``fairlib
serve`` (a child process, so that it can be killed or frozen) or its thread: a broken upstream,
a frozen one, a lost replica, cross-site admin POSTs, out-of-range numbers, the client's own
priority, the event log's growth. Each test fails on the gateway before the fix.
"""
import json
import os
from datetime import datetime
import signal
import threading
import time
import urllib.request

import pytest

from fairlib.gateway import GatewayConfig
from fairlib.protocol.sse import DONE
from fairlib.serve import ServerProcess
from test_gateway import (FID, _opener, _order_of_admission, assert_idle, completion, gateway, payloads, post,  # noqa: F401
                          upstream)
from test_gateway_identity import metric_value

SLOW = ["--iter-base-ms", "20", "--iter-slope-ms", "0", "--max-batch", "4", "--model", "sim-model"]


def wait_for(fn, what, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def streaming(gw, out, key, n=400, stream=True):
    out[key] = post(gw.base_url, "/completions", completion(n, stream=stream), {FID: key})


def tokens_flowing(gw, k=2):
    st = gw.state()
    return st["in_flight"] >= k and all(st["tenants"].get(t, {}).get("output_tokens", 0) > 0 for t in ("s", "j"))


def test_a_broken_upstream_never_gives_a_complete_looking_answer():
    """The upstream dies mid-answer (SIGKILL): the client that asked for JSON gets 502 (on main:
    200 with finish_reason null), the streaming one an error event and no [DONE]; both counted,
    the upstream taken out at once (health checks every 30 s: only the failed connection can)."""
    with ServerProcess(SLOW) as srv:
        gw = gateway([srv], health_interval_s=30.0)
        try:
            out = {}
            ths = [threading.Thread(target=streaming, args=(gw, out, k, 400, k == "s")) for k in ("s", "j")]
            for t in ths:
                t.start()
            wait_for(lambda: tokens_flowing(gw), "both requests streaming")
            os.kill(srv.proc.pid, signal.SIGKILL)
            for t in ths:
                t.join(30)
            s, h, raw = out["j"]
            assert s == 502 and h["x-fairlib-rejected-reason"] == "upstream_broken", (s, raw[:300])
            assert "broke the answer" in json.loads(raw)["error"]["message"]
            s, _, raw = out["s"]
            ev = payloads(raw)
            assert s == 200 and ev[-1] is not DONE and ev[-1]["error"]["code"] == 502
            got_tokens = [e for e in ev if isinstance(e, dict) and e.get("choices")]
            assert got_tokens                                                       # tokens came before
            st = assert_idle(gw)
            assert st["tenants"]["s"]["output_tokens"] == len(got_tokens)           # charged what it used
            assert st["upstreams"][0]["healthy"] is False and st["upstreams"][0]["broken"] == 2
            assert metric_value(gw.metrics(), "fairlib_gateway_rejected", 'reason="upstream_broken"') == 2
        finally:
            gw.stop()


def test_a_frozen_upstream_ends_the_stream_at_the_idle_timeout_and_frees_the_slot():
    """SIGSTOP mid-stream: after --upstream-idle-timeout-s (0.5 s) the stream ends with an error
    event, the slot is free (on main: it hung for the 600 s request timeout)."""
    with ServerProcess(SLOW) as srv:
        gw = gateway([srv], upstream_idle_timeout_s=0.5, health_interval_s=30.0)
        try:
            out = {}
            t = threading.Thread(target=streaming, args=(gw, out, "s", 2000))
            t.start()
            wait_for(lambda: gw.state()["tenants"].get("s", {}).get("output_tokens", 0) > 0, "tokens")
            os.kill(srv.proc.pid, signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                t.join(20)
                took = time.monotonic() - t0
                s, _, raw = out["s"]
                ev = payloads(raw)
                assert s == 200 and ev[-1] is not DONE and "--upstream-idle-timeout-s" in ev[-1]["error"]["message"]
                assert 0.4 < took < 5.0, took
                st = assert_idle(gw)
                assert st["upstreams"][0]["healthy"] is False
            finally:
                os.kill(srv.proc.pid, signal.SIGCONT)
        finally:
            gw.stop()


def test_a_lost_replica_is_retried_once_elsewhere_and_avoided():
    """Two replicas, the first killed while idle: the request sent to it fails before its first
    byte and goes to the other (200, not 502); the dead one is out at once and gets nothing more
    (health checks every 30 s: on main it kept being chosen); put back when a check passes."""
    with ServerProcess(SLOW) as a, ServerProcess(SLOW) as b:
        gw = gateway([a, b], health_interval_s=30.0)
        try:
            assert post(gw.base_url, "/completions", completion(2, stream=False), {FID: "t"})[0] == 200
            os.kill(a.proc.pid, signal.SIGKILL)
            a.proc.wait(10)
            got = [post(gw.base_url, "/completions", completion(3, stream=k % 2 == 0), {FID: "t"}) for k in range(6)]
            assert [g[0] for g in got] == [200] * 6, [g[2][:200] for g in got]
            st = assert_idle(gw)
            ua, ub = st["upstreams"]
            assert ua["healthy"] is False and ua["failures"] == 1 and ua["retried"] == 1
            assert ua["dispatched"] == 2 and ub["dispatched"] == 6
            assert st["tenants"]["t"]["finished"] == 7 and st["tenants"]["t"]["output_tokens"] == 2 + 6 * 3
        finally:
            gw.stop()


def test_no_retry_without_another_upstream():
    """One replica, killed after its first health check passed: 502 (upstream_failed), no retry."""
    with ServerProcess(SLOW) as srv:
        gw = gateway([srv], health_interval_s=30.0)
        try:
            assert post(gw.base_url, "/completions", completion(2), {FID: "t"})[0] == 200
            os.kill(srv.proc.pid, signal.SIGKILL)
            srv.proc.wait(10)
            s, h, raw = post(gw.base_url, "/completions", completion(2), {FID: "t"})
            assert s == 502 and h["x-fairlib-rejected-reason"] == "upstream_failed", raw[:300]
            st = assert_idle(gw)
            assert st["upstreams"][0]["healthy"] is False and st["upstreams"][0]["retried"] == 0
            s, h, _ = post(gw.base_url, "/completions", completion(2), {FID: "t"})
            assert s == 503 and h["x-fairlib-rejected-reason"] == "no_upstream"     # out until a check passes
        finally:
            gw.stop()


def _admin_post(gw, path, body: bytes, headers: dict):
    req = urllib.request.Request(gw.root + path, data=body, method="POST", headers=headers)
    try:
        with _opener.open(req, timeout=10) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)


def test_admin_posts_need_json_and_refuse_a_foreign_origin(upstream):
    gw = gateway([upstream])
    try:
        body = json.dumps({"upstream": 0, "drained": True}).encode()
        # the cross-site form post of the fault harness: text/plain, a foreign Origin
        s, h = _admin_post(gw, "/admin/upstreams", body, {"Content-Type": "text/plain",
                                                         "Origin": "http://evil.example"})
        assert s == 415 and h["x-fairlib-rejected-reason"] == "admin_content_type"
        s, h = _admin_post(gw, "/admin/upstreams", body, {"Content-Type": "application/json",
                                                         "Origin": "http://evil.example"})
        assert s == 403 and h["x-fairlib-rejected-reason"] == "admin_foreign_origin"
        s, _ = _admin_post(gw, "/admin/upstreams", body, {"Content-Type": "application/json",
                                                         "Sec-Fetch-Site": "cross-site"})
        assert s == 403
        assert gw.state()["upstreams"][0]["drained"] is False          # none of them took effect
        s, _ = _admin_post(gw, "/admin/upstreams", body, {"Content-Type": "application/json",
                                                         "Origin": f"http://127.0.0.1:{gw.port}"})
        assert s == 200 and gw.state()["upstreams"][0]["drained"] is True
        assert gw.drain(0, False)["upstreams"][0]["drained"] is False    # the client's own POST (no Origin)
    finally:
        gw.stop()


def test_numbers_out_of_range_are_400_and_every_own_answer_names_its_reason(upstream):
    gw = gateway([upstream])
    try:
        for field in ("max_tokens", "est_output_tokens"):
            s, h, raw = post(gw.base_url, "/completions", {**completion(2), field: 2 ** 63}, {FID: "a"})
            assert s == 400 and json.loads(raw)["error"]["param"] == field, raw[:300]
            assert h["x-fairlib-rejected-reason"] == "bad_request"
        s, h, raw = post(gw.base_url, "/completions", completion(2), {FID: "a", "x-fairlib-est-output-tokens":
                                                                      str(2 ** 64)})
        assert s == 400 and h["x-fairlib-rejected-reason"] == "bad_request"
        s, h, _ = post(gw.base_url, "/completions", b"{not json", {FID: "a"})
        assert s == 400 and h["x-fairlib-rejected-reason"] == "bad_request"
        s, h, _ = post(gw.base_url, "/nowhere", completion(2))
        assert s == 404 and h["x-fairlib-rejected-reason"] == "no_route"
        s, h, _ = post(gw.root, "/admin/policy", {"policy": "nope"})
        assert s == 400 and h["x-fairlib-rejected-reason"] == "bad_request"
        assert post(gw.base_url, "/completions", completion(2), {FID: "a"})[0] == 200
        assert assert_idle(gw)["tenants"]["a"]["finished"] == 1
    finally:
        gw.stop()


def test_the_priority_is_the_tenants_files_never_the_bodys(upstream, tmp_path):
    """bronze (priority 1) claims priority -10 in its bodies: gold (0) still goes first."""
    f = tmp_path / "tenants.toml"
    f.write_text('[[tenant]]\nname = "gold"\npriority = 0\n[[tenant]]\nname = "bronze"\npriority = 1\n')
    gw = gateway([upstream], tenants=str(f), policy="priority", max_inflight=1)
    try:
        order = _order_of_admission(gw, [(completion(2, priority=-10), {FID: "bronze"}),
                                         (completion(2, priority=-10), {FID: "bronze"}),
                                         (completion(2, priority=5), {FID: "gold"})],
                                    (completion(120), {FID: "bronze"}))
        assert order == [0, 3, 1, 2]
    finally:
        gw.stop()


def test_the_event_log_is_off_by_default_and_streamed(upstream):
    assert GatewayConfig(upstreams=("http://127.0.0.1:1/v1",)).record_events is False
    gw = gateway([upstream], record_events=False)
    try:
        assert post(gw.base_url, "/completions", completion(3), {FID: "a"})[0] == 200
        assert_idle(gw)
        assert gw.events()[1] == [] and gw.call(lambda: len(gw.gateway.gate.log)) == 0
    finally:
        gw.stop()
    gw = gateway([upstream], record_events=True)
    try:
        for _ in range(3):
            assert post(gw.base_url, "/completions", completion(40), {FID: "a"})[0] == 200
        assert_idle(gw)
        with _opener.open(gw.root + "/admin/events", timeout=10) as r:
            assert r.headers["Transfer-Encoding"] == "chunked"
            lines = r.read().decode().splitlines()
        want = gw.call(lambda: json.loads(json.dumps(gw.gateway.gate.log)))
        assert len(want) > 40 and [json.loads(x) for x in lines[1:]] == want
    finally:
        gw.stop()


def test_an_upstream_url_without_v1_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match=r"not an OpenAI base .*use http://127\.0\.0\.1:8000/v1$"):
        GatewayConfig(upstreams=("http://127.0.0.1:8000",))
    with pytest.raises(ValueError, match=r"use http://h:1/openai/v1$"):
        GatewayConfig(upstreams=("http://h:1/openai/",))


@pytest.mark.parametrize("how", ["timeout", "second signal"])
def test_a_cut_drain_exits_on_time_saying_what_was_in_flight(how):
    """--drain-timeout-s 1: the exit comes 1 s after the signal (on main: 2 + 2.4 s for 2 s); a
    second signal: at once (on main: 2.4 s); both within 0.2 s on the gateway's own clock (from
    outside within 1.5 s: the machine may be loaded). Lines at the drain's start, its cut and the
    exit say what was in flight."""
    from fairlib.gateway import GatewayProcess
    drain = 1.0 if how == "timeout" else 60.0
    eng = ["--iter-base-ms", "25", "--iter-slope-ms", "0", "--max-batch", "1", "--model", "sim-model"]
    with ServerProcess(eng) as srv, GatewayProcess(["--upstream", srv.base_url, "--max-inflight", "1",
                                                    "--drain-timeout-s", str(drain), "--access-log", "off"]) as gw:
        th = threading.Thread(target=lambda: _swallow(post, gw.base_url, "/completions", completion(400), {FID: "t"}),
                              daemon=True)
        th.start()
        wait_for(lambda: gw.state()["in_flight"] >= 1, "a request in flight")
        t0 = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        if how == "second signal":
            wait_for(lambda: gw.state()["stopping"], "the drain")
            t0 = time.monotonic()
            gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(20) == 1
        took = time.monotonic() - t0
        want = drain if how == "timeout" else 0.0
        assert want <= took < want + 1.5, took          # from outside, on a machine that may be loaded
        lines = [json.loads(x.split(": ", 1)[1]) for x in gw.log if x.startswith("fairlib gateway: {")]
        ev = {x["event"]: x for x in lines}
        # its own clock (issue 26: exact to 0.2 s; measured 1.001-1.002 s and a cut-to-exit of
        # milliseconds): the cut comes at the timeout, the exit right after the cut
        stamp = {k: datetime.fromisoformat(v["time"].replace("Z", "+00:00")) for k, v in ev.items()}
        if how == "timeout":
            assert drain <= (stamp["drain_cut"] - stamp["drain_start"]).total_seconds() < drain + 0.2
        assert 0 <= (stamp["exit"] - stamp["drain_cut"]).total_seconds() < 0.2
        assert ev["drain_start"]["in_flight"] == 1 and ev["drain_cut"]["in_flight"] == 1
        assert ev["exit"]["stopped_in_flight"] == 1


def _swallow(fn, *args):
    try:
        fn(*args)
    except Exception:       # noqa: BLE001 - the cut stream
        pass


def _status_mb(pid: int, key: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    raise KeyError(key)


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's /proc/PID/clear_refs")
def test_a_large_body_costs_about_three_times_its_size():
    """A 10 MB prompt: the gateway's peak RSS grows by ~3x the body (on main ~28x: 280 MB), and the
    upstream gets the whole prompt (its own 400 names the prompt's length: 1,941,805 words)."""
    from fairlib.gateway import GatewayProcess
    with ServerProcess(["--iter-base-ms", "2", "--model", "sim-model"]) as srv, \
            GatewayProcess(["--upstream", srv.base_url, "--access-log", "off"]) as gw:
        assert post(gw.base_url, "/completions", completion(2), {FID: "t"})[0] == 200
        words = 10 * 2 ** 20 // 27 * 5
        body = json.dumps(completion(1, stream=False, prompt="lorem ipsum dolor sit amet " * (words // 5))).encode()
        with open(f"/proc/{gw.proc.pid}/clear_refs", "w") as f:
            f.write("5")                # the peak RSS starts again from the current RSS
        before = _status_mb(gw.proc.pid, "VmRSS")
        s, _, raw = post(gw.base_url, "/completions", body, {FID: "t"}, timeout=300)
        grew = _status_mb(gw.proc.pid, "VmHWM") - before
        assert s == 400 and f"your prompt has {words} tokens" in json.loads(raw)["error"]["message"]
        assert grew < 3.5 * len(body) / 2 ** 20, grew


def test_word_count_is_split_without_the_list():
    import random
    from fairlib.protocol.parse import word_count
    rng = random.Random(7)
    for _ in range(200):
        t = "".join(rng.choice("ab \n\t") for _ in range(rng.randint(0, 500)))
        for piece in (1, 2, 3, 64):
            assert word_count(t, piece) == len(t.split()), (t, piece)


def test_a_json_answers_odd_usage_is_charged_as_one_token():
    """An upstream's JSON answer (it ignored ``stream``) is charged its ``usage.completion_tokens``;
    a count that is no integer >= 1 is one token: the step the gateway hands the policy unchecked
    never carries fewer than one."""
    from fairlib.protocol.parse import answer_tokens
    assert answer_tokens({"usage": {"completion_tokens": 7}}) == 7
    for odd in (-3, 0, 0.5, 2.0, True, "7", None, [7]):
        assert answer_tokens({"usage": {"completion_tokens": odd}}) == 1, odd
    assert answer_tokens({"usage": None}) == answer_tokens({}) == answer_tokens([1]) == answer_tokens(None) == 1


def test_one_tenants_long_streams_cannot_take_every_slot(upstream):
    """vtc, 4 slots: a tenant with 6 long streams holds at most 3 (--tenant-max-share 0.9: the
    others parked, counted by the policy as running); another tenant's request goes at once into
    the slot left (on main it waited for a long stream to end)."""
    gw = gateway([upstream], policy="vtc", max_inflight=4)
    try:
        out = {}
        ths = [threading.Thread(target=lambda i=i: out.__setitem__(i, post(gw.base_url, "/completions",
                                                                           completion(600), {FID: "hog"})))
               for i in range(6)]
        for t in ths:
            t.start()
        st = wait_for(lambda: (lambda s: s if s["upstreams"][0]["in_flight"] == 3 and s["parked"] >= 1
                               and s["waiting"] + s["parked"] == 3 and s["tenants"]["hog"]["output_tokens"] > 0
                               else None)(gw.state()), "3 running, the rest parked or waiting")
        assert st["tenant_max_inflight"] == 3 and st["in_flight"] == 3 + st["parked"]
        t0 = time.monotonic()
        s, _, raw = post(gw.base_url, "/completions", completion(2, stream=False), {FID: "victim"})
        took = time.monotonic() - t0
        assert s == 200 and took < 1.5, took
        assert gw.state()["tenants"]["hog"]["finished"] == 0         # the long streams still run
        for t in ths:
            t.join(120)
        assert [out[i][0] for i in range(6)] == [200] * 6
        st = assert_idle(gw)
        assert st["tenants"]["hog"]["finished"] == 6 and st["tenants"]["hog"]["output_tokens"] == 3600
        assert st["parked"] == 0
    finally:
        gw.stop()
