"""``fairlib gateway`` in front of ``fairlib serve`` (the engine model over HTTP).

(a) streams and answers pass through (completions and chat, streamed or not), usage only when asked;
(b) tenants: the fairness-id headers, API keys, the default tenant, 401, the open mode's cap;
(c) turned away: the policy (rpm_quota: 429 + Retry-After), the queue cap (429), the queue
    timeout (503), no healthy upstream (503); upstream errors passed back; unreachable: 502;
(d) a client that leaves, waiting or mid-stream, frees its slot and cancels its upstream request;
(e) two upstreams: the one with the most free slots; one that fails its health checks is taken
    out and put back;
(f) /metrics with the tenant label; /admin: state, events, policy switch (409 while busy);
(g) the event log replays through a fresh gate and through the plain-Python reference policies
    (tests/reference_sim.py) to the same admissions and counters;
(h) the residency the gateway charges from the stream timings matches what the engine model
    itself charged each tenant.
After every test no slot is held and nothing waits (the ``idle`` check).
"""
import collections
import http.client
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from fairlib.client import EndpointConfig, build_schedule, run
from fairlib.client.prom import parse_prometheus
from fairlib.gateway import GatewayConfig, GatewayProcess, GatewayThread
from fairlib.protocol.sse import DONE, SSEParser, decode_payload
from fairlib.scenarios import load as load_scenario
from fairlib.serve import ServeConfig, ServerProcess, ServerThread
from fairlib.sim.engine import Engine
from fairlib.sim.gate import replay
from reference_sim import _make_policy
from waiting import wait_until

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
FID = "x-llm-d-inference-fairness-id"
ENGINE = Engine(iter_base_ms=6.0, iter_slope_ms=0.5, prefill_ms_per_token=0.02, max_batch=4)


