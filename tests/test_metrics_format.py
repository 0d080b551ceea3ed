"""Both servers' ``/metrics`` as Prometheus reads them (issue 26, item 2): parsed by
``prometheus_client.parser`` (the parser vLLM's metrics are read with), every counter family has
samples, base units (no ``_ms``), the content type ``prometheus_client`` writes, one naming style
(``fairlib_gateway_*``; ``fairlib serve``: ``fairlib_serve_*`` beside the ``vllm:*`` names it
imitates, which the client and the chapters read), the upstream label a URL; ``promtool check
metrics`` passes where Debian's ``prometheus`` package is installed (skipped otherwise, except on
CI, whose .ci/run installs it).
"""
import json
import os
import re
import shutil
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fairlib.gateway import GatewayConfig, GatewayThread
from fairlib.serve import ServeConfig, ServerThread
from fairlib.sim.engine import Engine

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
FID = "x-llm-d-inference-fairness-id"
#: vLLM's families fairlib serve imitates (the client's fairlib/client/prom.py and chapter 8 read them)
VLLM_NAMES = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
              "vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success",
              "vllm:iteration_tokens_total", "vllm:time_to_first_token_seconds",
              "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
              "vllm:request_queue_time_seconds"}


def get(url: str) -> tuple:
    with _opener.open(url, timeout=30) as r:
        return r.headers["Content-Type"], r.read().decode()


def post(base: str, body: dict, tenant: str):
    req = urllib.request.Request(base + "/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", FID: tenant})
    with _opener.open(req, timeout=60) as r:
        return r.status, r.read()


@pytest.fixture(scope="module")
def pair():
    """fairlib serve and a gateway in front of it, after three requests of two tenants."""
    eng = Engine(iter_base_ms=4.0, iter_slope_ms=0.2, max_batch=4)
    with ServerThread(ServeConfig(engine=eng, model="m", port=0, n_tenants=4, policy="vtc")) as srv:
        cfg = GatewayConfig(upstreams=(srv.base_url,), port=0, policy="residency", max_inflight=4,
                            health_interval_s=0.5)
        with GatewayThread(cfg) as gw:
            for t in ("alice", "bob", "alice"):
                assert post(gw.base_url, {"model": "m", "prompt": list(range(12)), "max_tokens": 4,
                                          "ignore_eos": True, "stream": True}, t)[0] == 200
            yield srv, gw


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def check_families(fams: dict) -> None:
    counters = [f for f in fams.values() if f.type == "counter"]
    assert counters
    empty = [f.name for f in counters if not f.samples]
    assert not empty, f"counter families without samples: {empty}"
    for f in counters:
        assert all(s.name == f.name + "_total" for s in f.samples), (f.name, [s.name for s in f.samples])
    assert not [n for n in fams if n.endswith("_ms") or "_ms_" in n], "not base units"


def test_serve_metrics_parse(pair):
    srv, _ = pair
    ctype, text = get(srv.base_url[:-3] + "/metrics")
    assert ctype == "text/plain; version=0.0.4; charset=utf-8"
    fams = families(text)
    check_families(fams)
    assert VLLM_NAMES <= set(fams), sorted(VLLM_NAMES - set(fams))
    own = {n for n in fams if not n.startswith("vllm:")}
    assert own and all(n.startswith("fairlib_serve_") for n in own), sorted(own)
    assert fams["vllm:prompt_tokens"].type == "counter"
    assert fams["fairlib_serve_policy_score_tokens"].type == "gauge"       # vtc: weighted tokens
    tokens = {s.labels["tenant"]: s.value for s in fams["fairlib_serve_tenant_generation_tokens"].samples}
    assert tokens == {"alice": 8.0, "bob": 4.0}


