"""The HTTP side of ``fairlib gateway``: an OpenAI-compatible reverse proxy whose admissions the
policy decides (fairlib/gateway/core.py).

Routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streamed or not), ``GET
/v1/models`` (passed through from the first healthy upstream), ``GET /health`` (200 while an
upstream takes requests: healthy and not drained, else 503), ``GET /metrics`` (Prometheus text, a ``tenant`` label), and on
loopback only: ``GET /admin/state`` (JSON), ``GET /admin/events`` (the policy's event log, JSON
lines; the first line is the gate's spec), ``POST /admin/policy`` (``{"policy": NAME, "params":
{...}}``: a new policy with fresh counters, only while idle, else 409), ``POST /admin/reset``
(fresh counters and log, same policy, while idle), ``POST /admin/upstreams`` (``{"upstream": I,
"drained": true}``: upstream I takes no new request, those in it run to their end; ``false`` puts
it back; a pool policy learns the replicas that take requests).

A request: its tenant from its API key (``Authorization: Bearer``) or, in an open gateway or for a
trusted key, ``x-llm-d-inference-fairness-id`` (or the older ``x-gateway-inference-fairness-id``;
fairlib/gateway/identity.py); prompt
tokens counted at admission (a token-id prompt exactly, text as whitespace words: an estimate
until the upstream's ``usage`` says); ``est_output_tokens`` (body field or ``x-fairlib-est-output-
tokens`` header; default ``max_tokens``) for sjf / vtc_predict / token_pool (its reservation: a
request without any is 400 there); ``priority`` and ``klass`` from the tenants file (the body's
``priority`` is a client's own claim: ignored, and not sent upstream). Upstream, every request is streamed with
``stream_options.include_usage`` so that the gateway sees each token: a client that asked for no
stream gets one JSON answer assembled from it, a client that did not ask for usage gets no usage
chunk. Answers the gateway makes itself are OpenAI error JSON: 400 (bad body), 401 (no or an
unknown key, no tenant), 403 (a key naming another tenant), 429 (queue cap, the policy: with ``Retry-After``), 502 (upstream unreachable or broken), 503 (no
healthy upstream, queue timeout, shutting down after a stop signal: with ``Retry-After``), and
every one carries ``x-fairlib-rejected-reason``. Each request is one access-log line. A stop signal (SIGTERM, SIGINT, SIGHUP) drains: no new
request, ``/health`` 503, those waiting and in flight run to their end (``--drain-timeout-s``).
An upstream's own error status and JSON are passed back as they are. Upstream, the tenant's name
goes as ``x-llm-d-inference-fairness-id`` and ``X-Tenant`` (for the engine's own logs; ``fairlib
serve`` tells tenants apart by the latter). A client that goes away
cancels its upstream request (the connection is closed) and frees the slot.
"""
from __future__ import annotations

import asyncio
import math
from typing import Optional

from aiohttp import web

from fairlib.client.http1 import ConnectError, Disconnected, HttpSession
from fairlib.gateway import credit
from fairlib.gateway.access_log import access_record, own_reason
from fairlib.gateway.admin import AdminRoutes
from fairlib.gateway.body import read_body_json
from fairlib.gateway.config import FAIRNESS_HEADERS
from fairlib.gateway.core import Gateway, Pending, Rejected
from fairlib.gateway.forward import Forwarding
from fairlib.gateway.health import mark
from fairlib.gateway.identity import BadTenantId, Forbidden, Unauthorized
from fairlib.gateway.relay import upstream_body
from fairlib.protocol.parse import parse_proxy_request, prompt_text
from fairlib.protocol.routes import OpenAIServer, bad_request, bearer, error_response
from fairlib.protocol.wire import BadRequest, error_type

__all__ = ["make_app", "GatewayApp", "GATEWAY", "LISTENING"]

GATEWAY = web.AppKey("gateway", Gateway)
#: called once the gateway listens: its health checks begin (a port that cannot be bound: none)
LISTENING = web.AppKey("listening", object)


class Answer(Exception):
    """An answer the gateway makes itself (an error JSON), raised from a step of a request's handling."""

    def __init__(self, response: web.Response):
        super().__init__(response.status)
        self.response = response


