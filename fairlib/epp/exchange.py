"""One request's life in the endpoint picker: the phases Envoy sends over one ``ext_proc`` stream.

Every decision is the Python gateway's own, called on the same objects (no second copy of a
policy or of a rejection): :class:`~fairlib.gateway.app.GatewayApp`'s ``identify`` (401, 403,
400), ``admit`` (the policy's ``accept``, the queue cap: 429 with ``Retry-After``) and
``wait_for_slot`` (the waiting line, the queue timeout), then ``Gateway``'s charge and release.

1. request headers: the tenant (its key or fairness header, with the gateway's trust rules); a
   stop signal came: 503 ``shutting_down``;
2. request body (buffered): parsed as the gateway parses it, queued; the answer is held until the
   policy admits it, then sent with :data:`~fairlib.epp.bootstrap.DEST_HEADER` = the upstream's
   ``host:port``, the tenant's headers for the engine, the client's key removed (the upstream's
   own key set when there is one) and the body's ``priority`` dropped (the tenants file's counts);
3. response headers: the upstream's status and content type;
4. response body chunks: an event stream is read by the gateway's own
   :class:`~fairlib.gateway.relay.Relay` (tokens, ``usage``, ``finish_reason`` charged in one
   charge per chunk, nothing written); one JSON answer is charged at its end from its ``usage``;
5. the body's end, or the stream closing first (the client reset), frees the slot.

A refusal is an ``ImmediateResponse`` with the gateway's own status, headers (``x-fairlib-
rejected-reason``, ``Retry-After``) and OpenAI error JSON body.
"""
from __future__ import annotations

import json
from typing import Optional
from urllib.parse import urlsplit

from multidict import CIMultiDict

from fairlib.gateway.access_log import UPSTREAM_ANSWER, access_record
from fairlib.gateway.app import Answer, GatewayApp
from fairlib.gateway.core import Pending, Upstream
from fairlib.gateway.relay import Relay
from fairlib.protocol.parse import answer_text, answer_tokens, parse_proxy_request
from fairlib.protocol.routes import MAX_BODY_BYTES, bad_request
from fairlib.protocol.wire import BadRequest
from fairlib.epp import messages as m
from fairlib.epp.bootstrap import DEST_HEADER

__all__ = ["Exchange", "Headers"]

_APIS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}


class Headers:
    """What the gateway's handlers read of a request (``request.headers``), from Envoy's header map."""

    def __init__(self, header_map):
        self.headers = CIMultiDict()
        for h in header_map.headers:
            self.headers.add(h.key, h.raw_value.decode("utf-8", "surrogateescape") if h.raw_value else h.value)


class _Status:
    """The access log's view of an answer that passed through Envoy (status; upstream's own or not)."""

    def __init__(self, status: int, upstream: bool):
        self.headers: dict = {}
        self.status, self._up = status, upstream

    def get(self, key, default=None):
        return self._up if key is UPSTREAM_ANSWER else default


