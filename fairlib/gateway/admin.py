"""The gateway's admin routes (loopback only): its state, the policy's event log, switching the
policy, resetting it, draining an upstream.

A browser on the operator's machine is on loopback too, so a page it shows could POST to these
routes (a "simple" cross-site request: ``text/plain``, no preflight). A POST is therefore taken
only with a JSON content type (which a cross-site page cannot send without a CORS preflight, which
the gateway never answers) and without a foreign ``Origin`` or a ``Sec-Fetch-Site: cross-site``
(403 otherwise). ``GET /admin/events`` streams the log in pieces, yielding to the event loop
between them, so a long log never stalls the requests in flight; the log is kept only with
``--events`` (it grows with every streamed token: off by default).
"""
from __future__ import annotations

import asyncio
import ipaddress
from urllib.parse import urlsplit

from aiohttp import web

from fairlib.gateway.core import Gateway
from fairlib.protocol.routes import error_response
from fairlib.protocol.wire import dumps

__all__ = ["AdminRoutes", "loopback", "same_origin", "EVENTS_CHUNK"]

#: events per piece of ``/admin/events`` (one write, then the loop runs the others)
EVENTS_CHUNK = 2000


def loopback(request: web.Request) -> bool:
    """The request came from a loopback address."""
    try:
        return ipaddress.ip_address((request.remote or "").split("%")[0]).is_loopback
    except ValueError:
        return False


def same_origin(request: web.Request) -> bool:
    """No ``Origin`` (not a browser's cross-site request), or one naming this very host and port,
    and no ``Sec-Fetch-Site`` saying cross-site."""
    if request.headers.get("Sec-Fetch-Site", "").lower() in ("cross-site", "same-site"):
        return False
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and bool(parts.netloc) and parts.netloc.lower() == request.host.lower()


def _refuse(status: int, message: str, reason: str) -> web.Response:
    r = error_response(status, message, "PermissionDeniedError" if status == 403 else "UnsupportedMediaTypeError")
    r.headers["x-fairlib-rejected-reason"] = reason
    return r


class AdminRoutes:
    """The admin handlers of :class:`fairlib.gateway.app.GatewayApp` (``self.gw``: the gateway)."""

    gw: Gateway

    @staticmethod
    def admin(fn):
        """Called once per admin route by ``routes``.
        Returns ``fn`` guarded: off loopback 403; a POST without a JSON content type 415, with a
        foreign Origin 403."""
        async def guarded(request):
            if not loopback(request):
                return _refuse(403, "the admin routes answer on loopback only", "admin_loopback_only")
            if request.method == "POST":
                if request.content_type != "application/json":
                    return _refuse(415, "an admin POST needs 'Content-Type: application/json'", "admin_content_type")
                if not same_origin(request):
                    return _refuse(403, f"an admin POST from another origin ({request.headers.get('Origin')!r}) "
                                        f"is refused", "admin_foreign_origin")
            return await fn(request)
        return guarded

    async def admin_state(self, request: web.Request) -> web.Response:
        """Called for ``GET /admin/state``.
        Returns the gateway's state (policy, tenants, upstreams, counts) as JSON."""
        return web.json_response(self.gw.state())

    async def admin_events(self, request: web.Request) -> web.StreamResponse:
        """Called for ``GET /admin/events``.
        Returns the policy's event log as JSON lines, the first the gate's spec and the tenants,
        streamed :data:`EVENTS_CHUNK` events at a time (the log as it was when the request came)."""
        gw = self.gw
        log, n = gw.gate.log, len(gw.gate.log)
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write((dumps({"spec": gw.gate.spec, "tenants": gw.names}) + "\n").encode())
        for i in range(0, n, EVENTS_CHUNK):
            piece = "".join(dumps(e) + "\n" for e in log[i:min(n, i + EVENTS_CHUNK)])
            await resp.write(piece.encode())
            await asyncio.sleep(0)          # the requests in flight run between two pieces
        await resp.write_eof()
        return resp

    @staticmethod
    async def json_body(request: web.Request):
        """Called by the admin routes that take a body.
        Returns ``(the JSON body, None)``, or ``(None, the 400 to answer)`` when it is not JSON."""
        try:
            return await request.json(), None
        except ValueError as e:
            r = error_response(400, f"the body is not JSON: {e}", "BadRequestError")
            r.headers["x-fairlib-rejected-reason"] = "bad_request"
            return None, r

    async def admin_policy(self, request: web.Request) -> web.Response:
        """Called for ``POST /admin/policy`` (``{"policy": NAME, "params": {...}}``).
        Returns the new state once the policy is switched (fresh counters), 409 unless idle, 400 for a bad one."""
        body, bad = await self.json_body(request)
        if bad is not None:
            return bad
        if not isinstance(body, dict) or not isinstance(body.get("policy"), str):
            return error_response(400, "send {\"policy\": NAME, \"params\": {...}}", "BadRequestError", "policy")
        params = body.get("params") or {}
        if not isinstance(params, dict):
            return error_response(400, "'params' must be an object", "BadRequestError", "params")
        try:
            self.gw.switch_policy(body["policy"], params)
        except RuntimeError as e:
            return error_response(409, str(e), "ConflictError")
        except (ValueError, TypeError) as e:
            return error_response(400, str(e), "BadRequestError", "policy")
        return web.json_response(self.gw.state())

    async def admin_upstreams(self, request: web.Request) -> web.Response:
        """Called for ``POST /admin/upstreams`` (``{"upstream": I, "drained": true | false}``).
        Returns the new state once upstream I is drained or back, 400 for a bad body."""
        body, bad = await self.json_body(request)
        if bad is not None:
            return bad
        if not isinstance(body, dict) or not isinstance(body.get("drained"), bool):
            return error_response(400, "send {\"upstream\": INDEX, \"drained\": true | false}", "BadRequestError",
                                  "drained")
        try:
            self.gw.drain(body.get("upstream"), body["drained"])
        except ValueError as e:
            return error_response(400, str(e), "BadRequestError", "upstream")
        return web.json_response(self.gw.state())

    async def admin_reset(self, request: web.Request) -> web.Response:
        """Called for ``POST /admin/reset``.
        Returns the new state once the counters and log are fresh (same policy), 409 unless idle."""
        try:
            self.gw.switch_policy(self.gw.policy_name, self.gw.policy_params)
        except RuntimeError as e:
            return error_response(409, str(e), "ConflictError")
        return web.json_response(self.gw.state())
