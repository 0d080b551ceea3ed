"""The HTTP layer of ``fairlib serve``: OpenAI-compatible routes in vLLM's wire format.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streaming and not),
``GET /v1/models``, ``/health``, ``/version``, ``/metrics`` (Prometheus text, vLLM's names plus
``fairlib_serve_*``) and ``/fairlib/stats`` (JSON: configuration, counts, the timing error so far).

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
import time
import uuid

from aiohttp import web

from fairlib import __version__
from fairlib.client.schedule import WORDS
from fairlib.protocol.parse import is_int, opt_bool, opt_int, prompt_and_max_tokens
from fairlib.protocol.routes import OpenAIServer, bad_request, error_response, read_json, require_key
from fairlib.protocol.sse import DONE_LINE, STREAM_HEADERS, data_line, error_event
from fairlib.protocol.wire import BadRequest, dumps, error_type, usage
from fairlib.serve.driver import Driver, QueueFull

__all__ = ["make_app", "ServeApp", "DRIVER", "parse_request"]

#: where the app keeps its driver (``app[DRIVER]``)
DRIVER = web.AppKey("driver", Driver)


# --- request parsing --------------------------------------------------------------------------

def parse_request(body, api: str, cfg) -> dict:
    """Validate one completions/chat body against the server's configuration."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != cfg.model:
        raise BadRequest(f"The model `{model}` does not exist.", "model", 404, "NotFoundError")
    prompt_tokens, prompt_ids, max_tokens, mt_field = prompt_and_max_tokens(body, api)
    max_tokens = _fit_lengths(prompt_tokens, max_tokens, mt_field, "messages" if api == "chat" else "prompt", cfg)
    min_tokens = opt_int(body, "min_tokens", 0, 0)
    if min_tokens > max_tokens:
        raise BadRequest(f"min_tokens ({min_tokens}) must be less than or equal to {mt_field} ({max_tokens})",
                         "min_tokens")
    ignore_eos = opt_bool(body, "ignore_eos")
    priority = _priority(body, cfg)
    stream = opt_bool(body, "stream")
    so = body.get("stream_options")
    if so is not None:
        if not stream:
            raise BadRequest("Stream options (stream_options) can only be defined when `stream=True`.",
                             "stream_options")
        if not isinstance(so, dict):
            raise BadRequest("'stream_options' must be an object", "stream_options")
        include_usage = opt_bool(so, "include_usage")
    else:
        include_usage = False
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise BadRequest(f"'n' must be 1 (fairlib serve generates one choice per request), got {n!r}", "n")
    klass = opt_int(body, "klass", 0, 0)
    if klass >= cfg.n_classes:
        raise BadRequest(f"'klass' must lie in 0..{cfg.n_classes - 1}, got {klass}", "klass")
    est = opt_int(body, "est_output_tokens", 1)
    return {"prompt_tokens": prompt_tokens, "prompt_ids": prompt_ids, "max_tokens": max_tokens,
            "min_tokens": min_tokens, "ignore_eos": ignore_eos, "priority": priority, "stream": stream,
            "include_usage": include_usage, "return_token_ids": opt_bool(body, "return_token_ids"),
            "klass": klass, "est_output_tokens": est,
            "forced": ignore_eos or min_tokens >= max_tokens}


def _fit_lengths(prompt_tokens: int, max_tokens, mt_field: str, prompt_field: str, cfg) -> int:
    """``max_tokens`` (default: what the context leaves), checked against the context length and
    the engine's prefill and KV limits."""
    eng = cfg.engine
    if prompt_tokens >= cfg.max_model_len:
        raise BadRequest(f"This model's maximum context length is {cfg.max_model_len} tokens. However, your "
                         f"prompt has {prompt_tokens} tokens.", prompt_field)
    if max_tokens is None:
        max_tokens = cfg.max_model_len - prompt_tokens
    if prompt_tokens + max_tokens > cfg.max_model_len:
        raise BadRequest(f"This model's maximum context length is {cfg.max_model_len} tokens. However, you "
                         f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, "
                         f"{max_tokens} in the completion). Please reduce the length of the prompt or completion.",
                         mt_field)
    if eng.max_prefill_tokens is not None and prompt_tokens > eng.max_prefill_tokens:
        raise BadRequest(f"the prompt ({prompt_tokens} tokens) exceeds the engine's max_prefill_tokens "
                         f"({eng.max_prefill_tokens})", prompt_field)
    if eng.kv_capacity_tokens is not None and prompt_tokens + max_tokens > eng.kv_capacity_tokens:
        raise BadRequest(f"prompt + {mt_field} ({prompt_tokens + max_tokens} tokens) exceeds the engine's KV "
                         f"capacity ({eng.kv_capacity_tokens} tokens)", mt_field)
    return max_tokens