def test_gateway_metrics_parse(pair):
    srv, gw = pair
    ctype, text = get(gw.base_url[:-3] + "/metrics")
    assert ctype == "text/plain; version=0.0.4; charset=utf-8"
    fams = families(text)
    check_families(fams)
    assert all(n.startswith("fairlib_gateway_") for n in fams), sorted(fams)
    adm = {s.labels["tenant"]: s.value for s in fams["fairlib_gateway_admitted"].samples}
    assert adm == {"alice": 2.0, "bob": 1.0}
    out = {s.labels["tenant"]: s.value for s in fams["fairlib_gateway_output_tokens"].samples}
    assert out == {"alice": 8.0, "bob": 4.0}
    res = {s.labels["tenant"]: s.value for s in fams["fairlib_gateway_residency_seconds"].samples}
    sec = {s.labels["tenant"]: s.value for s in fams["fairlib_gateway_policy_score_seconds"].samples}
    assert res.keys() == sec.keys() == {"alice", "bob"}
    for t in res:          # residency's counter is the machine time it charged, in seconds, weight 1
        assert 0 < res[t] < 1.0 and sec[t] == pytest.approx(res[t], rel=1e-9)
    ups = {s.labels["upstream"] for f in fams.values() for s in f.samples if "upstream" in s.labels}
    assert ups == {srv.base_url}
    ttft = fams["fairlib_gateway_time_to_first_token_seconds"]
    assert ttft.type == "histogram"
    assert {s.labels["tenant"]: s.value for s in ttft.samples if s.name.endswith("_count")} == \
        {"alice": 2.0, "bob": 1.0}


def test_openmetrics_on_request(pair):
    _, gw = pair
    req = urllib.request.Request(gw.base_url[:-3] + "/metrics", headers={"Accept": "application/openmetrics-text"})
    with _opener.open(req, timeout=30) as r:
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        assert r.read().decode().rstrip().endswith("# EOF")


def test_counters_follow_a_policy_switch(pair):
    """The residency total is a counter: a policy switch (fresh policy counters) never lowers it."""
    srv, gw = pair
    before = {s.labels["tenant"]: s.value
              for s in families(gw.metrics())["fairlib_gateway_residency_seconds"].samples}
    gw.set_policy("residency")
    assert post(gw.base_url, {"model": "m", "prompt": list(range(12)), "max_tokens": 2, "ignore_eos": True}, "bob")[0] \
        == 200
    after = {s.labels["tenant"]: s.value for s in families(gw.metrics())["fairlib_gateway_residency_seconds"].samples}
    assert after["alice"] == before["alice"] and after["bob"] > before["bob"]


def _promtool():
    exe = shutil.which("promtool")
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing on CI: .ci/run installs Debian's prometheus package")
        pytest.skip("promtool not installed (Debian's prometheus package)")
    return exe


@pytest.mark.parametrize("which", ["serve", "gateway"])
def test_promtool_check_metrics(pair, which):
    exe = _promtool()
    srv, gw = pair
    base = (srv if which == "serve" else gw).base_url[:-3]
    _, text = get(base + "/metrics")
    r = subprocess.run([exe, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    # promtool's lint (naming, units) prints findings and exits 3; a parse error exits 1. The only
    # findings allowed are about vLLM's own names, which fairlib serve keeps exactly (vLLM fails
    # the same lint: colons, a histogram named ..._total)
    problems = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert r.returncode in (0, 3), problems
    ours = [p for p in problems if not p.startswith("vllm:")]
    assert not ours, ours
    assert (r.returncode == 0) == (not problems)
    if which == "gateway":
        assert r.returncode == 0, problems


def test_grafana_dashboard_reads_the_gateway_families(pair):
    """deploy/grafana/fairlib-gateway.json: importable (its datasource an input) and every
    fairlib_gateway_* series its panels query is one the gateway writes."""
    from pathlib import Path
    d = json.loads((Path(__file__).resolve().parents[1] / "deploy/grafana/fairlib-gateway.json").read_text())
    assert d["__inputs"][0]["pluginId"] == "prometheus" and d["panels"]
    _, gw = pair
    _, text = get(gw.base_url[:-3] + "/metrics")
    written = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    asked = {n for p in d["panels"] for t in p["targets"] for n in re.findall(r"fairlib_gateway_[a-z_]+", t["expr"])}
    titles = " ".join(p["title"] for p in d["panels"]).lower()
    assert all(w in titles for w in ("share", "queue wait", "first token", "rejections"))
    # a series with no samples yet (no rejection so far) is still declared: its family is there
    families_ = {f.name for f in text_string_to_metric_families(text)}
    missing = {n for n in asked if n not in written and re.sub(r"_(total|bucket|sum|count)$", "", n) not in families_}
    assert not missing, missing
