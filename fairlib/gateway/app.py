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

A request: its tenant from ``x-llm-d-inference-fairness-id`` (or the older
``x-gateway-inference-fairness-id``) or a tenant's API key (``Authorization: Bearer``); prompt
tokens counted at admission (a token-id prompt exactly, text as whitespace words: an estimate
until the upstream's ``usage`` says); ``est_output_tokens`` (body field or ``x-fairlib-est-output-
tokens`` header; default ``max_tokens``) for sjf / vtc_predict / token_pool (its reservation: a
request without any is 400 there); ``priority`` (body, vLLM's field)
or the tenant's, ``klass`` from the tenant. Upstream, every request is streamed with
``stream_options.include_usage`` so that the gateway sees each token: a client that asked for no
stream gets one JSON answer assembled from it, a client that did not ask for usage gets no usage
chunk. Answers the gateway makes itself are OpenAI error JSON: 400 (bad body), 401 (no tenant),
429 (queue cap, the policy: with ``Retry-After``), 502 (upstream unreachable or broken), 503 (no
healthy upstream, queue timeout, shutting down after a stop signal: with ``Retry-After``), and
carry ``x-fairlib-rejected-reason``. A stop signal (SIGTERM, SIGINT, SIGHUP) drains: no new
request, ``/health`` 503, those waiting and in flight run to their end (``--drain-timeout-s``).
An upstream's own error status and JSON are passed back as they are. Upstream, the tenant's name
goes as ``x-llm-d-inference-fairness-id`` and ``X-Tenant`` (for the engine's own logs; ``fairlib
serve`` tells tenants apart by the latter). A client that goes away
cancels its upstream request (the connection is closed) and frees the slot.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import time
from typing import Optional

from aiohttp import web

from fairlib.client.http1 import ConnectError, Disconnected, HttpSession
from fairlib.client.sse import DONE, MalformedSSE, SSEParser, StreamError, decode_event, interpret_chunk
from fairlib.gateway.config import FAIRNESS_HEADERS
from fairlib.gateway.core import Gateway, Pending, Rejected, Unauthorized
from fairlib.serve.app import (
    BadRequest,
    error_response,
    error_type,
    messages_length,
    openai_error_middleware,
    prompt_length,
)

__all__ = ["make_app", "GATEWAY", "MAX_BODY_BYTES"]

GATEWAY = web.AppKey("gateway", Gateway)
MAX_BODY_BYTES = 64 * 2 ** 20
ROUTES = ("POST /v1/completions", "POST /v1/chat/completions", "GET /v1/models", "GET /health", "GET /metrics",
          "GET /admin/state", "GET /admin/events", "POST /admin/policy", "POST /admin/reset", "POST /admin/upstreams")
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_DONE = b"data: [DONE]\n\n"


def _reject(e: Rejected) -> web.Response:
    r = error_response(e.status, e.message, "RateLimitError" if e.status == 429 else error_type(e.status))
    r.headers["x-fairlib-rejected-reason"] = e.reason
    if e.retry_after_s is not None:
        r.headers["Retry-After"] = str(max(1, math.ceil(e.retry_after_s)))
    return r


def _loopback(request: web.Request) -> bool:
    try:
        return ipaddress.ip_address((request.remote or "").split("%")[0]).is_loopback
    except ValueError:
        return False


def _int_field(body: dict, name: str, low: int):
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise BadRequest(f"'{name}' must be an integer >= {low}, got {v!r}", name)
    return v


def parse_body(body, api: str, headers) -> dict:
    """What the gateway reads of a completions/chat body: prompt tokens (exact for token ids, else
    whitespace words), max_tokens, the estimate, priority, stream and include_usage."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if api == "chat":
        if "messages" not in body:
            raise BadRequest("'messages' is required", "messages")
        prompt_tokens = messages_length(body["messages"])
        mt = _int_field(body, "max_completion_tokens", 1)
        if mt is None:
            mt = _int_field(body, "max_tokens", 1)
    else:
        if "prompt" not in body:
            raise BadRequest("'prompt' is required", "prompt")
        prompt_tokens = prompt_length(body["prompt"])[0]
        mt = _int_field(body, "max_tokens", 1)
    est = _int_field(body, "est_output_tokens", 1)
    h = headers.get("x-fairlib-est-output-tokens")
    if est is None and h is not None:
        try:
            est = int(h)
        except ValueError:
            est = -1
        if est < 1:
            raise BadRequest(f"header x-fairlib-est-output-tokens must be an integer >= 1, got {h!r}",
                             "x-fairlib-est-output-tokens")
    prio = body.get("priority")
    if prio is not None and (isinstance(prio, bool) or not isinstance(prio, int)):
        raise BadRequest(f"'priority' must be an integer, got {prio!r}", "priority")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be a boolean, got {stream!r}", "stream")
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    if body.get("n", 1) != 1:
        raise BadRequest("'n': only one choice per request is supported", "n")
    return {"prompt_tokens": prompt_tokens, "max_tokens": mt, "est": est if est is not None else mt,
            "priority": prio, "stream": stream, "include_usage": bool(stream and so and so.get("include_usage"))}


def _prompt_text(body: dict):
    """What the estimator's keyword classifier reads: a completion's prompt (text, or token ids),
    or a chat's message contents joined (text parts of multi-part contents included)."""
    if "messages" not in body:
        return body.get("prompt")
    parts = []
    for m in body.get("messages") or ():
        c = m.get("content") if isinstance(m, dict) else None
        if isinstance(c, str):
            parts.append(c)
        elif isinstance(c, list):
            parts += [x.get("text", "") for x in c if isinstance(x, dict) and isinstance(x.get("text"), str)]
    return "\n".join(parts)


def _answer_text(obj) -> str:
    """The text of a JSON completion or chat answer (its first choice)."""
    try:
        ch = obj["choices"][0]
        return str(ch.get("text") if "text" in ch else (ch.get("message") or {}).get("content") or "")
    except (KeyError, IndexError, TypeError, AttributeError):
        return ""


class _Relay:
    """One upstream stream read chunk by chunk: tokens to the gateway, bytes to the client.

    The client's bytes: when it asked for ``include_usage`` nothing is left out and each read of
    the upstream goes to the client as it came (``raw``); otherwise every event but the usage
    chunk is passed on. They are written to the client's connection from the read itself (one
    HTTP/1.1 chunk each, after aiohttp sent the head: ``direct``), so a token costs no task
    wake-up; while more than ``HIGH_WATER`` bytes wait in that connection (a slow reader) they
    queue in ``out`` instead, for the handler to write with back-pressure."""

    HIGH_WATER = 1 << 18

    def __init__(self, gw: Gateway, p: Pending, api: str, client_stream: bool, include_usage: bool):
        self.gw, self.p, self.api = gw, p, api
        self.client_stream, self.include_usage = client_stream, include_usage
        self.raw = client_stream and include_usage
        self.parser = SSEParser()
        self.out: list = []
        self.transport = None       # the client's connection, once direct writes may begin
        self.waker = None
        self.done = False           # [DONE] seen
        self.error = None           # an error event inside the stream
        self.fed = False            # the estimator has learnt from this answer
        self.text: list = []
        self.first = None           # the first chunk (id, model, created)
        self.finish_reason = None
        self.usage = None
        self._kept: list = []

    def wake(self, *_):
        w = self.waker
        if w is not None and not w.done():
            w.set_result(None)

    def on_data(self, data: bytes, t: float) -> bool:
        t_ms = (t - self.gw.t0) * 1e3
        kept = self._kept
        for ev in self.parser.feed(data):
            self._event(ev, t_ms)
        if not self.client_stream:
            return False
        if self.raw:
            body = data
        else:
            body = b"".join(kept)
            kept.clear()
        if body:
            tr = self.transport
            if tr is not None and not self.out and not tr.is_closing() \
                    and tr.get_write_buffer_size() < self.HIGH_WATER:
                tr.write(b"%x\r\n%b\r\n" % (len(body), body))
            else:
                self.out.append(body)
                self.wake()
        return False

    def feed_estimator(self) -> None:
        """The answer is whole (its finish_reason came): the gateway's estimator learns from it,
        once, with the upstream's usage count when it gave one."""
        if not self.fed and self.finish_reason is not None and self.error is None:
            self.fed = True
            self.gw.answered(self.p, "".join(self.text), (self.usage or {}).get("completion_tokens"))

    def _keep(self, ev) -> None:
        if self.client_stream and not self.raw:
            self._kept.append(b"data: " + ev.data.encode() + b"\n\n")

    def _event(self, ev, t_ms: float) -> None:
        try:
            payload, _ = decode_event(ev)
        except MalformedSSE:
            self._keep(ev)
            return
        if payload is DONE:
            self.done = True
            self.feed_estimator()   # before the client can read [DONE] and go
            self._keep(ev)
            return
        try:
            info = interpret_chunk(payload)
        except StreamError as e:
            self.error = e
            self._keep(ev)
            return
        except MalformedSSE:
            info = None
        if info is not None:
            if self.first is None:
                self.first = payload
            if info.finish_reason is not None:
                self.finish_reason = info.finish_reason
            if info.is_token_chunk:
                self.text.append(info.text)
                self.gw.tokens(self.p, t_ms, max(1, info.n_tokens), info.finish_reason is not None)
            elif info.finish_reason is not None:
                self.gw.finish_seen(self.p, t_ms)
            if info.usage is not None and isinstance(info.usage.get("completion_tokens"), int):
                self.usage = info.usage
                self.gw.usage_tokens(self.p, info.usage["completion_tokens"])
            if info.usage is not None and not payload.get("choices") and not self.include_usage:
                return                  # the usage chunk the client did not ask for
        self._keep(ev)

    def assembled(self) -> dict:
        """The answer of a client that asked for no stream, from what the stream carried."""
        f = self.first or {}
        text = "".join(self.text)
        if self.api == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": self.finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.finish_reason}
            obj = "text_completion"
        out = {"id": f.get("id"), "object": obj, "created": f.get("created", int(time.time())),
               "model": f.get("model"), "choices": [choice]}
        if self.usage is not None:
            out["usage"] = self.usage
        return out


def _upstream_body(body: dict) -> bytes:
    b = dict(body)
    b["stream"] = True
    so = dict(b.get("stream_options") or {})
    so["include_usage"] = True
    b["stream_options"] = so
    return _dumps(b).encode()


def make_app(gw: Gateway) -> web.Application:
    cfg = gw.cfg
    app = web.Application(client_max_size=MAX_BODY_BYTES,
                          middlewares=[openai_error_middleware(ROUTES, MAX_BODY_BYTES, "internal gateway error")])
    app[GATEWAY] = gw
    state: dict = {}

    async def on_startup(app):
        state["session"] = HttpSession(timeout_s=cfg.request_timeout_s, connect_timeout_s=5.0)
        state["health"] = asyncio.get_running_loop().create_task(_health_loop())

    async def on_cleanup(app):
        t = state.get("health")
        if t is not None:
            t.cancel()
        await state["session"].close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)

    def upstream_headers(tenant: Optional[str] = None) -> dict:
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if cfg.upstream_api_key:
            h["Authorization"] = f"Bearer {cfg.upstream_api_key}"
        if tenant is not None:      # who it is for, for the engine's own logs (fairlib serve: X-Tenant)
            h[FAIRNESS_HEADERS[0]] = tenant
            h["X-Tenant"] = tenant
        return h

    async def _health_loop():
        sess = HttpSession(timeout_s=max(1.0, cfg.health_interval_s), connect_timeout_s=1.0)
        try:
            while True:
                for up in gw.upstreams:
                    ok = False
                    try:            # any answer but a 5xx: an engine without /health answers 404
                        async with sess.get(up.root + "/health", headers=upstream_headers()) as r:
                            await r.read(1 << 16)
                            ok = r.status < 500
                    except (OSError, TimeoutError, ConnectionError):
                        ok = False
                    gw.mark(up, ok)
                await asyncio.sleep(cfg.health_interval_s)
        finally:
            await sess.close()

    def bearer(request) -> str:
        a = request.headers.get("Authorization", "")
        return a[7:].strip() if a[:7].lower() == "bearer " else ""

    async def generate(request: web.Request, api: str):
        try:
            body = await request.json(loads=json.loads)
        except ValueError as e:
            return error_response(400, f"the request body is not valid JSON: {e}", "BadRequestError")
        except RecursionError:
            return error_response(400, "the request body is not valid JSON: nested too deeply", "BadRequestError")
        if gw.stopping:
            r = error_response(503, "the gateway is shutting down: it takes no new request", error_type(503))
            r.headers["Retry-After"] = "1"
            r.headers["x-fairlib-rejected-reason"] = "shutting_down"
            return r
        try:
            req = parse_body(body, api, request.headers)
        except BadRequest as e:
            return error_response(e.status, e.message, e.type, e.param)
        key = bearer(request)
        if cfg.api_key and key != cfg.api_key and key not in gw.by_key:
            return error_response(401, "Unauthorized: send 'Authorization: Bearer <api key>'", "AuthenticationError")
        try:
            tenant = gw.tenant_of(request.headers, key)
        except Unauthorized as e:
            r = error_response(401, str(e), "AuthenticationError")
            r.headers["x-fairlib-rejected-reason"] = "unknown_tenant"
            return r
        tc = gw.tenant_config(tenant)
        prio = req["priority"] if req["priority"] is not None else (tc.priority if tc else 0)
        klass = tc.klass if tc else 0
        cat = tier = None
        if gw.estimator is not None:
            try:
                cat, tier = gw.estimator.describe(request.headers, _prompt_text(body), tc.tier if tc else None)
            except ValueError as e:
                return error_response(400, str(e), "BadRequestError", getattr(e, "param", None))
        try:
            p = gw.submit(tenant, req["prompt_tokens"], req["est"], klass, prio, req["max_tokens"], cat, tier)
        except Rejected as e:
            return _reject(e)
        except ValueError as e:      # e.g. a priority outside the levels the policy keeps
            return error_response(400, str(e), "BadRequestError", getattr(e, "param", "priority"))
        # wait for a slot
        try:
            if cfg.queue_timeout_s is None:
                up = await asyncio.shield(p.future)
            else:
                async with asyncio.timeout(cfg.queue_timeout_s):
                    up = await asyncio.shield(p.future)
        except TimeoutError:
            if p.future.done() and not p.future.cancelled() and p.future.exception() is None:
                up = p.future.result()
            else:
                gw.withdraw(p, "queue_timeout")
                return _reject(Rejected(503, "queue_timeout", f"waited {cfg.queue_timeout_s} s for a slot "
                                                               f"(--queue-timeout-s)", cfg.queue_timeout_s))
        except Rejected as e:
            return _reject(e)
        except asyncio.CancelledError:
            if p.future.done() and not p.future.cancelled() and p.future.exception() is None:
                gw.release(p)          # dispatched as the client left: it never reached the upstream
            else:
                gw.withdraw(p)
            raise
        return await relay(request, api, body, req, p, up)

    async def relay(request, api, body, req, p: Pending, up):
        sess: HttpSession = state["session"]
        rl = _Relay(gw, p, api, req["stream"], req["include_usage"])
        resp = None
        sresp = None
        reading = None
        try:
            try:
                resp = await sess.post(up.url + ("/chat/completions" if api == "chat" else "/completions"),
                                       data=_upstream_body(body),
                                       headers=upstream_headers(gw.tenant_name(p.tenant)),
                                       now=gw.clock).__aenter__()
            except (ConnectError, Disconnected, TimeoutError, OSError) as e:
                up.failures += 1
                gw.mark(up, False)
                return error_response(502, f"upstream {up.url} failed before answering: {e}", "BadGatewayError")
            if resp.status != 200:
                raw = await resp.read(1 << 20)
                try:
                    obj = json.loads(raw)
                    ok_json = isinstance(obj, dict) and "error" in obj
                except ValueError:
                    ok_json = False
                if ok_json:
                    return web.Response(body=raw, status=resp.status, content_type="application/json")
                return error_response(resp.status, f"upstream {up.url} answered {resp.status}: "
                                                   f"{raw[:300].decode('utf-8', 'replace')}", error_type(resp.status))
            if resp.content_type != "text/event-stream":
                raw = await resp.read(MAX_BODY_BYTES)
                try:
                    obj = json.loads(raw)
                except ValueError:
                    return error_response(502, f"upstream {up.url} answered 200 with {resp.content_type or 'no type'}"
                                               f", not an event stream", "BadGatewayError")
                n = ((obj.get("usage") or {}).get("completion_tokens") if isinstance(obj, dict) else None) or 1
                gw.tokens(p, gw.now_ms(), int(n), True)
                gw.answered(p, _answer_text(obj), int(n))
                return web.Response(body=raw, status=200, content_type="application/json")
            loop = asyncio.get_running_loop()
            reading = loop.create_task(resp.stream(rl.on_data))
            reading.add_done_callback(rl.wake)
            if rl.client_stream:
                sresp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream; charset=utf-8",
                                                                "Cache-Control": "no-cache"})
                if request.version >= (1, 1):
                    sresp.enable_chunked_encoding()
                await sresp.prepare(request)
                await sresp.write(b"")          # the head goes out now; the reads follow it directly
                if request.version >= (1, 1):
                    rl.transport = request.transport
            try:
                while True:
                    if rl.out:
                        data = b"".join(rl.out)
                        rl.out.clear()
                        if sresp is not None:
                            await sresp.write(data)
                        continue
                    if reading.done():
                        break
                    rl.waker = loop.create_future()
                    await rl.waker
                try:
                    reading.result()
                    broken = None if (rl.done or rl.finish_reason) else "the stream ended without [DONE]"
                except (Disconnected, TimeoutError, OSError) as e:
                    broken = f"{type(e).__name__}: {e}"
                rl.feed_estimator()     # a stream without [DONE]: once it ended, if its finish_reason came
                if sresp is None:
                    if broken and not rl.text:
                        return error_response(502, f"upstream {up.url} broke the stream: {broken}",
                                              "BadGatewayError")
                    if rl.error is not None:
                        return error_response(rl.error.code or 500, str(rl.error), error_type(rl.error.code or 500))
                    return web.Response(body=_dumps(rl.assembled()).encode(), content_type="application/json")
                tail = b"".join(rl.out)
                if broken:
                    err = {"error": {"object": "error", "message": f"upstream {up.url} broke the stream: {broken}",
                                     "type": "BadGatewayError", "param": None, "code": 502}}
                    tail += b"data: " + _dumps(err).encode() + b"\n\n"
                await sresp.write_eof(tail)
            except ConnectionError:             # the client went away while we wrote to it
                pass
            return sresp
        finally:
            if reading is not None and not reading.done():
                reading.cancel()
            if resp is not None:
                resp.release()          # an unfinished body closes the connection: the upstream aborts
            gw.release(p)

    async def completions(request):
        return await generate(request, "completions")

    async def chat(request):
        return await generate(request, "chat")

    async def models(request):
        sess: HttpSession = state["session"]
        for up in gw.upstreams:
            if not up.healthy:
                continue
            try:
                async with sess.get(up.url + "/models", headers=upstream_headers()) as r:
                    raw = await r.read(1 << 20)
                    return web.Response(body=raw, status=r.status, content_type="application/json")
            except (ConnectError, Disconnected, TimeoutError, OSError):
                continue
        return error_response(503, "no healthy upstream answered /v1/models", error_type(503))

    async def health(request):
        if gw.stopping:
            return error_response(503, "the gateway is shutting down", error_type(503))
        if any(u.available for u in gw.upstreams):
            return web.Response(status=200)
        return error_response(503, "no upstream takes requests (unhealthy or drained)", error_type(503))

    async def metrics(request):
        return web.Response(text=gw.render_metrics(), content_type="text/plain", charset="utf-8")

    def admin(fn):
        async def guarded(request):
            if not _loopback(request):
                return error_response(403, "the admin routes answer on loopback only", "PermissionDeniedError")
            return await fn(request)
        return guarded

    async def admin_state(request):
        return web.json_response(gw.state())

    async def admin_events(request):
        lines = [_dumps({"spec": gw.gate.spec, "tenants": gw.names})] + [_dumps(e) for e in gw.gate.log]
        return web.Response(text="\n".join(lines) + "\n", content_type="application/x-ndjson")

    async def json_body(request):
        """The request's JSON body, or None (and the 400 to answer) when it is not JSON."""
        try:
            return await request.json(), None
        except ValueError as e:
            return None, error_response(400, f"the body is not JSON: {e}", "BadRequestError")

    async def admin_policy(request):
        body, bad = await json_body(request)
        if bad is not None:
            return bad
        if not isinstance(body, dict) or not isinstance(body.get("policy"), str):
            return error_response(400, "send {\"policy\": NAME, \"params\": {...}}", "BadRequestError", "policy")
        params = body.get("params") or {}
        if not isinstance(params, dict):
            return error_response(400, "'params' must be an object", "BadRequestError", "params")
        try:
            gw.switch_policy(body["policy"], params)
        except RuntimeError as e:
            return error_response(409, str(e), "ConflictError")
        except (ValueError, TypeError) as e:
            return error_response(400, str(e), "BadRequestError", "policy")
        return web.json_response(gw.state())

    async def admin_upstreams(request):
        body, bad = await json_body(request)
        if bad is not None:
            return bad
        if not isinstance(body, dict) or not isinstance(body.get("drained"), bool):
            return error_response(400, "send {\"upstream\": INDEX, \"drained\": true | false}", "BadRequestError",
                                  "drained")
        try:
            gw.drain(body.get("upstream"), body["drained"])
        except ValueError as e:
            return error_response(400, str(e), "BadRequestError", "upstream")
        return web.json_response(gw.state())

    async def admin_reset(request):
        try:
            gw.switch_policy(gw.policy_name, gw.policy_params)
        except RuntimeError as e:
            return error_response(409, str(e), "ConflictError")
        return web.json_response(gw.state())

    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/admin/state", admin(admin_state))
    app.router.add_get("/admin/events", admin(admin_events))
    app.router.add_post("/admin/policy", admin(admin_policy))
    app.router.add_post("/admin/reset", admin(admin_reset))
    app.router.add_post("/admin/upstreams", admin(admin_upstreams))
    return app
