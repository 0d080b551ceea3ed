"""The gateway's identity (issue 26, item 1): the API key is the identity; a fairness header names
the tenant only in an open gateway or for a trusted key; tenant ids are checked before they reach
a label; keys come from a file or the environment and are never written out.

Every test runs ``fairlib gateway`` (a thread) in front of ``fairlib serve`` on 127.0.0.1.
"""
import json
import socket
from argparse import ArgumentParser

import pytest

from fairlib.gateway import GatewayConfig, load_tenants
from fairlib.gateway.identity import KEY_ENV, read_key
from fairlib.gateway.server import add_arguments, config_from_args
from fairlib.paths import repo_root
from test_gateway import FID, assert_idle, completion, gateway, post, upstream  # noqa: F401  (a fixture)

TENANTS = ('[[tenant]]\nname = "alice"\napi_key = "sk-alice-secret"\n'
           '[[tenant]]\nname = "bob"\napi_key = "sk-bob-secret"\n'
           '[[tenant]]\nname = "proxy"\napi_key = "sk-proxy-secret"\ntrusted = true\n')
KEYS = ("sk-alice-secret", "sk-bob-secret", "sk-proxy-secret")


def bearer(key):
    return {"Authorization": f"Bearer {key}"}


def metric_value(text: str, *labels: str) -> float:
    """The sum of the samples whose line holds every one of ``labels`` (name parts or label pairs)."""
    total = 0.0
    for line in text.splitlines():
        if line and not line.startswith("#") and all(x in line for x in labels):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_the_key_alone_names_the_tenant(upstream, tmp_path):
    f = tmp_path / "tenants.toml"
    f.write_text(TENANTS)
    gw = gateway([upstream], tenants=str(f))
    try:
        # a bogus key naming bob (the forgery of the issue), no key, a header alone: 401
        for h in ({**bearer("sk-bogus"), FID: "bob"}, {FID: "bob"}, {}):
            s, hd, raw = post(gw.base_url, "/completions", completion(2), h)
            assert s == 401 and json.loads(raw)["error"]["type"] == "AuthenticationError"
            assert hd["x-fairlib-rejected-reason"] == "unauthorized"
        # alice's key naming bob in any of the fairness headers: 403, counted under alice
        for name in ("x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id", "X-Tenant"):
            s, hd, raw = post(gw.base_url, "/completions", completion(2), {**bearer("sk-alice-secret"), name: "bob"})
            assert s == 403 and hd["x-fairlib-rejected-reason"] == "tenant_mismatch"
            assert "alice" in json.loads(raw)["error"]["message"]
        assert metric_value(gw.metrics(), "fairlib_gateway_rejected", 'tenant="alice"',
                            'reason="tenant_mismatch"') == 3
        # alice's key alone, or naming alice: alice
        assert post(gw.base_url, "/completions", completion(2), bearer("sk-alice-secret"))[0] == 200
        assert post(gw.base_url, "/completions", completion(2), {**bearer("sk-alice-secret"), FID: "alice"})[0] == 200
        # the trusted key: its header names the tenant; without one, its own tenant
        assert post(gw.base_url, "/completions", completion(3), {**bearer("sk-proxy-secret"), FID: "bob"})[0] == 200
        assert post(gw.base_url, "/completions", completion(1), bearer("sk-proxy-secret"))[0] == 200
        st = assert_idle(gw)
        assert st["tenants"]["alice"]["finished"] == 2 and st["tenants"]["alice"]["output_tokens"] == 4
        assert st["tenants"]["bob"]["finished"] == 1 and st["tenants"]["bob"]["output_tokens"] == 3
        assert st["tenants"]["proxy"]["finished"] == 1
        # the keys are written nowhere: the state, the event log, the metrics
        head, events = gw.events()
        out = json.dumps(st) + json.dumps(head) + json.dumps(events) + gw.metrics()
        assert not [k for k in KEYS if k in out]
    finally:
        gw.stop()