def post(base, path, body, headers=None, timeout=60):
    """(status, headers, body bytes)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with _opener.open(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def completion(n=5, stream=True, prompt=None, **kw):
    return {"model": "sim-model", "prompt": prompt if prompt is not None else list(range(20)), "max_tokens": n,
            "ignore_eos": True, "stream": stream, **kw}


def payloads(raw: bytes) -> list:
    p = SSEParser()
    out = [decode_payload(e) for e in p.feed(raw)] + [decode_payload(e) for e in p.flush()]
    return out


@pytest.fixture(scope="module")
def upstream():
    with ServerThread(ServeConfig(engine=ENGINE, model="sim-model", port=0, n_tenants=16)) as srv:
        yield srv


def gateway(upstreams, **kw):
    kw.setdefault("max_inflight", 4)
    kw.setdefault("health_interval_s", 0.2)
    kw.setdefault("record_events", True)         # off by default (it grows with every token)
    return GatewayThread(GatewayConfig(upstreams=tuple(u.base_url if hasattr(u, "base_url") else u
                                                       for u in upstreams), port=0, **kw)).start()


def assert_idle(gw, timeout_s=5.0):
    """No slot held, nothing waiting, no request pending (the gateway's loop asked)."""
    box = {}

    def idle():
        st = box["st"] = gw.state()
        return st if (st["in_flight"] == 0 and st["waiting"] == 0 and st["pending"] == 0
                      and all(u["in_flight"] == 0 for u in st["upstreams"])) else None
    try:
        return wait_until(idle, timeout_s, "the gateway idle")
    except AssertionError:
        raise AssertionError(f"the gateway is not idle: {box.get('st')}") from None


def healthy(gw) -> list:
    """Each upstream's health as the gateway sees it now."""
    return [u["healthy"] for u in gw.state()["upstreams"]]


# --- (a) pass-through ----------------------------------------------------------------------------
def test_streams_and_answers_pass_through(upstream):
    gw = gateway([upstream])
    try:
        s, h, raw = post(gw.base_url, "/completions", completion(5, stream=True), {FID: "a"})
        assert s == 200 and h["Content-Type"].startswith("text/event-stream")
        ev = payloads(raw)
        assert ev[-1] is DONE
        toks = [e for e in ev[:-1] if e.get("choices")]
        assert len(toks) == 5 and toks[-1]["choices"][0]["finish_reason"] == "length"
        assert not any(e.get("usage") and not e.get("choices") for e in ev[:-1])     # usage not asked for
        s, _, raw = post(gw.base_url, "/completions",
                         completion(4, stream=True, stream_options={"include_usage": True}), {FID: "a"})
        usage = [e for e in payloads(raw)[:-1] if not e.get("choices")]
        assert usage[-1]["usage"]["completion_tokens"] == 4
        s, h, raw = post(gw.base_url, "/completions", completion(6, stream=False), {FID: "b"})
        body = json.loads(raw)
        assert s == 200 and body["object"] == "text_completion"
        assert len(body["choices"][0]["text"].split()) == 6 and body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 6 and body["usage"]["prompt_tokens"] == 20
        chat = {"model": "sim-model", "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 3,
                "ignore_eos": True}
        s, _, raw = post(gw.base_url, "/chat/completions", chat, {FID: "b"})
        body = json.loads(raw)
        assert s == 200 and body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert len(body["choices"][0]["message"]["content"].split()) == 3
        st = assert_idle(gw)
        assert st["tenants"]["a"]["output_tokens"] == 9 and st["tenants"]["b"]["output_tokens"] == 9
        assert st["tenants"]["a"]["finished"] == 2 and st["tenants"]["b"]["finished"] == 2
        with _opener.open(gw.base_url + "/models", timeout=10) as r:
            assert json.loads(r.read())["data"][0]["id"] == "sim-model"
    finally:
        gw.stop()


def test_bad_bodies_are_openai_errors(upstream):
    gw = gateway([upstream])
    try:
        s, _, raw = post(gw.base_url, "/completions", b"{not json", {FID: "a"})
        assert s == 400 and json.loads(raw)["error"]["type"] == "BadRequestError"
        s, _, raw = post(gw.base_url, "/completions", {"model": "sim-model", "max_tokens": 3}, {FID: "a"})
        assert s == 400 and json.loads(raw)["error"]["param"] == "prompt"
        s, _, raw = post(gw.base_url, "/completions", {**completion(3), "n": 2}, {FID: "a"})
        assert s == 400 and json.loads(raw)["error"]["param"] == "n"
        s, _, raw = post(gw.base_url, "/nowhere", completion(3))
        assert s == 404 and "routes" in json.loads(raw)["error"]["message"]
        assert_idle(gw)
    finally:
        gw.stop()


# --- (b) tenants -------------------------------------------------------------------------------
def test_tenants_file_keys_headers_and_401(upstream, tmp_path):
    f = tmp_path / "tenants.toml"
    f.write_text('[[tenant]]\nname = "gold"\nweight = 2.0\napi_key = "sk-gold-123"\n'
                 '[[tenant]]\nname = "bronze"\napi_key = "sk-bronze-456"\n')
    gw = gateway([upstream], tenants=str(f), policy="vtc")
    try:
        assert gw.state()["gate"]["params"]["weights"] == [2.0, 1.0]      # the file's weights reach vtc
        s, h, raw = post(gw.base_url, "/completions", completion(2), {FID: "nobody"})
        assert s == 401 and h["x-fairlib-rejected-reason"] == "unauthorized"     # keyed: no key, no tenant
        assert json.loads(raw)["error"]["type"] == "AuthenticationError"
        s, _, _ = post(gw.base_url, "/completions", completion(2), {"Authorization": "Bearer sk-gold-123"})
        assert s == 200
        s, _, _ = post(gw.base_url, "/completions", completion(2), {"x-gateway-inference-fairness-id": "bronze",
                                                                    "Authorization": "Bearer sk-bronze-456"})
        assert s == 200
        st = assert_idle(gw)
        assert st["tenants"]["gold"]["finished"] == 1 and st["tenants"]["bronze"]["finished"] == 1
    finally:
        gw.stop()
    f.write_text('default_tenant = "anon"\n[[tenant]]\nname = "gold"\n')
    gw = gateway([upstream], tenants=str(f))
    try:
        s, _, _ = post(gw.base_url, "/completions", completion(2))
        assert s == 200 and assert_idle(gw)["tenants"]["anon"]["finished"] == 1
    finally:
        gw.stop()
    f.write_text('[[tenant]]\nname = "gold"\n')         # no key: the header names the tenant
    gw = gateway([upstream], tenants=str(f))
    try:
        s, h, _ = post(gw.base_url, "/completions", completion(2), {FID: "nobody"})
        assert s == 401 and h["x-fairlib-rejected-reason"] == "unknown_tenant"
        assert post(gw.base_url, "/completions", completion(2), {FID: "gold"})[0] == 200
    finally:
        gw.stop()


def test_open_mode_caps_the_tenant_label(upstream):
    gw = gateway([upstream], max_tenants=3)
    try:
        for fid in ("a", "b", "c", "d"):
            assert post(gw.base_url, "/completions", completion(1), {FID: fid})[0] == 200
        st = assert_idle(gw)
        assert sorted(st["tenants"]) == ["a", "b", "other"] and st["tenants"]["other"]["finished"] == 2
        m = parse_prometheus(gw.metrics(), prefixes=("fairlib_gateway_admitted",))
        assert set(m) == {f'fairlib_gateway_admitted_total{{tenant="{t}"}}' for t in ("a", "b", "other")}
    finally:
        gw.stop()


def test_bad_tenant_files_are_named(tmp_path):
    f = tmp_path / "t.toml"
    f.write_text('[[tenant]]\nname = "x"\nweight = -1\n')
    with pytest.raises(ValueError, match="weight"):
        GatewayConfig(upstreams=("http://127.0.0.1:1/v1",), tenants=str(f))
    f.write_text('[[tenant]]\nname = "x"\ncolour = "red"\n')
    with pytest.raises(ValueError, match="colour"):
        GatewayConfig(upstreams=("http://127.0.0.1:1/v1",), tenants=str(f))
    with pytest.raises(ValueError, match="--policy"):
        GatewayConfig(upstreams=("http://127.0.0.1:1/v1",), policy="nope")
    with pytest.raises(ValueError, match="--upstream"):
        GatewayConfig(upstreams=("ftp://x",))
    with pytest.raises(ValueError, match="--max-inflight"):
        GatewayConfig(upstreams=("http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"), max_inflight=(1, 2, 3))


# --- (c) turned away -----------------------------------------------------------------------------
def test_rpm_quota_429_with_retry_after(upstream):
    gw = gateway([upstream], policy="rpm_quota", policy_params={"limit": 2})
    try:
        got = [post(gw.base_url, "/completions", completion(1), {FID: "a"}) for _ in range(3)]
        assert [g[0] for g in got] == [200, 200, 429]
        h = got[2][1]
        assert h["x-fairlib-rejected-reason"] == "policy" and 55 <= int(h["Retry-After"]) <= 60
        assert json.loads(got[2][2])["error"]["type"] == "RateLimitError"
        assert post(gw.base_url, "/completions", completion(1), {FID: "b"})[0] == 200
        st = assert_idle(gw)
        assert st["tenants"]["a"]["rejected"] == 1
    finally:
        gw.stop()


def _concurrently(fn, n):
    out = [None] * n
    ths = [threading.Thread(target=lambda i=i: out.__setitem__(i, fn(i))) for i in range(n)]
    for t in ths:
        t.start()
        time.sleep(0.01)
    for t in ths:
        t.join()
    return out


def test_queue_cap_and_queue_timeout(upstream):
    gw = gateway([upstream], max_inflight=1, max_queue=1)
    try:
        # two first (one runs, one waits: the cap), the third only once the gateway holds both (on a
        # loaded machine three threads 10 ms apart once arrived after the first had finished)
        got = []
        ths = [threading.Thread(target=lambda: got.append(post(gw.base_url, "/completions", completion(150),
                                                               {FID: "a"}))) for _ in range(2)]
        for t in ths:
            t.start()
        wait_until(lambda: (gw.state()["in_flight"], gw.state()["waiting"]) == (1, 1), 10,
                   "one request in flight and one waiting", every=0.002)
        got.append(post(gw.base_url, "/completions", completion(40), {FID: "a"}))
        for t in ths:
            t.join()
        codes = sorted(g[0] for g in got)
        assert codes == [200, 200, 429]
        bad = [g for g in got if g[0] == 429][0]
        assert bad[1]["x-fairlib-rejected-reason"] == "queue_full" and "Retry-After" in bad[1]
        assert_idle(gw)
    finally:
        gw.stop()
    gw = gateway([upstream], max_inflight=1, queue_timeout_s=0.1)
    try:
        got = _concurrently(lambda i: post(gw.base_url, "/completions", completion(60), {FID: "a"}), 2)
        codes = sorted(g[0] for g in got)
        assert codes == [200, 503]
        bad = [g for g in got if g[0] == 503][0]
        assert bad[1]["x-fairlib-rejected-reason"] == "queue_timeout" and "Retry-After" in bad[1]
        st = assert_idle(gw)
        assert st["tenants"]["a"]["finished"] == 1
    finally:
        gw.stop()


def test_upstream_errors_pass_back_and_an_unreachable_upstream(upstream):
    gw = gateway([upstream])
    try:
        s, _, raw = post(gw.base_url, "/completions", {**completion(2), "model": "nope"}, {FID: "a"})
        assert s == 404 and "nope" in json.loads(raw)["error"]["message"]          # the upstream's own answer
        assert_idle(gw)
    finally:
        gw.stop()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    sock.close()
    gw = gateway([dead], health_interval_s=0.1)
    try:
        s, _, raw = post(gw.base_url, "/completions", completion(2), {FID: "a"})
        assert s in (502, 503)
        assert "upstream" in json.loads(raw)["error"]["message"]
        wait_until(lambda: healthy(gw) == [False], 10, "the dead upstream out (missed health checks)")
        s, h, raw = post(gw.base_url, "/completions", completion(2), {FID: "a"})
        assert s == 503 and h["x-fairlib-rejected-reason"] == "no_upstream"
        with pytest.raises(urllib.error.HTTPError) as e:
            _opener.open(gw.root + "/health", timeout=5)
        assert e.value.code == 503
        assert_idle(gw)
    finally:
        gw.stop()


# --- (d) clients that leave ------------------------------------------------------------------------
def _raw_stream(port, body, headers, read_bytes, hold=None):
    """Send a streamed request, read about ``read_bytes`` of the answer (0: none), wait for the
    event ``hold`` when one is given (the caller's signal to leave), then close."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    data = json.dumps(body).encode()
    head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + f"Content-Length: {len(data)}\r\n\r\n")
    s.sendall(head.encode() + data)
    got = b""
    while len(got) < read_bytes:
        got += s.recv(4096)
    if hold is not None:
        assert hold.wait(60), "the test never told the client to leave"
    s.close()
    return got


def test_a_client_that_leaves_frees_its_slot_and_cancels_upstream(upstream):
    gw = gateway([upstream], max_inflight=1)
    try:
        running0 = upstream.stats()["requests_submitted"]
        leave = threading.Event()
        holder = threading.Thread(target=_raw_stream, args=(gw.port, completion(400), {FID: "a"}, 600, leave))
        holder.start()
        # the holder stays until told to leave (400 tokens take 2.6 s, far longer than the steps
        # below), so the state is held while it is polled, on a busy machine too
        wait_until(lambda: gw.state()["in_flight"] == 1, 10, "the first stream holding the slot")
        # a second one waits behind it, then leaves while waiting
        _raw_stream(gw.port, completion(5), {FID: "b"}, 0)
        leave.set()
        holder.join()                        # the first left mid-stream
        st = assert_idle(gw)
        wait_until(lambda: upstream.stats()["running"] == 0, 5, "the upstream's copy cancelled")
        assert upstream.stats()["running"] == 0                      # cancelled upstream, not run to the end
        assert upstream.stats()["requests_submitted"] - running0 <= 2
        assert st["tenants"]["a"]["output_tokens"] < 400
        assert post(gw.base_url, "/completions", completion(2), {FID: "c"})[0] == 200   # the slot is free
        assert_idle(gw)
    finally:
        gw.stop()


# --- (e) two upstreams -------------------------------------------------------------------------------
def test_two_upstreams_most_free_slots_and_replica_loss():
    a = ServerThread(ServeConfig(engine=ENGINE, model="sim-model", port=0, n_tenants=8)).start()
    b = ServerThread(ServeConfig(engine=ENGINE, model="sim-model", port=0, n_tenants=8)).start()
    port_b = b.port
    gw = gateway([a, b], max_inflight=2, health_interval_s=0.1, tenant_max_share=1.0)   # one tenant, every slot
    try:
        got = _concurrently(lambda i: post(gw.base_url, "/completions", completion(30), {FID: "t"}), 4)
        assert all(g[0] == 200 for g in got)
        st = assert_idle(gw)
        assert [u["dispatched"] for u in st["upstreams"]] == [2, 2]
        b.stop()
        wait_until(lambda: healthy(gw) == [True, False], 10, "the stopped upstream marked unhealthy")
        got = _concurrently(lambda i: post(gw.base_url, "/completions", completion(10), {FID: "t"}), 3)
        assert all(g[0] == 200 for g in got)
        st = assert_idle(gw)
        assert [u["dispatched"] for u in st["upstreams"]] == [5, 2]
        b = ServerThread(ServeConfig(engine=ENGINE, model="sim-model", port=port_b, n_tenants=8)).start()
        wait_until(lambda: healthy(gw) == [True, True], 10, "the restarted upstream healthy again")
        got = _concurrently(lambda i: post(gw.base_url, "/completions", completion(30), {FID: "t"}), 4)
        assert all(g[0] == 200 for g in got)
        assert [u["dispatched"] for u in assert_idle(gw)["upstreams"]] == [7, 4]
    finally:
        gw.stop()
        a.stop()
        b.stop()


# --- (f) metrics and admin -----------------------------------------------------------------------------
def test_metrics_and_admin(upstream):
    gw = gateway([upstream], policy="vtc")
    try:
        for fid in ("x", "y", "x"):
            assert post(gw.base_url, "/completions", completion(3), {FID: fid})[0] == 200
        assert_idle(gw)
        m = parse_prometheus(gw.metrics(), prefixes=("fairlib_gateway",))
        x, y = '{tenant="x"}', '{tenant="y"}'
        assert m["fairlib_gateway_admitted_total" + x] == 2
        assert m["fairlib_gateway_output_tokens_total" + x] == 6
        assert m["fairlib_gateway_prompt_tokens_total" + y] == 20
        assert m['fairlib_gateway_policy_score_tokens{policy="vtc",tenant="x"}'] == pytest.approx(2 * 20 + 2 * 6)
        assert m["fairlib_gateway_residency_seconds_total" + x] > 0     # wp 1, wq 2 above
        assert m["fairlib_gateway_queue_wait_seconds_count" + y] == 1
        assert m["fairlib_gateway_time_to_first_token_seconds_count" + x] == 2
        head, events = gw.events()
        assert head["spec"]["policy"] == "vtc" and head["tenants"] == ["x", "y"]
        assert [e[0] for e in events].count("arrive") == 3
        st = gw.set_policy("residency")
        assert st["policy"] == "residency" and st["tenants"]["x"]["admitted"] == 0
        assert gw.events()[1] == []
        # busy: 409
        t = threading.Thread(target=post, args=(gw.base_url, "/completions", completion(200), {FID: "x"}))
        t.start()
        wait_until(lambda: gw.state()["in_flight"] == 1, 10, "the request in flight")
        with pytest.raises(urllib.error.HTTPError) as e:
            gw.set_policy("fcfs")
        assert e.value.code == 409
        t.join()
        assert_idle(gw)
        assert gw.set_policy("fcfs")["policy"] == "fcfs"
    finally:
        gw.stop()


# --- (g) the event log replays ---------------------------------------------------------------------------
class _RefSim:
    """What tests/reference_sim.py's policies read of their engine, filled from an event log."""

    def __init__(self, spec):
        self.n_tenants = spec["n_tenants"]
        self.prefill_ms_per_token = spec["prefill_ms_per_token"]
        self.tenant, self.arrival, self.klass, self.priority, self.est, self.prompt = [], [], [], [], [], []
        self.running = set()
        self.preemptions = collections.defaultdict(int)     # a gateway never preempts

    def running_per_tenant(self):
        out = {}
        for r in self.running:
            out[self.tenant[r]] = out.get(self.tenant[r], 0) + 1
        return out

    def running_ids(self):
        return sorted(self.running)


def replay_reference(spec, events):
    """The log through the reference policies: admissions checked one by one; returns the
    reference policy (its counters) and its per-tenant machine time."""
    sim = _RefSim(spec)
    pol = _make_policy(sim, spec["policy"], dict(spec["params"]))
    tokens, machine = {}, np.zeros(spec["n_tenants"])
    c = spec["prefill_ms_per_token"]
    for i, ev in enumerate(events):
        kind = ev[0]
        if kind == "arrive":
            _, t, tenant, prompt, est, klass, prio, rid, ok, a = ev
            assert rid == len(sim.tenant)
            for col, v in ((sim.tenant, tenant), (sim.prompt, prompt), (sim.est, est), (sim.klass, klass),
                           (sim.priority, prio), (sim.arrival, a)):
                col.append(v)
            assert pol.arrive(rid, t) == ok, f"event {i}: acceptance differs"
        elif kind == "admit":
            _, t, cap, ids = ev
            for rid in ids:
                got = pol.select(t)
                assert got == rid, f"event {i}: the reference selects {got}, the gateway admitted {rid}"
                pol.admit(rid, sim.prompt[rid])
                sim.running.add(rid)
                tokens[rid] = 0
                machine[sim.tenant[rid]] += c * sim.prompt[rid]
            if len(sim.running) < cap:
                assert pol.select(t) is None, f"event {i}: the reference would admit more"
        elif kind == "step":
            _, t, dt, ids, toks, fin = ev
            P = sum(sim.prompt[r] for r in ids if tokens[r] == 0)
            per_seq = max(0.0, dt - c * P) / len(ids)
            for r in ids:
                machine[sim.tenant[r]] += per_seq
            for s in range(max(toks)):
                ran = [r for r, k in zip(ids, toks) if k > s]
                done = [r for r, k, f in zip(ids, toks, fin) if f and k == s + 1]
                pol.end_iteration(ran, per_seq if s == 0 else 0.0, done)
            for r, k, f in zip(ids, toks, fin):
                tokens[r] += k
                if f:
                    sim.running.discard(r)
        elif kind == "replicas":                  # the pool's capacity changed: debts to t, then R
            pol._advance(ev[1])
            pol.R = float(ev[2])
        else:
            raise AssertionError(f"event {i}: {kind} (the replay test sends no cancellations)")
    return pol, machine


@pytest.mark.parametrize("policy,params", [("vtc", {}), ("residency", {}), ("fcfs", {}), ("lcf", {}),
                                           ("slot_cap", {"cap": 1}), ("rr", {}), ("vtc_predict", {})])
def test_event_log_replays_to_the_same_decisions(upstream, policy, params):
    gw = gateway([upstream], policy=policy, policy_params=params, max_inflight=2, prefill_ms_per_token=0.02)
    try:
        def one(i):
            tenant = "abc"[i % 3]
            return post(gw.base_url, "/completions", completion(3 + 7 * (i % 4), prompt=list(range(10 + i))),
                        {FID: tenant})
        got = _concurrently(one, 18)
        assert all(g[0] == 200 for g in got)
        assert_idle(gw)
        head, events = gw.events()
        again = replay(head["spec"], events)                      # a fresh compiled gate
        st = gw.state()
        machine = [st["tenants"][n]["machine_ms"] for n in head["tenants"]]
        np.testing.assert_allclose(again.tenant_state()["machine_ms"][:3], machine, rtol=1e-12)
        ref, ref_machine = replay_reference(head["spec"], events)  # the independent reference
        np.testing.assert_allclose(ref_machine[:3], machine, rtol=1e-9)
        if hasattr(ref, "counter"):
            counters = [st["tenants"][n]["counter"] for n in head["tenants"]]
            np.testing.assert_allclose(ref.counter[:3], counters, rtol=1e-9, atol=1e-9)
    finally:
        gw.stop()


# --- (h) residency from the streams vs the engine model's own charge --------------------------------------
def test_residency_from_the_streams_matches_the_engine_models_charge(tmp_path):
    """Two tenants (short and long answers, the seed-000 contrast) through an FCFS gateway whose
    slots equal the engine model's batch: the gateway's dt/B per observed step must give each
    tenant the machine share the engine model charged it (points, 2 cores shared by three processes)."""
    eng = ["--iter-base-ms", "8", "--iter-slope-ms", "0.5", "--prefill-ms-per-token", "0.03", "--max-batch", "4",
           "--model", "sim-model", "--tenants", "4"]
    with ServerProcess(eng) as srv, GatewayProcess(["--upstream", srv.base_url, "--max-inflight", "4",
                                                    "--prefill-ms-per-token", "0.03"]) as gw:
        spec = load_scenario("fair_share", engine=Engine(8.0, 0.5, 0.03, 4)).with_duration(6.0)
        sched = build_schedule(spec.requests(0), 0, tenant_names=list(spec.tenant_names))
        cfg = EndpointConfig(base_url=gw.base_url, model="sim-model", tenant_header=FID)
        run(sched, cfg, tmp_path / "run", scrape_metrics=False)
        wait_until(lambda: gw.state()["in_flight"] == 0, 10, "every slot released")
        st = gw.state()
        truth = srv.stats()["tenant_machine_ms"]
        names = sorted(truth)
        got = np.array([st["tenants"][n]["machine_ms"] for n in names])
        want = np.array([truth[n] for n in names])
        share_err = np.abs(got / got.sum() - want / want.sum()) * 100
        assert share_err.max() < 2.0, (names, got, want)
        assert got.sum() == pytest.approx(want.sum(), rel=0.1)


def test_sigterm_drains_the_streams_in_flight_and_refuses_new_ones():
    """SIGTERM to ``fairlib gateway``: a stream in flight runs to its end (every token and
    ``[DONE]``), one waiting for a slot is still served, a new request is 503 ``shutting_down``
    with Retry-After and ``/health`` 503 meanwhile; then the process exits 0."""
    eng = ["--iter-base-ms", "25", "--iter-slope-ms", "0", "--max-batch", "1", "--model", "sim-model"]
    with ServerProcess(eng) as srv, GatewayProcess(["--upstream", srv.base_url, "--max-inflight", "1"]) as gw:
        got = {}

        def send(k, n):
            got[k] = post(gw.base_url, "/completions", completion(n), {FID: "t"})
        first = threading.Thread(target=send, args=("running", 60))       # 60 x 25 ms = 1.5 s
        first.start()
        wait_until(lambda: gw.state()["in_flight"] >= 1, 10, "the first request in flight")
        second = threading.Thread(target=send, args=("waiting", 4))
        second.start()
        wait_until(lambda: gw.state()["waiting"] >= 1, 10, "the second request waiting")
        gw.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: gw.state()["stopping"], 10, "the gateway stopping (draining)")
        status, headers, body = post(gw.base_url, "/completions", completion(3), {FID: "t"})
        assert status == 503 and headers["x-fairlib-rejected-reason"] == "shutting_down" and headers["Retry-After"] == "1"
        with pytest.raises(urllib.error.HTTPError) as e:
            _opener.open(gw.base_url[:-3] + "/health", timeout=5)
        assert e.value.code == 503
        first.join(20)
        second.join(20)
        assert gw.proc.wait(20) == 0
        for k, n in (("running", 60), ("waiting", 4)):
            status, _, raw = got[k]
            events = payloads(raw)
            assert status == 200 and events[-1] == DONE, (k, status, raw[-300:])
            text = [e for e in events if e is not DONE and e.get("choices")]
            assert len(text) == n, (k, len(text))


