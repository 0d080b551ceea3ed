"""The HTTP layer of ``fairlib serve``: OpenAI-compatible routes in vLLM's wire format.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streaming and not),
``GET /v1/models``, ``/health``, ``/version``, ``/metrics`` (Prometheus text, vLLM's names plus
``fairlib:*``) and ``/fairlib/stats`` (JSON: configuration, counts, the timing error so far).

Request fields read: ``model`` (404 if not the served one), ``prompt`` (a string: prompt tokens =
its whitespace-separated words; or a list of token ids: exactly its length), ``messages`` (chat:
the words of every text content), ``max_tokens`` / ``max_completion_tokens`` (chat: the latter
wins; default: ``max_model_len - prompt``), ``min_tokens``, ``ignore_eos``, ``priority`` (vLLM's
semantics: lower is served earlier; non-zero only with ``--policy priority``), ``stream``,
``stream_options.include_usage``, ``return_token_ids``, ``n`` (only 1); two fairlib extensions,
``klass`` (service class for ``weighted``/``aging``) and ``est_output_tokens`` (the estimate
``sjf``/``vtc_predict`` read; default ``max_tokens``); and the tenant header (``X-Tenant``).
Other fields are ignored, as vLLM ignores unknown fields. Every error is OpenAI-style JSON
``{"error": {"message", "type", "param", "code"}}``: 400 naming the offending field (``param``)
or a body that is not JSON (nested too deeply included), 404 for an unknown model or route, 405
for a wrong method, 413 for a body over 64 MiB, 429 when the waiting queue is full or the policy
turns a request away, 500 for a fault of the server itself.

A streamed response's status and headers go out with its first token (or its 429): a request
that waits in the queue sends nothing until it is admitted.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from http import HTTPStatus

from aiohttp import web

from fairlib import __version__
from fairlib.client.schedule import WORDS
from fairlib.serve.driver import Driver, QueueFull

__all__ = ["make_app", "BadRequest", "DRIVER", "error_response", "error_type", "prompt_length", "messages_length",
           "openai_error_middleware"]

#: where the app keeps its driver (``app[DRIVER]``)
DRIVER = web.AppKey("driver", Driver)

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class BadRequest(Exception):
    def __init__(self, message: str, param=None, status: int = 400, type_: str = "BadRequestError"):
        super().__init__(message)
        self.message, self.param, self.status, self.type = message, param, status, type_


def error_response(status: int, message: str, type_: str, param=None) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": param, "code": status}}
    return web.Response(body=_dumps(body).encode(), status=status, content_type="application/json")


def error_type(status: int) -> str:
    """vLLM's error type for an HTTP status: its phrase in CamelCase + ``Error`` (404:
    ``NotFoundError``, 405: ``MethodNotAllowedError``, 500: ``InternalServerError``)."""
    try:
        name = "".join(w[:1].upper() + w[1:] for w in HTTPStatus(status).phrase.replace("-", " ").split())
    except ValueError:
        name = f"Http{status}"
    return name if name.endswith("Error") else name + "Error"


MAX_BODY_BYTES = 64 * 2 ** 20
ROUTES = ("POST /v1/completions", "POST /v1/chat/completions", "GET /v1/models", "GET /health", "GET /version",
          "GET /metrics", "GET /fairlib/stats")


def openai_error_middleware(routes, max_body_bytes: int, fault: str = "internal server error"):
    """A middleware that answers every error in OpenAI's error JSON: aiohttp's own 404 (naming
    ``routes``), 405, 413 (over ``max_body_bytes``), and any fault of the server itself (500)."""

    @web.middleware
    async def openai_errors(request: web.Request, handler):
        try:
            return await handler(request)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            if e.status == 404:
                msg = f"no route {request.method} {request.path} (routes: {', '.join(routes)})"
            elif e.status == 405:
                allowed = ", ".join(sorted(getattr(e, "allowed_methods", ()) or ()))
                msg = f"method {request.method} is not allowed on {request.path} (allowed: {allowed})"
            elif e.status == 413:
                msg = f"the request body exceeds {max_body_bytes} bytes ({max_body_bytes / 2 ** 20:g} MiB)"
            else:
                msg = e.text or e.reason
            return error_response(e.status, msg, error_type(e.status))
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception as e:  # a fault of the server: still an answer the client can parse
            return error_response(500, f"{fault}: {type(e).__name__}: {e}", "InternalServerError")

    return openai_errors


openai_errors = openai_error_middleware(ROUTES, MAX_BODY_BYTES)


def require_key(key: str):
    """vLLM's ``--api-key``: a request to a ``/v1`` route without ``Authorization: Bearer <key>``
    gets 401 in OpenAI's error JSON; ``/health``, ``/version`` and ``/metrics`` stay open."""

    @web.middleware
    async def check(request: web.Request, handler):
        if request.path.startswith("/v1") and request.headers.get("Authorization") != f"Bearer {key}":
            return error_response(401, "Unauthorized: send 'Authorization: Bearer <api key>'",
                                  "AuthenticationError")
        return await handler(request)

    return check


