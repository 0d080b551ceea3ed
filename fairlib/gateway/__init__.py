"""The fairness gateway: the simulator's policies enforced in front of a real engine.

An OpenAI-compatible reverse proxy (``fairlib gateway``) that holds per-tenant waiting lines,
keeps at most ``max_inflight`` requests in each upstream (its ``max_num_seqs``, so the engine's own
queue stays empty; ``auto``: a credit learned from the engine's metrics, fairlib/gateway/credit.py) and lets the policy decide who enters the batch next, with the simulator's own
policy code (fairlib/sim/gate.py, fairlib/sim/observed.py). It charges tenants from the stream as
it runs: prompt tokens at dispatch, output tokens per upstream read, residency from the decode steps it
rebuilds from the token arrival times (fairlib/gateway/steps.py). The OpenAI wire format and the
metrics registry are fairlib.protocol's (it shares them with ``fairlib serve``, and imports nothing
of it).

    config.py      GatewayConfig and the tenants file
    identity.py    who sends a request: the API key, a trusted key's header, the tenant ids' rules
    steps.py       one upstream's decode steps, rebuilt from its streams
    share.py       each tenant's share of the slots, under any policy (parked admissions)
    core.py        tenants, slots, the policy: the gateway apart from HTTP
    metrics.py     its /metrics families (prometheus_client) and their update at each scrape
    credit.py      --max-inflight auto: each upstream's credit from its /metrics
    health.py      passive health, the one retry before the first byte
    relay.py       one upstream stream relayed: tokens to the gateway, bytes to the client
    forward.py     a request's exchange with its upstream: retry, idle timeout, broken answers
    body.py        a request body read and parsed within ~3x its size
    access_log.py  the access log and the operator's event lines
    admin.py       the loopback admin routes (JSON POSTs from no foreign origin, the log streamed)
    app.py         the HTTP handlers (aiohttp): identity, admission, the wait for a slot
    server.py      starting it: foreground, thread, child process; its command line; the drain
"""
from fairlib.gateway.config import FAIRNESS_HEADERS, GatewayConfig, TenantConfig, TenantTable, load_tenants
from fairlib.gateway.core import Gateway
from fairlib.gateway.server import READY_PREFIX, GatewayProcess, GatewayThread

__all__ = ["GatewayConfig", "TenantConfig", "TenantTable", "load_tenants", "FAIRNESS_HEADERS", "Gateway", "GatewayThread",
           "GatewayProcess", "READY_PREFIX"]
