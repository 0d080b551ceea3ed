"""Starting and stopping ``fairlib gateway``: in the foreground (the CLI), in a background thread
(tests), or in a child process (chapters, benchmarks), and its command-line arguments."""
from __future__ import annotations

import asyncio
import errno
import json
import sys
import time
from typing import Optional

from fairlib.gateway.app import GATEWAY, make_app
from fairlib.gateway.config import GatewayConfig, load_tenants
from fairlib.gateway.core import Gateway
from fairlib.serve.config import load_engine_params
from fairlib.servers import ChildServer, ThreadServer, port_number, run_until_signal, start_app
from fairlib.sim.policies import parse_policy_param

__all__ = ["READY_PREFIX", "start", "serve_forever", "GatewayThread", "GatewayProcess", "add_arguments",
           "config_from_args", "gateway_from_args", "drain"]

READY_PREFIX = "fairlib gateway: listening on "


async def start(cfg: GatewayConfig):
    """Bind and start; returns ``(runner, port)`` (``runner.app[GATEWAY]`` is the gateway)."""
    return await start_app(make_app(Gateway(cfg)), cfg.host, cfg.port)


def describe(cfg: GatewayConfig, port: int) -> str:
    params = f" {cfg.policy_params}" if cfg.policy_params else ""
    ups = ", ".join(f"{u} ({m} slots)" for u, m in zip(cfg.upstreams, cfg.max_inflight))
    tenants = "open" if cfg.tenants.is_open else f"{len(cfg.tenants.tenants)} tenants"
    return f"{READY_PREFIX}http://{cfg.host}:{port}/v1 (policy {cfg.policy}{params}; {tenants}; upstreams {ups})"


async def drain(runner, timeout_s: float) -> bool:
    """After a stop signal: take no new request (503 with Retry-After, ``/health`` 503) and wait
    up to ``timeout_s`` for those waiting and in flight to end (their streams run to the end).
    Returns whether they all ended."""
    gw = runner.app[GATEWAY]
    gw.stopping = True
    deadline = time.monotonic() + timeout_s
    while not gw.idle() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if not gw.idle():
        print(f"fairlib gateway: {gw.gate.in_flight} in flight and {gw.gate.waiting} waiting after "
              f"{timeout_s:g} s of draining: stopping them", file=sys.stderr, flush=True)
        return False
    return True


def serve_forever(cfg: GatewayConfig, announce: bool = True) -> bool:
    """Run until SIGINT/SIGTERM/SIGHUP, then drain (:func:`drain`, ``cfg.drain_timeout_s``; a
    second signal stops at once). Prints one ready line (``READY_PREFIX`` + base URL). Returns
    whether the drain finished."""
    return run_until_signal(lambda: start(cfg), (lambda port: describe(cfg, port)) if announce else None,
                            drain=lambda runner: drain(runner, cfg.drain_timeout_s))


class _Admin:
    """The gateway's JSON routes, from the caller's side."""

    def state(self) -> dict:
        return self.get_json("/admin/state")

    def events(self) -> tuple:
        """``(head, events)``: the gate's spec and tenant names, and the event log."""
        lines = self.get_text("/admin/events").splitlines()
        return json.loads(lines[0]), [json.loads(x) for x in lines[1:] if x]

    def metrics(self) -> str:
        return self.get_text("/metrics")

    def drain(self, upstream: int, drained: bool = True) -> dict:
        """Take upstream ``upstream`` out (no new requests) or put it back (``/admin/upstreams``)."""
        body = json.dumps({"upstream": upstream, "drained": drained}).encode()
        with self.request("/admin/upstreams", body) as r:
            return json.loads(r.read())

    def set_policy(self, policy: str, params: Optional[dict] = None) -> dict:
        """A new policy (fresh counters and log) between runs (``/admin/policy``)."""
        body = json.dumps({"policy": policy, "params": params or {}}).encode()
        with self.request("/admin/policy", body) as r:
            return json.loads(r.read())


class GatewayThread(_Admin, ThreadServer):
    """The gateway on its own event loop in a background thread of this process (tests)."""

    name = "fairlib-gateway"

    def __init__(self, cfg: GatewayConfig):
        self.cfg = cfg
        super().__init__(lambda: start(self.cfg))

    @property
    def gateway(self) -> Gateway:
        return self._runner.app[GATEWAY]


class GatewayProcess(_Admin, ChildServer):
    """``fairlib gateway`` in a child process (``python -m fairlib.cli gateway --port 0 ARGS``);
    ``start()`` waits for the ready line, ``stop()`` sends SIGTERM (then kills); it dies with its
    parent. ``cpu``: pin it to one core."""

    command, ready_prefix = "gateway", READY_PREFIX


# --- command line -----------------------------------------------------------------------------