# --- request parsing --------------------------------------------------------------------------

def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _opt_int(body, name, low, default=None):
    v = body.get(name)
    if v is None:
        return default
    if not _is_int(v) or v < low:
        raise BadRequest(f"'{name}' must be an integer >= {low}, got {v!r}", name)
    return v


def _opt_bool(body, name, default=False):
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise BadRequest(f"'{name}' must be a boolean, got {v!r}", name)
    return v


def prompt_length(prompt):
    """(prompt_tokens, token ids or None)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        n = len(prompt.split())
        if n == 0:
            raise BadRequest("'prompt' is empty", "prompt")
        return n, None
    if isinstance(prompt, list):
        if not prompt:
            raise BadRequest("'prompt' is empty", "prompt")
        if all(_is_int(t) and t >= 0 for t in prompt):
            return len(prompt), prompt
        if all(isinstance(t, (str, list)) for t in prompt):
            raise BadRequest("'prompt': only one prompt per request is supported", "prompt")
        raise BadRequest("'prompt' must be a string or a list of token ids (integers >= 0)", "prompt")
    raise BadRequest(f"'prompt' must be a string or a list of token ids, got {type(prompt).__name__}", "prompt")


def messages_length(messages) -> int:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of messages", "messages")
    n = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"'messages[{i}]' must be an object with a string 'role'", "messages")
        c = m.get("content")
        if c is None:
            continue
        if isinstance(c, str):
            n += len(c.split())
        elif isinstance(c, list):
            for part in c:
                if not isinstance(part, dict):
                    raise BadRequest(f"'messages[{i}].content' parts must be objects", "messages")
                if part.get("type") == "text":
                    n += len(str(part.get("text", "")).split())
        else:
            raise BadRequest(f"'messages[{i}].content' must be a string, a list of parts or null", "messages")
    return max(n, 1)


def parse_request(body, api: str, cfg) -> dict:
    """Validate one completions/chat body against the server's configuration."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != cfg.model:
        raise BadRequest(f"The model `{model}` does not exist.", "model", 404, "NotFoundError")
    if api == "chat":
        if "messages" not in body:
            raise BadRequest("'messages' is required", "messages")
        prompt_tokens, prompt_ids = messages_length(body["messages"]), None
        max_tokens = _opt_int(body, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = _opt_int(body, "max_tokens", 1)
        mt_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    else:
        if "prompt" not in body:
            raise BadRequest("'prompt' is required", "prompt")
        prompt_tokens, prompt_ids = prompt_length(body["prompt"])
        max_tokens = _opt_int(body, "max_tokens", 1)
        mt_field = "max_tokens"
    eng = cfg.engine
    if prompt_tokens >= cfg.max_model_len:
        raise BadRequest(f"This model's maximum context length is {cfg.max_model_len} tokens. However, your "
                         f"prompt has {prompt_tokens} tokens.", "prompt" if api != "chat" else "messages")
    if max_tokens is None:
        max_tokens = cfg.max_model_len - prompt_tokens
    if prompt_tokens + max_tokens > cfg.max_model_len:
        raise BadRequest(f"This model's maximum context length is {cfg.max_model_len} tokens. However, you "
                         f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, "
                         f"{max_tokens} in the completion). Please reduce the length of the prompt or completion.",
                         mt_field)
    if eng.max_prefill_tokens is not None and prompt_tokens > eng.max_prefill_tokens:
        raise BadRequest(f"the prompt ({prompt_tokens} tokens) exceeds the engine's max_prefill_tokens "
                         f"({eng.max_prefill_tokens})", "prompt" if api != "chat" else "messages")
    if eng.kv_capacity_tokens is not None and prompt_tokens + max_tokens > eng.kv_capacity_tokens:
        raise BadRequest(f"prompt + {mt_field} ({prompt_tokens + max_tokens} tokens) exceeds the engine's KV "
                         f"capacity ({eng.kv_capacity_tokens} tokens)", mt_field)
    min_tokens = _opt_int(body, "min_tokens", 0, 0)
    if min_tokens > max_tokens:
        raise BadRequest(f"min_tokens ({min_tokens}) must be less than or equal to {mt_field} ({max_tokens})",
                         "min_tokens")
    ignore_eos = _opt_bool(body, "ignore_eos")
    priority = body.get("priority", 0)
    if priority is None:
        priority = 0
    if not _is_int(priority):
        raise BadRequest(f"'priority' must be an integer, got {priority!r}", "priority")
    if priority != 0 and cfg.policy != "priority":
        raise BadRequest(f"Got priority {priority} but Priority scheduling is not enabled "
                         f"(this server runs policy {cfg.policy!r}; start it with --policy priority)", "priority")
    if not cfg.priority_min <= priority <= cfg.priority_max:
        raise BadRequest(f"'priority' must lie in {cfg.priority_min}..{cfg.priority_max}, got {priority}", "priority")
    stream = _opt_bool(body, "stream")
    so = body.get("stream_options")
    if so is not None:
        if not stream:
            raise BadRequest("Stream options (stream_options) can only be defined when `stream=True`.",
                             "stream_options")
        if not isinstance(so, dict):
            raise BadRequest("'stream_options' must be an object", "stream_options")
        include_usage = _opt_bool(so, "include_usage")
    else:
        include_usage = False
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise BadRequest(f"'n' must be 1 (fairlib serve generates one choice per request), got {n!r}", "n")
    klass = _opt_int(body, "klass", 0, 0)
    if klass >= cfg.n_classes:
        raise BadRequest(f"'klass' must lie in 0..{cfg.n_classes - 1}, got {klass}", "klass")
    est = _opt_int(body, "est_output_tokens", 1)
    return {"prompt_tokens": prompt_tokens, "prompt_ids": prompt_ids, "max_tokens": max_tokens,
            "min_tokens": min_tokens, "ignore_eos": ignore_eos, "priority": priority, "stream": stream,
            "include_usage": include_usage, "return_token_ids": _opt_bool(body, "return_token_ids"),
            "klass": klass, "est_output_tokens": est,
            "forced": ignore_eos or min_tokens >= max_tokens}


# --- response bodies (vLLM's field order) ------------------------------------------------------

def _token(rid: int, k: int) -> tuple:
    j = (rid * 31 + k) % len(WORDS)
    return " " + WORDS[j], 100 + j


class _Out:
    """Builds one response's chunks."""

    def __init__(self, api, model, req, st):
        self.api, self.model, self.req, self.st = api, model, req, st
        self.created = int(time.time())
        self.id = ("chatcmpl-" if api == "chat" else "cmpl-") + uuid.uuid4().hex
        self.sent = 0

    def prompt_ids(self):
        if not self.req["return_token_ids"]:
            return None
        return self.req["prompt_ids"] if self.req["prompt_ids"] is not None else list(range(100, 100 + self.st.prompt_tokens))

    def role_chunk(self) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}], "prompt_token_ids": self.prompt_ids()}

    def token_chunk(self, last: bool) -> dict:
        text, tid = _token(self.st.rid, self.sent)
        k = self.sent
        self.sent += 1
        fr = self.st.finish_reason if last else None
        tids = [tid] if self.req["return_token_ids"] else None
        if self.api == "chat":
            choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": fr}
            if last:
                choice["stop_reason"] = None
            choice["token_ids"] = tids
            return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                    "choices": [choice]}
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": fr, "stop_reason": None,
                             "prompt_token_ids": self.prompt_ids() if k == 0 else None, "token_ids": tids}],
                "usage": None}

    def usage(self) -> dict:
        p, c = self.st.prompt_tokens, self.sent
        return {"prompt_tokens": p, "total_tokens": p + c, "completion_tokens": c}

    def usage_chunk(self) -> dict:
        obj = "chat.completion.chunk" if self.api == "chat" else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [],
                "usage": self.usage()}

    def full(self) -> dict:
        texts = [_token(self.st.rid, k)[0] for k in range(self.st.emitted)]
        self.sent = len(texts)
        text = "".join(texts)
        usage = {**self.usage(), "prompt_tokens_details": None}
        fr = self.st.finish_reason
        if self.api == "chat":
            return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "reasoning_content": None,
                                                         "content": text, "tool_calls": []},
                                 "logprobs": None, "finish_reason": fr, "stop_reason": None}],
                    "usage": usage, "prompt_logprobs": None, "kv_transfer_params": None}
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": fr, "stop_reason": None,
                             "prompt_logprobs": None}],
                "usage": usage, "kv_transfer_params": None}


