"""What the gateway says (issue 26, item 3): one JSON access-log line per request (never a key or
a prompt), a warning when an upstream turns unhealthy and when it is healthy again, a start
against an upstream that does not answer (warned, retried until it does)."""
import json
import socket
import time

from fairlib.gateway import GatewayProcess
from fairlib.serve import ServerProcess
from test_gateway import FID, assert_idle, completion, gateway, post, upstream  # noqa: F401
from test_gateway_faults import wait_for


def test_one_access_log_line_per_request_without_keys_or_prompts(upstream, tmp_path):
    log = tmp_path / "access.jsonl"
    f = tmp_path / "tenants.toml"
    f.write_text('[[tenant]]\nname = "alice"\napi_key = "sk-alice-secret"\n')
    gw = gateway([upstream], tenants=str(f), access_log=str(log))
    key = {"Authorization": "Bearer sk-alice-secret"}
    try:
        assert post(gw.base_url, "/completions", completion(5, prompt="zebra quagga okapi"), key)[0] == 200
        assert post(gw.base_url, "/completions", completion(3, stream=False), key)[0] == 200
        assert post(gw.base_url, "/completions", {"model": "sim-model"}, key)[0] == 400
        assert post(gw.base_url, "/completions", completion(3), {FID: "alice"})[0] == 401
        assert post(gw.base_url, "/completions", completion(3), {**key, FID: "bob"})[0] == 403
        assert_idle(gw)
    finally:
        gw.stop()
    text = log.read_text()
    recs = [json.loads(x) for x in text.splitlines()]
    assert [r["status"] for r in recs] == [200, 200, 400, 401, 403]
    s, j, bad, unauth, forged = recs
    assert s["tenant"] == "alice" and s["upstream"] == upstream.base_url and s["stream"] is True
    assert s["output_tokens"] == 5 and s["prompt_tokens"] == 3 and 0 < s["ttft_s"] <= s["duration_s"]
    assert 0 <= s["queue_wait_s"] <= s["ttft_s"] and s["reason"] is None and s["error"] is None
    assert j["stream"] is False and j["output_tokens"] == 3
    assert bad["reason"] == "bad_request" and bad["upstream"] is None and bad["output_tokens"] is None
    assert unauth["reason"] == "unauthorized" and unauth["tenant"] is None
    assert forged["reason"] == "tenant_mismatch"
    assert s["time"].endswith("Z") and "T" in s["time"]
    assert "sk-alice" not in text and "zebra" not in text and "quagga" not in text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _events(gw, name):
    return [json.loads(x.split(": ", 1)[1]) for x in gw.log
            if x.startswith("fairlib gateway: {") and f'"event":"{name}"' in x]


def test_a_dead_upstream_at_start_is_warned_retried_and_taken_when_it_answers():
    port = _free_port()
    eng = ["--iter-base-ms", "5", "--model", "sim-model", "--port", str(port)]
    with GatewayProcess(["--upstream", f"http://127.0.0.1:{port}/v1", "--health-interval-s", "0.2",
                         "--access-log", "off"]) as gw:
        warned = wait_for(lambda: _events(gw, "upstream_unhealthy"), "the warning")
        assert warned[0]["level"] == "warning" and "at the gateway's start" in warned[0]["message"]
        s, h, _ = post(gw.base_url, "/completions", completion(2), {FID: "t"})
        assert s == 503 and h["x-fairlib-rejected-reason"] == "no_upstream"
        with ServerProcess(eng) as srv:
            assert srv.port == port
            wait_for(lambda: _events(gw, "upstream_healthy"), "the upstream back")
            assert post(gw.base_url, "/completions", completion(2), {FID: "t"})[0] == 200
            t0 = time.monotonic()
        wait_for(lambda: len(_events(gw, "upstream_unhealthy")) >= 2, "the second warning")
        assert time.monotonic() - t0 < 10