class Exchange:
    """The state of one ``ext_proc`` stream (one HTTP request through Envoy)."""

    def __init__(self, ga: GatewayApp):
        self.ga, self.gw = ga, ga.gw
        self.request: Optional[Headers] = None
        self.api: Optional[str] = None
        self.p: Optional[Pending] = None
        self.up: Optional[Upstream] = None
        self.relay: Optional[Relay] = None
        self.status: Optional[int] = None
        self.sse = False
        self.body = bytearray()         # a JSON answer, kept until its end
        self.released = False
        self.t0 = self.gw.clock()
        self.note: dict = {"tenant": None, "api": None, "stream": None, "upstream": None, "retried": False, "error": None}
        self.answer = None              # what the access log says was answered (None: the client left)

    # --- the request ---------------------------------------------------------------------------
    def on_request_headers(self, msg):
        """Phase 1: refuse (shutting down, no tenant, a bad key) or read on."""
        self.request = Headers(msg.headers)
        path = self.request.headers.get(":path", "").split("?", 1)[0]
        self.api = self.note["api"] = _APIS.get(path)
        if self.gw.stopping:
            return self.refuse(self.ga.shutting_down())
        if self.api is None:          # the bootstrap routes only the completions paths here
            return self.refuse(bad_request(BadRequest(f"the endpoint picker serves {sorted(_APIS)}, not {path!r}",
                                                      status=404, type_="NotFoundError")))
        try:
            tenant = self.ga.identify(self.request)
        except Answer as e:
            return self.refuse(e.response)
        self.tenant = tenant
        self.note["tenant"] = self.gw.tenant_name(tenant)
        if msg.end_of_stream:
            return self.refuse(bad_request(BadRequest("the request body must be a JSON object")))
        return m.headers_continue(request=True)

    async def on_request_body(self, msg):
        """Phase 2: parsed and queued; answered once admitted (the upstream chosen) or refused."""
        try:
            if len(msg.body) > MAX_BODY_BYTES:
                raise BadRequest(f"the request body is over {MAX_BODY_BYTES} bytes", status=413)
            try:
                body = json.loads(msg.body)
            except (ValueError, RecursionError):
                raise BadRequest("the request body is not valid JSON") from None
            req = parse_proxy_request(body, self.api, self.request.headers)
            self.note["stream"], self.note["prompt_tokens"] = req["stream"], req["prompt_tokens"]
            self.p = self.note["p"] = self.ga.admit(self.request, body, req, self.tenant)
            self.up = await self.ga.wait_for_slot(self.p)
        except BadRequest as e:
            return self.refuse(bad_request(e))
        except Answer as e:
            return self.refuse(e.response)
        self.note["upstream"] = self.up.url
        self.relay = Relay(self.gw, self.p, self.api, False, req["include_usage"])
        return self.dispatch(body)

    def dispatch(self, body: dict):
        """The body phase's answer for an admitted request: where it goes and what it carries."""
        # admitted: its headers read, its upstream chosen
        assert self.up is not None and self.p is not None and self.request is not None
        u = urlsplit(self.up.url)
        dest = u.netloc.rsplit("@", 1)[-1]
        h = {k: v for k, v in self.ga.upstream_headers(self.gw.tenant_name(self.p.tenant)).items()
             if k not in ("Content-Type", "Accept")}
        h[DEST_HEADER] = dest
        path = self.request.headers.get(":path", "")
        base = u.path.rstrip("/")
        if base != "/v1":             # an upstream under another prefix: the path follows it
            h[":path"] = base + path[len("/v1"):]
        remove = [] if "Authorization" in h else ["authorization"]
        new_body = None
        if "priority" in body:        # a client's claim: the tenants file's priority counts
            b = dict(body)
            b.pop("priority")
            new_body = json.dumps(b, separators=(",", ":")).encode()
            h["content-length"] = str(len(new_body))
        return m.body_continue(h, remove, new_body, dest)

    # --- the response --------------------------------------------------------------------------
    def on_response_headers(self, msg):
        """Phase 3: the upstream's status and content type."""
        hs = Headers(msg.headers).headers
        self.status = int(hs.get(":status", "0") or 0)
        self.sse = self.status == 200 and hs.get("content-type", "").startswith("text/event-stream")
        self.answer = _Status(self.status, self.status != 200)
        if msg.end_of_stream:
            self.finish()
        return m.headers_continue(request=False)

    def on_response_body(self, msg):
        """Phase 4: one chunk charged; the last one frees the slot."""
        if self.p is not None and self.p.upstream is not None and not self.released:
            if self.sse:
                self.relay.on_data(msg.body, self.gw.clock())
            elif self.status == 200 and len(self.body) < MAX_BODY_BYTES:
                self.body += msg.body
        if msg.end_of_stream:
            self.finish()
        return m.body_response()

    def finish(self) -> None:
        """The answer ended: a JSON answer is charged from its usage; the slot is free."""
        if self.released or self.p is None or self.p.upstream is None:
            return
        gw, p = self.gw, self.p
        if self.sse and self.relay is not None:
            self.relay.feed_estimator()
            if not (self.relay.done or self.relay.finish_reason):
                self.note["error"] = "the stream ended without [DONE]"
        elif self.status == 200:
            try:
                obj = json.loads(bytes(self.body))
            except ValueError:
                obj = None
            n = answer_tokens(obj)
            gw.tokens(p, gw.now_ms(), n, True)
            gw.answered(p, answer_text(obj) if isinstance(obj, dict) else "", n)
        self.release()

    def release(self) -> None:
        if not self.released and self.p is not None:
            self.released = True
            self.gw.release(self.p)

    def refuse(self, resp):
        """An answer the gateway makes itself, as Envoy's immediate response."""
        self.answer = resp
        return m.immediate(resp.status, dict(resp.headers), resp.body)

    def close(self) -> None:
        """The ext_proc stream ended (the answer's end, or the client or Envoy reset it): a slot
        still held is freed, and the request's access-log line is written."""
        self.release()
        if self.request is not None:
            self.gw.log.access(access_record(self.gw, self.note, self.answer, self.t0))