def test_the_gateway_key_names_the_default_tenant_unless_trusted(upstream, tmp_path):
    gw = gateway([upstream], api_key="sk-shared")
    try:
        assert post(gw.base_url, "/completions", completion(2), {FID: "carol"})[0] == 401
        s, h, _ = post(gw.base_url, "/completions", completion(2), {**bearer("sk-shared"), FID: "carol"})
        assert s == 403 and h["x-fairlib-rejected-reason"] == "tenant_mismatch"
        assert post(gw.base_url, "/completions", completion(2), bearer("sk-shared"))[0] == 200
        st = assert_idle(gw)
        assert list(st["tenants"]) == ["default"] and st["tenants"]["default"]["finished"] == 1
    finally:
        gw.stop()
    gw = gateway([upstream], api_key="sk-shared", trust_api_key=True)
    try:
        assert post(gw.base_url, "/completions", completion(2), {**bearer("sk-shared"), FID: "carol"})[0] == 200
        assert post(gw.base_url, "/completions", completion(2), {**bearer("sk-wrong"), FID: "carol"})[0] == 401
        assert assert_idle(gw)["tenants"]["carol"]["finished"] == 1
    finally:
        gw.stop()
    f = tmp_path / "t.toml"
    f.write_text('[[tenant]]\nname = "x"\n')
    with pytest.raises(ValueError, match="default_tenant"):
        GatewayConfig(upstreams=("http://127.0.0.1:1/v1",), tenants=str(f), api_key="k")


def test_the_sample_tenants_file_loads_and_names_its_tenants(upstream):
    path = repo_root() / "deploy" / "tenants.toml"
    tt = load_tenants(str(path))
    by = {t.name: t for t in tt.tenants}
    assert set(by) == {"interactive", "batch", "edge-proxy", "anonymous"} and tt.default_tenant == "anonymous"
    assert by["edge-proxy"].trusted and not by["batch"].trusted and by["interactive"].weight == 2.0
    gw = gateway([upstream], tenants=str(path), policy="vtc")
    try:
        assert post(gw.base_url, "/completions", completion(2), bearer(by["batch"].api_key))[0] == 200
        assert post(gw.base_url, "/completions", completion(2),
                    {**bearer(by["edge-proxy"].api_key), FID: "interactive"})[0] == 200
        st = assert_idle(gw)
        assert st["tenants"]["batch"]["finished"] == 1 and st["tenants"]["interactive"]["finished"] == 1
        assert st["gate"]["params"]["weights"] == [2.0, 1.0, 1.0, 1.0]
    finally:
        gw.stop()


def _raw_post(port: int, header_line: bytes) -> tuple:
    """A completion with one raw header line (any bytes); (status, the whole answer)."""
    body = json.dumps(completion(1, stream=False)).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + header_line
                  + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    return int(raw.split(b" ", 2)[1]), raw


def test_tenant_ids_are_checked_before_they_reach_a_label(upstream):
    """Open mode: a non-UTF-8 id, one of 8,000 characters: 400 (aiohttp refuses control characters), and
    /metrics and /admin/events stay well (on main the first made them 500 until a restart)."""
    gw = gateway([upstream])
    try:
        s, raw = _raw_post(gw.port, FID.encode() + b": caf\xe9\xff")
        assert s == 400 and b"x-fairlib-rejected-reason: bad_tenant_id" in raw.lower() and b"UTF-8" in raw
        s, raw = _raw_post(gw.port, FID.encode() + b": " + b"x" * 8000)
        assert s == 400 and b"at most 200" in raw
        s, raw = _raw_post(gw.port, FID.encode() + b": " + "zoë".encode())      # valid UTF-8 is a name
        assert s == 200, raw[:300]
        text = gw.metrics()
        assert 'tenant="zoë"' in text and len(text) < 200_000
        head, _ = gw.events()
        assert head["tenants"] == ["zoë"]
    finally:
        gw.stop()


def test_keys_come_from_a_file_or_the_environment(tmp_path, monkeypatch):
    p = ArgumentParser()
    add_arguments(p)
    kf = tmp_path / "key"
    kf.write_text("sk-from-file\n")
    up = ["--upstream", "http://127.0.0.1:1/v1"]
    assert config_from_args(p.parse_args([*up, "--api-key-file", str(kf)])).api_key == "sk-from-file"
    monkeypatch.setenv(KEY_ENV, "sk-from-env")
    assert config_from_args(p.parse_args(up)).api_key == "sk-from-env"
    monkeypatch.setenv("FAIRLIB_UPSTREAM_API_KEY", "sk-up")
    cfg = config_from_args(p.parse_args(up))
    assert cfg.upstream_api_key == "sk-up" and "sk-up" not in json.dumps(cfg.to_dict()) and "sk-up" not in repr(cfg)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="--api-key-file .*empty"):
        read_key(None, str(tmp_path / "empty"), KEY_ENV, "api-key")
    with pytest.raises(ValueError, match="give the key once"):
        read_key("a", str(kf), KEY_ENV, "api-key")