@pytest.mark.parametrize("how", ["timeout", "second signal"])
def test_a_cut_drain_exits_1(how):
    """A drain that does not finish (its timeout, or a second SIGTERM) stops the streams and the
    gateway exits 1, not 0: a shutdown that cut requests is not reported as clean."""
    eng = ["--iter-base-ms", "25", "--iter-slope-ms", "0", "--max-batch", "1", "--model", "sim-model"]
    drain = "0.3" if how == "timeout" else "60"
    with ServerProcess(eng) as srv, GatewayProcess(["--upstream", srv.base_url, "--max-inflight", "1",
                                                    "--drain-timeout-s", drain]) as gw:
        out = {}

        def send():
            try:
                out["answer"] = post(gw.base_url, "/completions", completion(400), {FID: "t"})
            except Exception as e:     # noqa: BLE001 - the cut stream, asserted below
                out["error"] = e
        th = threading.Thread(target=send)
        th.start()                                      # 400 x 25 ms = 10 s
        wait_until(lambda: gw.state()["in_flight"] >= 1, 10, "the stream in flight")
        gw.proc.send_signal(signal.SIGTERM)
        if how == "second signal":
            wait_until(lambda: gw.state()["stopping"], 10, "the gateway stopping (draining)")
            gw.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        assert gw.proc.wait(20) == 1
        assert time.monotonic() - t0 < 5
        th.join(20)
        if "answer" in out:                              # an answer that ended early, without [DONE]
            assert payloads(out["answer"][2])[-1] is not DONE
        else:
            assert isinstance(out["error"], (OSError, http.client.HTTPException)), out


