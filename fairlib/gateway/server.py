"""Starting and stopping ``fairlib gateway``: in the foreground (the CLI), in a background thread
(tests), or in a child process (chapters, benchmarks), and its command-line arguments."""
from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Optional

try:            # a pinned requirement (not on Windows): --event-loop uvloop
    import uvloop
except ImportError:         # pragma: no cover
    uvloop = None  # type: ignore[assignment]

from fairlib.gateway.app import GATEWAY, LISTENING, make_app
from fairlib.gateway.config import EVENT_LOOPS, GatewayConfig, load_tenants
from fairlib.gateway.core import Gateway
from fairlib.gateway.identity import KEY_ENV, UPSTREAM_KEY_ENV, read_key
from fairlib.servers import ChildServer, LocalServer, ThreadServer, port_number, run_from_args, run_until_signal, start_app
from fairlib.sim.credit import DEFAULT_INTERVAL_S, DEFAULT_START, CreditOptions
from fairlib.sim.engine import load_engine_params
from fairlib.sim.policies import parse_policy_param

__all__ = ["READY_PREFIX", "start", "serve_forever", "GatewayThread", "GatewayProcess", "add_arguments",
           "config_from_args", "gateway_from_args", "drain"]

READY_PREFIX = "fairlib gateway: listening on "


async def start(cfg: GatewayConfig):
    """Bind and start (then the health checks begin); returns ``(runner, port)``
    (``runner.app[GATEWAY]`` is the gateway)."""
    runner, port = await start_app(make_app(Gateway(cfg)), cfg.host, cfg.port)
    runner.app[LISTENING]()
    return runner, port


def describe(cfg: GatewayConfig, port: int) -> str:
    params = f" {cfg.policy_params}" if cfg.policy_params else ""
    what = "slots" if cfg.credit is None else "slots to start, auto"
    ups = ", ".join(f"{u} ({m} {what})" for u, m in zip(cfg.upstreams, cfg.max_inflight))
    tenants = "open" if cfg.tenants.is_open else f"{len(cfg.tenants.tenants)} tenants"
    return f"{READY_PREFIX}http://{cfg.host}:{port}/v1 (policy {cfg.policy}{params}; {tenants}; upstreams {ups})"


async def drain(runner, timeout_s: float) -> bool:
    """After a stop signal: take no new request (503 with Retry-After, ``/health`` 503) and wait
    up to ``timeout_s`` for those waiting and in flight to end (their streams run to the end).
    Returns whether they all ended; when not (the timeout, or a second signal: this task is
    cancelled), the requests still running are cancelled at once, so the exit follows within a
    fraction of a second. A line at the start and at the end says what was in flight."""
    gw = runner.app[GATEWAY]
    gw.stopping = True
    gw.log.event("drain_start", "info", f"a stop signal: draining (new requests get 503) for at most {timeout_s:g} s",
                 in_flight=gw.gate.in_flight, waiting=gw.gate.waiting)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        while not gw.idle() and loop.time() < deadline:
            await asyncio.sleep(min(0.02, max(0.0, deadline - loop.time())))
    except asyncio.CancelledError:
        cut(gw, "a second stop signal")
        raise
    if not gw.idle():
        cut(gw, f"{timeout_s:g} s of draining")
        return False
    gw.log.event("drain_end", "info", "drained: nothing in flight or waiting", in_flight=0, waiting=0)
    return True


def cut(gw: Gateway, why: str) -> None:
    """End a drain now: a warning line with what is still in flight, and every request handler
    still running cancelled (its upstream connection closed: the engine aborts it)."""
    gw.log.event("drain_cut", "warning", f"{gw.gate.in_flight} in flight and {gw.gate.waiting} waiting after {why}: "
                 f"stopping them", in_flight=gw.gate.in_flight, waiting=gw.gate.waiting)
    gw.cut_in_flight = gw.gate.in_flight + gw.gate.waiting
    for task in list(gw.handlers):
        task.cancel()


def serve_forever(cfg: GatewayConfig, announce: bool = True) -> bool:
    """Run until SIGINT/SIGTERM/SIGHUP, then drain (:func:`drain`, ``cfg.drain_timeout_s``; a
    second signal stops at once). Prints one ready line (``READY_PREFIX`` + base URL). Returns
    whether the drain finished."""
    return run_until_signal(lambda: start(cfg), (lambda port: describe(cfg, port)) if announce else None,
                            drain=lambda runner: drain(runner, cfg.drain_timeout_s),
                            loop_factory=loop_factory(cfg.event_loop))


def loop_factory(event_loop: str):
    """The ``asyncio.Runner`` loop factory for ``--event-loop`` (None: the standard library's)."""
    if event_loop == "asyncio":
        return None
    if uvloop is None:
        raise ValueError("--event-loop uvloop: uvloop is not installed (pip install uvloop, or --event-loop asyncio)")
    return uvloop.new_event_loop