def _data(obj) -> bytes:
    return b"data: " + _dumps(obj).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def _rejected_response():
    return error_response(429, "The request was rejected by the scheduling policy (admission control).",
                          "RateLimitError")


# --- the app ----------------------------------------------------------------------------------

def make_app(cfg) -> web.Application:
    """The aiohttp application; its driver starts and stops with it (``app[DRIVER]``)."""
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[openai_errors, *([require_key(cfg.api_key)] if cfg.api_key else [])])
    state = {}

    async def start_driver(app):
        drv = Driver(cfg)
        app[DRIVER] = drv
        state["driver"] = drv
        task = asyncio.get_running_loop().create_task(drv.run(), name="fairlib-serve-driver")
        task.add_done_callback(drv.on_done)
        state["task"] = task

    async def stop_driver(app):
        t = state.get("task")
        if t is not None:
            t.cancel()
            try:
                await t
            except BaseException:  # cancelled, or failed (already reported by Driver.on_done)
                pass

    app.on_startup.append(start_driver)
    app.on_cleanup.append(stop_driver)

    async def generate(request: web.Request, api: str):
        drv: Driver = state["driver"]
        if drv.failed is not None:
            return _driver_failed(drv)
        try:
            body = await request.json(loads=json.loads)
        except ValueError as e:
            return error_response(400, f"the request body is not valid JSON: {e}", "BadRequestError")
        except RecursionError:
            return error_response(400, "the request body is not valid JSON: nested too deeply", "BadRequestError")
        try:
            req = parse_request(body, api, cfg)
            name = request.headers.get(cfg.tenant_header, "default")
            tenant = drv.tenant_index(name)
            if tenant is None:
                raise BadRequest(f"unknown tenant {name!r}: this server tells apart at most {cfg.n_tenants} tenants "
                                 f"({', '.join(drv.tenant_names())} are taken; start it with a larger --tenants)",
                                 cfg.tenant_header)
            out_tokens = drv.output_length(req["max_tokens"], req["min_tokens"], req["forced"])
            st = drv.submit(tenant, req["prompt_tokens"], out_tokens, req["max_tokens"],
                            est_output_tokens=req["est_output_tokens"], klass=req["klass"], priority=req["priority"])
        except BadRequest as e:
            return error_response(e.status, e.message, e.type, e.param)
        except QueueFull as e:
            return error_response(429, str(e), "RateLimitError")
        out = _Out(api, cfg.model, req, st)
        try:
            if req["stream"]:
                try:
                    return await _stream(request, drv, st, out, req)
                except ConnectionError:  # the client went away mid-stream: abort (finally), no traceback
                    return web.Response(status=499)
            while not (st.finished or st.rejected or drv.failed is not None):
                await st.event.wait()
                st.event.clear()
            if drv.failed is not None:
                return _driver_failed(drv)
            if st.rejected:
                return _rejected_response()
            return web.Response(body=_dumps(out.full()).encode(), content_type="application/json")
        finally:
            if not (st.finished or st.rejected):
                drv.abort(st)

    async def completions(request):
        return await generate(request, "completions")

    async def chat(request):
        return await generate(request, "chat")

    async def models(request):
        return web.json_response({"object": "list", "data": [{
            "id": cfg.model, "object": "model", "created": int(state["driver"].t0_wall), "owned_by": "fairlib",
            "root": cfg.model, "parent": None, "max_model_len": cfg.max_model_len,
            "permission": []}]})

    async def health(request):
        drv = state.get("driver")
        if drv is None or drv.failed is not None:
            return _driver_failed(drv) if drv is not None else error_response(
                503, "the engine-model driver has not started", error_type(503))
        return web.Response(status=200)

    async def version(request):
        return web.json_response({"version": f"fairlib-serve {__version__}"})

    async def metrics(request):
        return web.Response(text=state["driver"].render_metrics(), content_type="text/plain",
                            charset="utf-8", headers={"X-Fairlib": "test double: the engine model, not an engine"})

    async def stats(request):
        return web.json_response(state["driver"].stats())

    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/fairlib/stats", stats)
    return app