def _priority(body: dict, cfg) -> int:
    """vLLM's ``priority`` (default 0): an integer in the configured range, non-zero only under
    ``--policy priority``."""
    priority = body.get("priority", 0)
    if priority is None:
        priority = 0
    if not is_int(priority):
        raise BadRequest(f"'priority' must be an integer, got {priority!r}", "priority")
    if priority != 0 and cfg.policy != "priority":
        raise BadRequest(f"Got priority {priority} but Priority scheduling is not enabled "
                         f"(this server runs policy {cfg.policy!r}; start it with --policy priority)", "priority")
    if not cfg.priority_min <= priority <= cfg.priority_max:
        raise BadRequest(f"'priority' must lie in {cfg.priority_min}..{cfg.priority_max}, got {priority}", "priority")
    return priority


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
        return usage(self.st.prompt_tokens, self.sent)

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


def _rejected_response():
    return error_response(429, "The request was rejected by the scheduling policy (admission control).",
                          "RateLimitError")


def _driver_failed(drv) -> web.Response:
    return error_response(500, f"the engine-model driver stopped: {drv.failed!r}", "InternalServerError")


# --- the app ----------------------------------------------------------------------------------

class ServeApp(OpenAIServer):
    """The handlers of ``fairlib serve`` around one :class:`Driver` (started with the app)."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.driver = None
        self.task = None

    def routes(self) -> list:
        """Called once by ``make_app``.
        Returns the seven routes (the module's docstring; six with ``--no-metrics``)."""
        routes = [("POST", "/v1/completions", self.completions), ("POST", "/v1/chat/completions", self.chat),
                  ("GET", "/v1/models", self.models), ("GET", "/health", self.health), ("GET", "/version", self.version),
                  ("GET", "/metrics", self.metrics), ("GET", "/fairlib/stats", self.stats)]
        return [r for r in routes if self.cfg.metrics or r[1] != "/metrics"]    # --no-metrics: 404 there

    def middlewares(self) -> list:
        """Called once by ``make_app``.
        Returns the API-key check when the server has a key (``--api-key``), else nothing."""
        return [require_key(self.cfg.api_key)] if self.cfg.api_key else []

    async def on_startup(self, app: web.Application) -> None:
        """Called when the app starts.
        Returns nothing; the driver runs in a task of its own from now on (``app[DRIVER]``)."""
        drv = Driver(self.cfg)
        app[DRIVER] = drv
        self.driver = drv
        self.task = asyncio.get_running_loop().create_task(drv.run(), name="fairlib-serve-driver")
        self.task.add_done_callback(drv.on_done)

    async def on_cleanup(self, app: web.Application) -> None:
        """Called when the app stops.
        Returns once the driver's task has ended."""
        t = self.task
        if t is not None:
            t.cancel()
            try:
                await t
            except BaseException:  # cancelled, or failed (already reported by Driver.on_done)
                pass

    async def generate(self, request: web.Request, api: str) -> web.StreamResponse:
        """Called for each completions or chat request: parsed, its tenant found, queued.
        Returns its answer once the engine model has emitted it (streamed as it goes), or an error JSON."""
        drv: Driver = self.driver
        if drv.failed is not None:
            return _driver_failed(drv)
        try:
            req = parse_request(await read_json(request), api, self.cfg)
            st = self.submit(request, req)
        except BadRequest as e:
            return bad_request(e)
        except QueueFull as e:
            return error_response(429, str(e), "RateLimitError")
        out = _Out(api, self.cfg.model, req, st)
        try:
            if req["stream"]:
                try:
                    return await self.stream(request, st, out, req)
                except ConnectionError:  # the client went away mid-stream: abort (finally), no traceback
                    return web.Response(status=499)
            return await self.answer(st, out)
        finally:
            if not (st.finished or st.rejected):
                drv.abort(st)

    def submit(self, request: web.Request, req: dict):
        """Called by :meth:`generate` with a parsed request.
        Returns its driver state, queued (``BadRequest``, a 503, for a tenant beyond the cap, ``QueueFull``)."""
        cfg, drv = self.cfg, self.driver
        name = request.headers.get(cfg.tenant_header, "default")
        tenant = drv.tenant_index(name)
        if tenant is None:
            raise BadRequest(f"tenant {name!r}: this server tells apart at most {cfg.n_tenants} tenants, "
                             f"all taken ({', '.join(drv.tenant_names())}); restart fairlib serve with a larger "
                             f"--tenants", cfg.tenant_header, 503, "ServiceUnavailableError")
        out_tokens = drv.output_length(req["max_tokens"], req["min_tokens"], req["forced"])
        return drv.submit(tenant, req["prompt_tokens"], out_tokens, req["max_tokens"],
                          est_output_tokens=req["est_output_tokens"], klass=req["klass"], priority=req["priority"])

    async def answer(self, st, out: _Out) -> web.Response:
        """Called by :meth:`generate` for a request that asked for no stream, once queued.
        Returns its whole answer as JSON once it finished (429 when the policy rejects it, 500 on a fault)."""
        drv = self.driver
        while not (st.finished or st.rejected or drv.failed is not None):
            await st.event.wait()
            st.event.clear()
        if drv.failed is not None:
            return _driver_failed(drv)
        if st.rejected:
            return _rejected_response()
        return web.Response(body=dumps(out.full()).encode(), content_type="application/json")

    async def stream(self, request: web.Request, st, out: _Out, req: dict) -> web.StreamResponse:
        """Called by :meth:`generate` for a streamed request, once queued.
        Returns the event stream, written as the driver emits each iteration's tokens, to its [DONE]."""
        drv = self.driver
        resp = None
        while True:
            await st.event.wait()
            st.event.clear()
            if drv.failed is not None:
                if resp is None:
                    return _driver_failed(drv)
                await resp.write(error_event(f"the engine-model driver stopped: {drv.failed!r}",
                                             "InternalServerError", 500) + DONE_LINE)
                await resp.write_eof()
                return resp
            if st.rejected:
                return _rejected_response()
            n, st.pending = st.pending, 0
            parts = []
            if resp is None and (n or st.finished):
                resp = web.StreamResponse(status=200, headers=STREAM_HEADERS)
                await resp.prepare(request)
                if out.api == "chat":
                    parts.append(data_line(out.role_chunk()))
            if resp is None:        # no token yet and not finished: nothing to write
                continue
            for _ in range(n):
                last = st.finished and out.sent + 1 == st.emitted
                parts.append(data_line(out.token_chunk(last)))
            done = st.finished and out.sent == st.emitted
            if done:
                if req["include_usage"]:
                    parts.append(data_line(out.usage_chunk()))
                parts.append(DONE_LINE)
            if parts:
                if n:
                    lag = time.perf_counter() - st.last_target
                    drv.write_lags.append(lag)
                    drv.m_wlag.observe(max(lag, 0.0), drv.labels)
                await resp.write(b"".join(parts))
            if done:
                await resp.write_eof()
                return resp

    async def models(self, request: web.Request) -> web.Response:
        """Called for ``GET /v1/models``.
        Returns the one served model, with its context length."""
        cfg = self.cfg
        return web.json_response({"object": "list", "data": [{
            "id": cfg.model, "object": "model", "created": int(self.driver.t0_wall), "owned_by": "fairlib",
            "root": cfg.model, "parent": None, "max_model_len": cfg.max_model_len,
            "permission": []}]})

    async def health(self, request: web.Request) -> web.Response:
        """Called for ``GET /health``.
        Returns 200 while the driver runs, 503 before it started, 500 once it failed."""
        drv = self.driver
        if drv is None or drv.failed is not None:
            return _driver_failed(drv) if drv is not None else error_response(
                503, "the engine-model driver has not started", error_type(503))
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        """Called for ``GET /version``.
        Returns ``{"version": "fairlib-serve VERSION"}`` (what a fit reads to know a test double)."""
        return web.json_response({"version": f"fairlib-serve {__version__}"})

    async def metrics(self, request: web.Request) -> web.Response:
        """Called for ``GET /metrics``.
        Returns vLLM's metric names and ``fairlib_serve_*`` as Prometheus text (prometheus_client's)."""
        body, ctype = self.driver.metrics_exposition(request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": ctype,
                                                "X-Fairlib": "test double: the engine model, not an engine"})

    async def stats(self, request: web.Request) -> web.Response:
        """Called for ``GET /fairlib/stats``.
        Returns the configuration, the counts and the timing error so far (JSON)."""
        return web.json_response(self.driver.stats())


def make_app(cfg) -> web.Application:
    """The aiohttp application; its driver starts and stops with it (``app[DRIVER]``)."""
    return ServeApp(cfg).make_app()