class _Control(LocalServer):
    """The control app of ``--data-plane envoy`` (loopback): where ``/admin/*`` answers."""

    def __init__(self, port: int):
        self.port = port


class _Admin(LocalServer):
    """The gateway's JSON routes, from the caller's side (on a :class:`~fairlib.servers.LocalServer`:
    its ``get_json``, ``get_text``, ``request``); under ``--data-plane envoy`` on the control app,
    since Envoy's listener does not serve ``/admin/*``."""

    #: the Envoy plane's control app, where ``/admin/*`` answers (None: the Python plane, this server)
    control_port: Optional[int] = None

    @property
    def admin(self) -> LocalServer:
        """The server that answers ``/admin/*``: this one, or the Envoy plane's control app."""
        return self if self.control_port is None else _Control(self.control_port)

    def state(self) -> dict:
        return self.admin.get_json("/admin/state")

    def events(self) -> tuple:
        """``(head, events)``: the gate's spec and tenant names, and the event log."""
        lines = self.admin.get_text("/admin/events").splitlines()
        return json.loads(lines[0]), [json.loads(x) for x in lines[1:] if x]

    def metrics(self) -> str:
        return self.get_text("/metrics")

    def drain(self, upstream: int, drained: bool = True) -> dict:
        """Take upstream ``upstream`` out (no new requests) or put it back (``/admin/upstreams``)."""
        body = json.dumps({"upstream": upstream, "drained": drained}).encode()
        with self.admin.request("/admin/upstreams", body) as r:
            return json.loads(r.read())

    def set_policy(self, policy: str, params: Optional[dict] = None) -> dict:
        """A new policy (fresh counters and log) between runs (``/admin/policy``)."""
        body = json.dumps({"policy": policy, "params": params or {}}).encode()
        with self.admin.request("/admin/policy", body) as r:
            return json.loads(r.read())


class GatewayThread(_Admin, ThreadServer):
    """The gateway on its own event loop in a background thread of this process (tests)."""

    name = "fairlib-gateway"

    def __init__(self, cfg: GatewayConfig):
        self.cfg = cfg
        super().__init__(lambda: start(self.cfg))

    @property
    def gateway(self) -> Gateway:
        return self.runner.app[GATEWAY]


class GatewayProcess(_Admin, ChildServer):
    """``fairlib gateway`` in a child process (``python -m fairlib.cli gateway --port 0 ARGS``);
    ``start()`` waits for the ready line, ``stop()`` sends SIGTERM (then kills); it dies with its
    parent. ``cpu``: pin it to one core."""

    command, ready_prefix = "gateway", READY_PREFIX

    def start(self):
        super().start()
        line = self.ready_line or ""
        if "[data plane envoy; control http://127.0.0.1:" in line:
            self.control_port = int(line.split("control http://127.0.0.1:", 1)[1].split(";", 1)[0])
        return self


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
    p.add_argument("--max-inflight", action="append", default=[], metavar="N|auto",
                   help="requests in each upstream at most: 'auto' (the default) learns a credit per upstream "
                        "from its /metrics (waiting and running requests), starting from the limit the engine "
                        "states (vLLM max_num_seqs, llama.cpp total_slots), else the --cost-model's max_batch, "
                        "else --credit-start; an integer is a fixed cap (its max_num_seqs), once for all or "
                        "once per --upstream")
    p.add_argument("--credit-start", type=int, help="--max-inflight auto: the credit's start when neither the "
                                                    "engine nor --cost-model states a limit (default 16)")
    p.add_argument("--credit-headroom", type=int, default=1,
                   help="--max-inflight auto: requests allowed to wait inside the engine, >= 1 (h: the credit "
                        "settles at the engine's batch + h); default 1")
    p.add_argument("--credit-interval-s", type=float, default=DEFAULT_INTERVAL_S,
                   help=f"--max-inflight auto: seconds between reads of each upstream's /metrics (default "
                        f"{DEFAULT_INTERVAL_S:g})")
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
    _add_key_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1, loopback)")
    p.add_argument("--port", type=port_number, default=8080,
                   help="0..65535; 0 picks a free port (printed on the ready line); default 8080")
    ev = p.add_mutually_exclusive_group()
    ev.add_argument("--events", action="store_true",
                    help="keep the policy's event log for /admin/events (the replay and the chapters read it); it "
                         "grows with every streamed token (~0.5 kB each): for experiments, not for a long-running "
                         "gateway")
    ev.add_argument("--no-events", action="store_true", help="keep no event log (the default)")
    p.add_argument("--upstream-idle-timeout-s", type=float, default=60.0,
                   help="an upstream read that brings no byte for this long ends the request (502, or an error "
                        "event mid-stream), frees its slot and takes the upstream out until its health check "
                        "passes; default 60")
    p.add_argument("--tenant-max-share", type=float, default=0.9, metavar="F",
                   help="one tenant holds at most max(1, min(slots - 1, floor(F x slots))) slots, under any policy, "
                        "so that one tenant's stalled streams cannot take them all; its other requests wait in "
                        "its own line; 1: no cap; default 0.9")
    p.add_argument("--access-log", default="-", metavar="FILE",
                   help="one JSON line per request (tenant, upstream, status, queue wait, TTFT, tokens, reason; "
                        "never a key or a prompt) to FILE, '-' for stderr (the default) or 'off'")
    p.add_argument("--event-loop", choices=list(EVENT_LOOPS), default="asyncio",
                   help="the event loop the gateway runs on: asyncio (the standard library's, the default) or "
                        "uvloop (libuv's)")
    p.add_argument("--estimator", choices=["tokens", "words"],
                   help="estimate each answer's length (DriftSched's estimator, corrected by the answers; "
                        "counting tokens or whitespace words) and give sjf the budget; category from the "
                        "x-fairlib-category header, tier from the tenants file or x-fairlib-tier")
    p.add_argument("--estimator-key", choices=["category", "tier"], default="category",
                   help="what the estimator's bias factor follows (default category)")
    p.add_argument("--drain-timeout-s", type=float, default=30.0,
                   help="after SIGTERM/SIGINT/SIGHUP: take no new request (503) and let those waiting and in "
                        "flight end for at most this long, then stop (a second signal stops at once); default 30")