def _driver_failed(drv) -> web.Response:
    return error_response(500, f"the engine-model driver stopped: {drv.failed!r}", "InternalServerError")


async def _stream(request, drv: Driver, st, out: _Out, req):
    resp = None
    while True:
        await st.event.wait()
        st.event.clear()
        if drv.failed is not None:
            if resp is None:
                return _driver_failed(drv)
            err = {"error": {"object": "error", "message": f"the engine-model driver stopped: {drv.failed!r}",
                             "type": "InternalServerError", "param": None, "code": 500}}
            await resp.write(_data(err) + DONE)
            await resp.write_eof()
            return resp
        if st.rejected:
            return _rejected_response()
        n, st.pending = st.pending, 0
        parts = []
        if resp is None and (n or st.finished):
            resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream; charset=utf-8",
                                                           "Cache-Control": "no-cache"})
            await resp.prepare(request)
            if out.api == "chat":
                parts.append(_data(out.role_chunk()))
        for _ in range(n):
            last = st.finished and out.sent + 1 == st.emitted
            parts.append(_data(out.token_chunk(last)))
        done = st.finished and out.sent == st.emitted
        if done:
            if req["include_usage"]:
                parts.append(_data(out.usage_chunk()))
            parts.append(DONE)
        if parts:
            if n:
                lag = time.perf_counter() - st.last_target
                drv.write_lags.append(lag)
                drv.m_wlag.observe(max(lag, 0.0), drv.labels)
            await resp.write(b"".join(parts))
        if done:
            await resp.write_eof()
            return resp