# --- the command line ----------------------------------------------------------------------------------
def test_the_gateway_runs_on_either_event_loop(upstream):
    """``fairlib gateway`` on the standard library's loop by default and on libuv's with
    ``--event-loop uvloop``; both relay the same answer and charge its tokens (a stream of 30
    tokens, read in as many reads as the loop gives)."""
    for flag, want in (([], "asyncio"), (["--event-loop", "uvloop"], "uvloop")):
        with GatewayProcess(["--upstream", upstream.base_url, "--max-inflight", "2", *flag]) as gw:
            assert gw.state()["event_loop"] == want
            status, _, body = post(gw.base_url, "/completions", completion(30), {FID: "a"})
            got = payloads(body)
            assert status == 200 and got[-1] is DONE
            assert sum(len(p["choices"][0]["text"]) > 0 for p in got[:-1] if p.get("choices")) == 30
            assert not any(p.get("usage") for p in got[:-1])      # the usage chunk it did not ask for
            wait_until(lambda: gw.state()["in_flight"] == 0, 10, "the stream's slot freed")
            text = gw.get_text("/metrics")
            assert 'fairlib_gateway_output_tokens_total{tenant="a"} 30.0' in text, text[:2000]


def test_gateway_cli_errors_are_one_line():
    def run_cli(*args):
        p = subprocess.run([sys.executable, "-m", "fairlib.cli", "gateway", *args], capture_output=True, text=True,
                           timeout=60)
        return p.returncode, p.stderr.strip().splitlines()
    code, err = run_cli()
    assert code == 2 and any("--upstream" in line for line in err)
    code, err = run_cli("--upstream", "http://127.0.0.1:9/v1", "--policy", "nope")
    assert code == 2 and len(err) == 1 and "--policy" in err[0]
    code, err = run_cli("--upstream", "http://127.0.0.1:9/v1", "--port", "70000")
    assert code == 2 and "--port" in err[-1]
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        code, err = run_cli("--upstream", "http://127.0.0.1:9/v1", "--port", str(s.getsockname()[1]))
        assert code == 1 and len(err) == 1 and "in use" in err[0]
    finally:
        s.close()