def _add_key_arguments(p) -> None:
    """The keys: the upstreams', the clients' (``--api-key``) and whose fairness header is trusted."""
    p.add_argument("--upstream-api-key", help="sent to the upstreams as 'Authorization: Bearer KEY' (visible in "
                                              f"ps: prefer --upstream-api-key-file or ${UPSTREAM_KEY_ENV})")
    p.add_argument("--upstream-api-key-file", metavar="FILE", help="the upstream key: the file's first line")
    p.add_argument("--api-key", help="clients must send 'Authorization: Bearer KEY' (or a tenant's own key); it "
                                     "names the default tenant (visible in ps: prefer --api-key-file or "
                                     f"${KEY_ENV})")
    p.add_argument("--api-key-file", metavar="FILE", help="the --api-key: the file's first line")
    p.add_argument("--trust-api-key", action="store_true",
                   help="the --api-key is a front proxy's: its requests' fairness header names the tenant")


def inflight_from_args(a, engine: dict) -> tuple:
    """``(max_inflight, credit options or None, credit start)`` from ``--max-inflight`` (integers:
    fixed caps; absent or 'auto': a credit), ``--credit-start``, ``--credit-interval-s`` and the
    cost model's ``max_batch``."""
    vals = [str(v).strip().lower() for v in a.max_inflight] or ["auto"]
    start = a.credit_start if a.credit_start is not None else int(engine.get("max_batch") or DEFAULT_START)
    if vals == ["auto"]:
        return ("auto",), CreditOptions(headroom=a.credit_headroom, interval_s=a.credit_interval_s), start
    try:
        return tuple(int(v) for v in vals), None, start
    except ValueError:
        raise ValueError(f"--max-inflight must be 'auto' or integers >= 1 (once, or once per --upstream), "
                         f"got {a.max_inflight}") from None


def config_from_args(a) -> GatewayConfig:
    engine = load_engine_params(a.cost_model) if a.cost_model else {}
    mi, credit, start = inflight_from_args(a, engine)
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
                         credit=credit, credit_start=start,
                         upstream_api_key=read_key(a.upstream_api_key, a.upstream_api_key_file, UPSTREAM_KEY_ENV,
                                                   "upstream-api-key"),
                         api_key=read_key(a.api_key, a.api_key_file, KEY_ENV, "api-key"), trust_api_key=a.trust_api_key,
                         record_events=a.events, upstream_idle_timeout_s=a.upstream_idle_timeout_s,
                         access_log=None if a.access_log == "off" else a.access_log,
                         tenant_max_share=a.tenant_max_share, estimator=a.estimator, estimator_key=a.estimator_key,
                         drain_timeout_s=a.drain_timeout_s, event_loop=a.event_loop,
                         cost_model=({k: engine[k] for k in ("iter_base_ms", "iter_slope_ms", "prefill_ms_per_token",
                                                             "max_batch") if engine.get(k) is not None} or None))


def gateway_from_args(a) -> int:
    """``fairlib gateway``: the parsed options to a running gateway (until SIGINT, SIGTERM or
    SIGHUP, then a drain: exit 0, or 1 when the drain was cut). Errors are one line on stderr: a
    bad option (exit 2), a port that cannot be bound (exit 1), Ctrl-C before it listens (exit 130).
    A cut drain (exit 1) ends the process at once, its output flushed: the interpreter's own
    teardown (1-2 s with the compiled kernels loaded) would make the drain timeout and the second
    signal late by that much."""
    code = run_from_args("fairlib gateway", a, config_from_args, serve_forever, (ValueError, OSError))
    if code == 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