def add_arguments(p) -> None:
    """The ``gateway`` subcommand's options."""
    p.add_argument("--upstream", action="append", default=[], metavar="URL", required=True,
                   help="an OpenAI base URL to forward to (e.g. http://127.0.0.1:8000/v1); repeatable: a request "
                        "goes to the healthy upstream with the most free slots")
    p.add_argument("--policy", default="fcfs", help="who enters the batch next: a policy of fairlib.POLICIES "
                                                    "(fcfs, rpm_quota, vtc, lcf, residency, slot_cap, priority, "
                                                    "weighted, sjf, aging, rr, vtc_predict, token_pool); default fcfs")
    p.add_argument("--policy-param", action="append", default=[], metavar="NAME=VALUE",
                   help="a policy parameter (VALUE parsed as JSON when it can be: limit=100, weights=[1,2]); "
                        "repeatable")
    p.add_argument("--max-inflight", action="append", type=int, default=[], metavar="N",
                   help="requests in each upstream at most: its max_num_seqs (default: the --cost-model's "
                        "max_batch, else 16); once for all, or once per --upstream")
    p.add_argument("--cost-model", metavar="FILE",
                   help="a fairlib fit or probe result (JSON): max_inflight defaults to its max_batch, the "
                        "residency charge's prefill price to its prefill_ms_per_token, token_pool's decode "
                        "price to (iter_base_ms + iter_slope_ms B) / B at B = max_inflight")
    p.add_argument("--prefill-ms-per-token", type=float,
                   help="the engines' prefill price (ms/token) charged at admission (default: the cost model's, "
                        "else 0: prefill time split over the step like decode time)")
    p.add_argument("--tenants", metavar="FILE", help="a TOML tenants file (fairlib.gateway.config); without it "
                                                     "every fairness id is a tenant, up to --max-tenants")
    p.add_argument("--max-tenants", type=int, default=64,
                   help="open mode: most tenants told apart (the rest share 'other'); default 64")
    p.add_argument("--max-queue", type=int, help="requests waiting per tenant at most (more: 429); default no cap")
    p.add_argument("--queue-timeout-s", type=float, help="a request waiting longer gets 503 with Retry-After")
    p.add_argument("--step-tol-ms", default="auto",
                   help="clustering tolerance of the decode-step reconstruction (ms, or 'auto')")
    p.add_argument("--health-interval-s", type=float, default=1.0, help="how often each upstream's /health is asked")
    p.add_argument("--upstream-api-key", help="sent to the upstreams as 'Authorization: Bearer KEY'")
    p.add_argument("--api-key", help="clients must send 'Authorization: Bearer KEY' (or a tenant's own key)")
    p.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1, loopback)")
    p.add_argument("--port", type=port_number, default=8080,
                   help="0..65535; 0 picks a free port (printed on the ready line); default 8080")
    p.add_argument("--no-events", action="store_true", help="keep no event log (/admin/events is then empty)")
    p.add_argument("--estimator", choices=["tokens", "words"],
                   help="estimate each answer's length (DriftSched's estimator, corrected by the answers; "
                        "counting tokens or whitespace words) and give sjf the budget; category from the "
                        "x-fairlib-category header, tier from the tenants file or x-fairlib-tier")
    p.add_argument("--estimator-key", choices=["category", "tier"], default="category",
                   help="what the estimator's bias factor follows (default category)")
    p.add_argument("--drain-timeout-s", type=float, default=30.0,
                   help="after SIGTERM/SIGINT/SIGHUP: take no new request (503) and let those waiting and in "
                        "flight end for at most this long, then stop (a second signal stops at once); default 30")


def config_from_args(a) -> GatewayConfig:
    engine = load_engine_params(a.cost_model) if a.cost_model else {}
    mi = a.max_inflight or [int(engine.get("max_batch") or 16)]
    pm = a.prefill_ms_per_token if a.prefill_ms_per_token is not None else float(engine.get("prefill_ms_per_token")
                                                                                  or 0.0)
    st = a.step_tol_ms
    if st != "auto":
        try:
            st = float(st)
        except ValueError:
            raise ValueError(f"--step-tol-ms must be 'auto' or a number of ms > 0, got {st!r}") from None
    params = dict(parse_policy_param(s) for s in a.policy_param)
    return GatewayConfig(upstreams=tuple(a.upstream), policy=a.policy, policy_params=params,
                         max_inflight=tuple(mi), tenants=load_tenants(a.tenants), max_tenants=a.max_tenants,
                         host=a.host, port=a.port, prefill_ms_per_token=pm, max_queue=a.max_queue,
                         queue_timeout_s=a.queue_timeout_s, step_tol_ms=st, health_interval_s=a.health_interval_s,
                         upstream_api_key=a.upstream_api_key or None, api_key=a.api_key or None,
                         record_events=not a.no_events, estimator=a.estimator, estimator_key=a.estimator_key,
                         drain_timeout_s=a.drain_timeout_s,
                         cost_model=({k: engine[k] for k in ("iter_base_ms", "iter_slope_ms", "prefill_ms_per_token",
                                                             "max_batch") if engine.get(k) is not None} or None))


def gateway_from_args(a) -> int:
    """``fairlib gateway``: the parsed options to a running gateway (until SIGINT, SIGTERM or SIGHUP,
    then a drain: exit 0, or 1 when the drain was cut). Errors are one line on stderr: a bad option (exit 2), a port that cannot be bound
    (exit 1), Ctrl-C before it listens (exit 130)."""
    try:
        cfg = config_from_args(a)
    except (ValueError, OSError) as e:
        print(f"fairlib gateway: {e}", file=sys.stderr, flush=True)
        return 2
    try:
        drained = serve_forever(cfg)
    except KeyboardInterrupt:
        print("fairlib gateway: interrupted (SIGINT) while starting; nothing served", file=sys.stderr, flush=True)
        return 130
    except OSError as e:
        why = "the port is in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
        print(f"fairlib gateway: cannot listen on {cfg.host}:{cfg.port}: {why} (--port: another port in 0..65535, "
              f"or 0 for a free one)", file=sys.stderr, flush=True)
        return 1
    return 0 if drained else 1