# --- class and estimate policies over HTTP -----------------------------------------------------------
def _order_of_admission(gw, bodies_headers, blocker):
    """One slot: a long blocker holds it while the others arrive, one by one; then the order in
    which the gateway admitted them (from its event log)."""
    t = threading.Thread(target=post, args=(gw.base_url, "/completions", *blocker))
    t.start()
    wait_until(lambda: gw.state()["in_flight"] == 1, 10, "the blocker holding the slot")
    ths = []
    for k, (body, headers) in enumerate(bodies_headers):
        th = threading.Thread(target=post, args=(gw.base_url, "/completions", body, headers))
        th.start()
        ths.append(th)
        wait_until(lambda k=k: gw.state()["waiting"] == k + 1, 10, f"request {k + 1} waiting (the arrival order)")
    for th in [t, *ths]:
        th.join()
    assert_idle(gw)
    _, events = gw.events()
    return [rid for e in events if e[0] == "admit" for rid in e[3]]


def test_priority_and_sjf_decide_the_order_over_http(upstream, tmp_path):
    f = tmp_path / "tenants.toml"
    f.write_text('[[tenant]]\nname = "gold"\npriority = 0\n[[tenant]]\nname = "bronze"\npriority = 1\n')
    gw = gateway([upstream], tenants=str(f), policy="priority", max_inflight=1)
    try:
        order = _order_of_admission(gw, [(completion(2), {FID: n}) for n in ("bronze", "bronze", "gold", "gold")],
                                    (completion(120), {FID: "bronze"}))
        assert order == [0, 3, 4, 1, 2]          # the blocker, then gold (lower priority first), then bronze
    finally:
        gw.stop()
    gw = gateway([upstream], policy="sjf", max_inflight=1)
    try:
        ests = [50, 5, 20]
        order = _order_of_admission(gw, [(completion(2, est_output_tokens=e), {FID: "a"}) for e in ests],
                                    (completion(120), {FID: "a"}))
        assert order == [0, 2, 3, 1]             # shortest estimate first
        gw.set_policy("sjf")                     # a fresh log: ids from 0 again
        order = _order_of_admission(gw, [(completion(2), {FID: "a", "x-fairlib-est-output-tokens": str(e)})
                                         for e in ests], (completion(120), {FID: "a"}))
        assert order == [0, 2, 3, 1]             # the estimate as a header
    finally:
        gw.stop()