def refuse(status: int, message: str, type_: str, reason: str, param=None) -> web.Response:
    """An answer the gateway makes itself: OpenAI's error JSON and ``x-fairlib-rejected-reason``."""
    r = error_response(status, message, type_, param)
    r.headers["x-fairlib-rejected-reason"] = reason
    return r


def _reject(e: Rejected) -> web.Response:
    r = error_response(e.status, e.message, "RateLimitError" if e.status == 429 else error_type(e.status))
    r.headers["x-fairlib-rejected-reason"] = e.reason
    if e.retry_after_s is not None:
        r.headers["Retry-After"] = str(max(1, math.ceil(e.retry_after_s)))
    return r


class GatewayApp(AdminRoutes, Forwarding, OpenAIServer):
    """The gateway's HTTP handlers around one :class:`Gateway`: the OpenAI routes, relayed to the
    upstreams the policy admits to, and the loopback-only admin routes."""

    fault = "internal gateway error"

    def __init__(self, gw: Gateway):
        self.gw, self.cfg = gw, gw.cfg
        self._session: Optional[HttpSession] = None
        self.health_task: Optional[asyncio.Task] = None

    @property
    def session(self) -> HttpSession:
        """The session to the upstreams (opened by :meth:`on_startup`; a RuntimeError before)."""
        if self._session is None:
            raise RuntimeError("the gateway's upstream session opens when its app starts (on_startup)")
        return self._session

    def routes(self) -> list:
        """Called once by ``make_app``.
        Returns the OpenAI routes and the admin routes (these answer on loopback only)."""
        return [("POST", "/v1/completions", self.completions), ("POST", "/v1/chat/completions", self.chat),
                ("GET", "/v1/models", self.models), ("GET", "/health", self.health), ("GET", "/metrics", self.metrics),
                ("GET", "/admin/state", self.admin(self.admin_state)),
                ("GET", "/admin/events", self.admin(self.admin_events)),
                ("POST", "/admin/policy", self.admin(self.admin_policy)),
                ("POST", "/admin/reset", self.admin(self.admin_reset)),
                ("POST", "/admin/upstreams", self.admin(self.admin_upstreams))]

    async def on_startup(self, app: web.Application) -> None:
        """Called when the app starts, before it listens.
        Returns nothing; the upstream session is open."""
        self._session = HttpSession(timeout_s=self.cfg.request_timeout_s, connect_timeout_s=5.0)

    def listening(self) -> None:
        """Called once the gateway listens (``app[LISTENING]``): the health loop begins."""
        if self.health_task is None:
            self.health_task = asyncio.get_running_loop().create_task(self.health_loop())

    async def on_cleanup(self, app: web.Application) -> None:
        """Called when the app stops.
        Returns once the health loop is cancelled and the upstream session closed."""
        if self.health_task is not None:
            self.health_task.cancel()
        await self.session.close()
        gw = self.gw
        if self.health_task is not None:        # it listened: say that it stopped
            gw.log.event("exit", "info", "stopped", in_flight=gw.gate.in_flight, waiting=gw.gate.waiting,
                         stopped_in_flight=gw.cut_in_flight, served=sum(u.dispatched for u in gw.upstreams))
        gw.log.close()

    def upstream_headers(self, tenant: Optional[str] = None) -> dict:
        """Called for each request the gateway sends upstream (``tenant``: whom it is for).
        Returns its headers: JSON in, an event stream out, the upstream key, the tenant's name."""
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.cfg.upstream_api_key:
            h["Authorization"] = f"Bearer {self.cfg.upstream_api_key}"
        if tenant is not None:      # who it is for, for the engine's own logs (fairlib serve: X-Tenant)
            h[FAIRNESS_HEADERS[0]] = tenant
            h["X-Tenant"] = tenant
        return h

    async def health_loop(self) -> None:
        """Started with the app: asks each upstream's ``/health`` every ``health_interval_s``.
        Returns only when cancelled; marks each upstream healthy (any answer but a 5xx) or not."""
        gw, cfg = self.gw, self.cfg
        sess = HttpSession(timeout_s=max(1.0, cfg.health_interval_s), connect_timeout_s=1.0)
        first = True
        try:
            while True:
                for up in gw.upstreams:
                    ok, why = False, ""
                    try:            # any answer but a 5xx: an engine without /health answers 404
                        async with sess.get(up.root + "/health", headers=self.upstream_headers()) as r:
                            await r.read(1 << 16)
                            assert r.status is not None     # the session returns a response once its head came
                            ok = r.status < 500
                        why = f"its /health answered {r.status}"
                    except (OSError, TimeoutError, ConnectionError) as e:
                        ok, why = False, f"its /health did not answer ({type(e).__name__}: {e})"
                    if first and not ok:     # a start against an upstream that does not answer: said at once
                        why += f" at the gateway's start; asked again every {cfg.health_interval_s:g} s"
                    mark(gw, up, ok, why, at_once=first)
                first = False
                await asyncio.sleep(cfg.health_interval_s)
        finally:
            await sess.close()

    # --- a completions or chat request: admitted, queued, relayed ---------------------------------

    async def generate(self, request: web.Request, api: str) -> web.StreamResponse:
        """Called for each completions or chat request: its tenant found, parsed, queued by the policy.
        Returns the upstream's answer once a slot is free, or the gateway's own error JSON; one
        access-log line after it, however it ended (fairlib/gateway/access_log.py)."""
        note = {"tenant": None, "api": api, "stream": None, "upstream": None, "retried": False, "error": None}
        t0, resp, task = self.gw.clock(), None, asyncio.current_task()
        self.gw.handlers.add(task)
        try:
            resp = await self.answer(request, api, note)
            return resp
        finally:
            self.gw.handlers.discard(task)
            self.gw.log.access(access_record(self.gw, note, resp, t0))

    async def answer(self, request: web.Request, api: str, note: dict) -> web.StreamResponse:
        """Called by :meth:`generate`: the request's handling, ``note`` filled in for its log line."""
        try:
            if self.gw.stopping:
                raise Answer(self.shutting_down())
            tenant = self.identify(request)         # before the body: a stranger's body is not read
            note["tenant"] = self.gw.tenant_name(tenant)
            body = await read_body_json(request)
            req = parse_proxy_request(body, api, request.headers)
            note["stream"], note["prompt_tokens"] = req["stream"], req["prompt_tokens"]
            p = note["p"] = self.admit(request, body, req, tenant)
            data, body = upstream_body(body, consume=True), None     # held once: as it goes upstream
            up = await self.wait_for_slot(p)
        except BadRequest as e:
            return bad_request(e)
        except Answer as e:
            return e.response
        return await self.relay(request, api, data, req, p, up, note)

    def shutting_down(self) -> web.Response:
        """Called for a request that comes after a stop signal.
        Returns 503 with ``Retry-After: 1`` (the next replica, or this one after its restart)."""
        r = error_response(503, "the gateway is shutting down: it takes no new request", error_type(503))
        r.headers["Retry-After"] = "1"
        r.headers["x-fairlib-rejected-reason"] = "shutting_down"
        return r

    def identify(self, request: web.Request) -> int:
        """Called by :meth:`admit`: the tenant index of a request (fairlib/gateway/identity.py).
        Raises :class:`Answer` with its 400 (a bad tenant id), 401 (no or unknown key, no tenant) or
        403 (an untrusted key naming another tenant: counted under the key's tenant)."""
        gw = self.gw
        try:
            return gw.tenant_of(request.headers, bearer(request))
        except Unauthorized as e:
            raise Answer(refuse(401, str(e), "AuthenticationError", e.reason)) from None
        except Forbidden as e:
            gw.count_rejected(e.tenant, e.reason)
            raise Answer(refuse(403, str(e), "PermissionDeniedError", e.reason)) from None
        except BadTenantId as e:
            raise Answer(refuse(400, str(e), "BadRequestError", e.reason, "tenant")) from None

    def admit(self, request: web.Request, body: dict, req: dict, tenant: int) -> Pending:
        """Called by :meth:`generate` with a parsed request: who sends it, then the policy's queue.
        Returns it queued (``Pending``); raises :class:`Answer` with the 400, 401 or 429 that turns it away."""
        gw = self.gw
        tc = gw.tenant_config(tenant)
        prio = tc.priority if tc else 0         # the tenants file's, never the body's (a client's own claim)
        klass = tc.klass if tc else 0
        cat = tier = None
        if gw.estimator is not None:
            try:
                cat, tier = gw.estimator.describe(request.headers, prompt_text(body), tc.tier if tc else None)
            except ValueError as e:
                raise Answer(error_response(400, str(e), "BadRequestError", getattr(e, "param", None))) from None
        try:
            return gw.submit(tenant, req["prompt_tokens"], req["est"], klass, prio, req["max_tokens"], cat, tier)
        except Rejected as e:
            raise Answer(_reject(e)) from None
        except ValueError as e:      # e.g. a priority outside the levels the policy keeps
            raise Answer(error_response(400, str(e), "BadRequestError", getattr(e, "param", "priority"))) from None

    async def wait_for_slot(self, p: Pending):
        """Called by :meth:`generate` once the request waits in the policy's queue.
        Returns the upstream that dispatched it; raises :class:`Answer` (503 after ``queue_timeout_s``, or its rejection)."""
        gw, cfg = self.gw, self.cfg
        try:
            if cfg.queue_timeout_s is None:
                return await asyncio.shield(p.future)
            async with asyncio.timeout(cfg.queue_timeout_s):
                return await asyncio.shield(p.future)
        except TimeoutError:
            if p.future.done() and not p.future.cancelled() and p.future.exception() is None:
                return p.future.result()
            gw.withdraw(p, "queue_timeout")
            raise Answer(_reject(Rejected(503, "queue_timeout", f"waited {cfg.queue_timeout_s} s for a slot "
                                                                 f"(--queue-timeout-s)", cfg.queue_timeout_s))) from None
        except Rejected as e:
            raise Answer(_reject(e)) from None
        except asyncio.CancelledError:
            if p.future.done() and not p.future.cancelled() and p.future.exception() is None:
                gw.release(p)          # dispatched as the client left: it never reached the upstream
            else:
                gw.withdraw(p)
            raise

    # --- the other OpenAI routes ----------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        """Called for ``GET /v1/models``.
        Returns the first healthy upstream's answer as it came, else 503."""
        for up in self.gw.upstreams:
            if not up.healthy:
                continue
            try:
                async with self.session.get(up.url + "/models", headers=self.upstream_headers()) as r:
                    raw = await r.read(1 << 20)
                    assert r.status is not None     # the session returns a response once its head came
                    return web.Response(body=raw, status=r.status, content_type="application/json")
            except (ConnectError, Disconnected, TimeoutError, OSError):
                continue
        return error_response(503, "no healthy upstream answered /v1/models", error_type(503))

    async def health(self, request: web.Request) -> web.Response:
        """Called for ``GET /health``.
        Returns 200 while an upstream takes requests (healthy, not drained) and no stop signal came, else 503."""
        gw = self.gw
        if gw.stopping:
            return error_response(503, "the gateway is shutting down", error_type(503))
        if any(u.available for u in gw.upstreams):
            return web.Response(status=200)
        return error_response(503, "no upstream takes requests (unhealthy or drained)", error_type(503))

    async def metrics(self, request: web.Request) -> web.Response:
        """Called for ``GET /metrics``.
        Returns the gateway's metrics (fairlib/gateway/metrics.py) as prometheus_client writes them,
        in the text format followed by ``gw.extra_metrics()`` where set (Envoy's stats)."""
        body, ctype = self.gw.render_metrics(request.headers.get("Accept"))
        extra = self.gw.extra_metrics
        if extra is not None and ctype.startswith("text/plain"):     # families of the data plane's own
            body += await asyncio.get_running_loop().run_in_executor(None, extra)
        return web.Response(body=body, headers={"Content-Type": ctype})


async def _name_the_reason(request: web.Request, resp: web.StreamResponse) -> None:
    """Every answer the gateway makes itself, aiohttp's own 404/405/413 included, names why."""
    reason = own_reason(resp)
    if reason is not None and "x-fairlib-rejected-reason" not in resp.headers:
        resp.headers["x-fairlib-rejected-reason"] = reason


def make_app(gw: Gateway) -> web.Application:
    """The aiohttp application of the gateway ``gw`` (``app[GATEWAY]``)."""
    ga = GatewayApp(gw)
    app = ga.make_app()
    app[LISTENING] = ga.listening
    app.on_response_prepare.append(_name_the_reason)
    app[GATEWAY] = gw
    credit.attach(app, gw, ga.upstream_headers())
    return app
