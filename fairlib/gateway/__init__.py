"""The fairness gateway: the simulator's policies enforced in front of a real engine.

An OpenAI-compatible reverse proxy (``fairlib gateway``) that holds per-tenant waiting lines,
keeps at most ``max_inflight`` requests in each upstream (its ``max_num_seqs``, so the engine's own
queue stays empty) and lets the policy decide who enters the batch next, with the simulator's own
policy code (fairlib/sim/gate.py, fairlib/sim/observed.py). It charges tenants from the stream as
it runs: prompt tokens at dispatch, output tokens per chunk, residency from the decode steps it
rebuilds from the token arrival times (fairlib/gateway/steps.py).

    config.py   GatewayConfig and the tenants file
    steps.py    one upstream's decode steps, rebuilt from its streams
    core.py     tenants, slots, the policy, metrics: the gateway apart from HTTP
    app.py      the HTTP routes (aiohttp) and the stream relay
    server.py   starting it: foreground, thread, child process; its command line
"""
from fairlib.gateway.config import FAIRNESS_HEADERS, GatewayConfig, Tenant, TenantTable, load_tenants
from fairlib.gateway.core import Gateway
from fairlib.gateway.server import READY_PREFIX, GatewayProcess, GatewayThread

__all__ = ["GatewayConfig", "Tenant", "TenantTable", "load_tenants", "FAIRNESS_HEADERS", "Gateway", "GatewayThread",
           "GatewayProcess", "READY_PREFIX"]