# --- the token pool over HTTP ---------------------------------------------------------------------------
POOL_TENANTS = ('[[tenant]]\nname = "gold"\npool_class = "guaranteed"\nshare = 0.25\nttft_slo_ms = 200\n'
                '[[tenant]]\nname = "team"\npool_class = "elastic"\nshare = 0.5\nttft_slo_ms = 2000\n'
                '[[tenant]]\nname = "flood"\npool_class = "spot"\n')


def test_token_pool_refuses_spot_with_retry_after_never_guaranteed_and_replays(upstream, tmp_path):
    """One upstream of 4 slots, u = 1 ms per token, H = 200 ms: gold's cap 50 ms, team's 100.
    A spot flood of 40-token reservations fills the 200 ms: the rest get 429 with Retry-After;
    gold's requests within its 50 ms are all served; the log replays through a fresh gate and
    the plain-Python reference to the same decisions and debts."""
    f = tmp_path / "tenants.toml"
    f.write_text(POOL_TENANTS)
    gw = gateway([upstream], tenants=str(f), policy="token_pool", prefill_ms_per_token=0.0,
                 policy_params={"decode_price_ms": 1.0, "pool_horizon_ms": 200.0})
    try:
        spec = gw.state()["gate"]
        assert spec["params"]["classes"] == ["guaranteed", "elastic", "spot"]
        assert spec["params"]["replica_slots"] == 4 and spec["params"]["replicas"] == 1
        flood = _concurrently(lambda i: post(gw.base_url, "/completions", completion(40), {FID: "flood"}), 12)
        codes = [g[0] for g in flood]
        assert 200 in codes and 429 in codes
        for g in flood:
            if g[0] == 429:
                assert g[1]["x-fairlib-rejected-reason"] == "policy" and int(g[1]["Retry-After"]) >= 1
        gold = _concurrently(lambda i: post(gw.base_url, "/completions", completion(25), {FID: "gold"}), 2)
        assert [g[0] for g in gold] == [200, 200]       # 2 x 25 = its 50 ms: never refused
        st = assert_idle(gw)
        assert st["tenants"]["gold"]["rejected"] == 0 and st["tenants"]["flood"]["rejected"] == codes.count(429)

        assert st["tenants"]["flood"]["reserved_ms"] == 0.0
        huge = post(gw.base_url, "/completions", completion(300), {FID: "gold"})   # 300 ms > R H = 200
        assert huge[0] == 429 and "Retry-After" not in huge[1] and "could ever fund" in json.loads(huge[2])["error"]["message"]
        bad = post(gw.base_url, "/completions", {"model": "sim-model", "prompt": [1, 2], "stream": True},
                   {FID: "team"})
        assert bad[0] == 400 and json.loads(bad[2])["error"]["param"] == "max_tokens"
        head, events = gw.events()
        again = replay(head["spec"], events)
        np.testing.assert_array_equal(again.counters(), gw.gateway.gate.counters())
        ref, ref_machine = replay_reference(head["spec"], events)
        np.testing.assert_allclose(ref.d, gw.gateway.gate.counters(), rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(ref.Q, [0.0, 0.0, 0.0], atol=1e-9)
    finally:
        gw.stop()


@pytest.fixture
def two_serves():
    """Two ``fairlib serve`` replicas of the engine model, stopped after the test."""
    a = ServerThread(ServeConfig(engine=ENGINE, model="sim-model", port=0, n_tenants=8)).start()
    b = ServerThread(ServeConfig(engine=ENGINE, model="sim-model", port=0, n_tenants=8)).start()
    yield a, b
    a.stop()
    b.stop()


def test_draining_an_upstream_tells_the_pool_and_routes_around_it(tmp_path, two_serves):
    f = tmp_path / "tenants.toml"
    f.write_text(POOL_TENANTS)
    gw = gateway(list(two_serves), tenants=str(f), policy="token_pool", max_inflight=2,
                 policy_params={"decode_price_ms": 1.0, "pool_horizon_ms": 10000.0})
    try:
        assert gw.state()["tenants"]["team"]["cap_ms"] == pytest.approx(0.5 * 2 * 10000.0)
        st = gw.drain(1)
        assert [u["drained"] for u in st["upstreams"]] == [False, True]
        assert st["replicas_available"] == 1 and st["policy_params"]["replicas"] == 2   # the params as set
        assert st["tenants"]["team"]["cap_ms"] == pytest.approx(0.5 * 1 * 10000.0)
        got = _concurrently(lambda i: post(gw.base_url, "/completions", completion(5), {FID: "team"}), 4)
        assert all(g[0] == 200 for g in got)
        assert [u["dispatched"] for u in assert_idle(gw)["upstreams"]] == [4, 0]
        gw.drain(1, False)
        assert gw.state()["tenants"]["team"]["cap_ms"] == pytest.approx(0.5 * 2 * 10000.0)
        root = gw.base_url[:-len("/v1")]
        assert post(root, "/admin/upstreams", {"upstream": 5, "drained": True})[0] == 400
        assert post(root, "/admin/upstreams", {"upstream": 0})[0] == 400
        _, events = gw.events()
        assert [e[2] for e in events if e[0] == "replicas"] == [1, 2]
    finally:
        gw.stop()


def test_a_drain_is_in_every_policys_log(two_serves):
    """fcfs ignores the replica count, but its event log still says when capacity changed (the
    live chapter reads the outage's instants from it)."""
    gw = gateway(list(two_serves), policy="fcfs", max_inflight=2)
    try:
        assert gw.drain(1)["replicas_available"] == 1
        assert gw.drain(1, False)["replicas_available"] == 2
        _, events = gw.events()
        assert [e[2] for e in events if e[0] == "replicas"] == [1, 2]
    finally:
        gw.stop()


def test_token_pool_needs_its_tenants(tmp_path):
    with pytest.raises(ValueError, match="tenants file"):
        GatewayConfig(upstreams=("http://127.0.0.1:1/v1",), policy="token_pool",
                      policy_params={"decode_price_ms": 1.0})
    f = tmp_path / "t.toml"
    f.write_text('[[tenant]]\nname = "a"\npool_class = "elastic"\nshare = 0.5\n[[tenant]]\nname = "b"\n')
    with pytest.raises(ValueError, match="pool_class"):
        GatewayConfig(upstreams=("http://127.0.0.1:1/v1",), policy="token_pool", tenants=str(f),
                      policy_params={"decode_price_ms": 1.0})
    f.write_text('[[tenant]]\nname = "a"\npool_class = "gold"\n')
    with pytest.raises(ValueError, match="pool_class"):
        GatewayConfig(upstreams=("http://127.0.0.1:1/v1",), policy="token_pool", tenants=str(f))
    f.write_text('[[tenant]]\nname = "a"\npool_class = "elastic"\nshare = 0.5\n')
    cfg = GatewayConfig(upstreams=("http://127.0.0.1:1/v1",), policy="token_pool", tenants=str(f),
                        max_inflight=8, cost_model={"iter_base_ms": 8.0, "iter_slope_ms": 1.0})
    assert cfg.effective_policy_params()["decode_price_ms"] == pytest.approx((8.0 + 8.0) / 8)
    up2 = ("http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1")
    cfg = GatewayConfig(upstreams=up2, policy="token_pool", tenants=str(f), max_inflight=(4, 8),
                        policy_params={"replica_slots": 4}, cost_model={"iter_base_ms": 8.0, "iter_slope_ms": 1.0})
    assert cfg.effective_policy_params()["decode_price_ms"] == pytest.approx((8.0 + 4.0) / 4)
    with pytest.raises(ValueError, match="iter_base_ms and iter_slope_ms"):
        GatewayConfig(upstreams=up2, policy="token_pool", tenants=str(f), cost_model={"max_batch": 4})
    for text, match in (('name = "a"\npool_class = "guaranteed"\n', r"\['a'\].*no share"),
                        ('name = "s"\npool_class = "spot"\nshare = 0.2\n', r"spot tenant\(s\) \['s'\]"),
                        ('name = "a"\npool_class = "elastic"\nshare = 0.7\n[[tenant]]\nname = "b"\n'
                         'pool_class = "elastic"\nshare = 0.6\n', r"add up to 1.3.*a 0.7, b 0.6")):
        f.write_text("[[tenant]]\n" + text)
        with pytest.raises(ValueError, match=match):
            GatewayConfig(upstreams=("http://127.0.0.1:1/v1",), policy="token_pool", tenants=str(f),
                          policy_params={"decode_price_ms": 1.0})
