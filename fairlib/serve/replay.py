"""A tiny OpenAI-compatible test double for the client: replays or synthesises SSE streams.

Not an engine and not a simulator: it exists to check the client's parsing, timing and failure
handling against known bytes and known delays. Routes live under a prefix, one behaviour each:
``http://HOST:PORT/<route>/v1/completions`` (and ``/chat/completions``, ``/models``), plus
``/<route>/metrics`` (vLLM-style Prometheus text) and ``/<route>/version``.

Behaviours (picklable, so the server can also run in its own process):
``Synth`` (a vLLM- or llama.cpp-format stream sized by the request, with delays, optional
multi-token chunks, per-chunk usage, patched chunks or usage (NaN, a lying count), an abort, a
malformed line or a short output), ``Replay`` (recorded frames at given times), ``HttpError``,
``Hang``, ``Html`` (a 200 HTML page), ``NonStreamed`` (one JSON answer, ``stream`` ignored) and
``ByTenant`` (one of them per tenant header).
"""
from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from multiprocessing.process import BaseProcess
from typing import Optional

from aiohttp import web

__all__ = ["Synth", "Replay", "HttpError", "Hang", "Html", "NonStreamed", "ByTenant", "ReplayServer",
           "load_frames", "vllm_chunks", "llamacpp_chunks", "sse"]

FINGERPRINT = "b6915-4f5e3a1c"  # a llama.cpp-style build string (synthetic)
_FRAME = re.compile(rb"(.*?)(?:\r\n\r\n|\n\n|\r\r)", re.S)


def sse(obj) -> bytes:
    """One ``data:`` event (compact JSON, as vLLM and llama.cpp write it)."""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return f"data: {data}\n\n".encode("utf-8")


def load_frames(path) -> list:
    """Split a recorded SSE stream into frames, each ending with its blank line."""
    raw = Path(path).read_bytes()
    frames, pos = [], 0
    for m in _FRAME.finditer(raw):
        frames.append(raw[m.start():m.end()])
        pos = m.end()
    if raw[pos:].strip():
        frames.append(raw[pos:])
    return frames


# --- engine chunk formats ---------------------------------------------------------------------

def vllm_chunks(api: str, pieces: list, *, model: str, prompt_tokens: int, include_usage: bool = True,
                finish_reason: str = "length", token_ids: Optional[list] = None,
                prompt_token_ids: Optional[list] = None, rid: Optional[str] = None,
                created: Optional[int] = None, n_tokens: Optional[int] = None) -> list:
    """vLLM's chunks for ``pieces`` (one text per chunk) as dicts, in vLLM's field order.

    Completions chunks are dumped with all fields (``exclude_unset=False``); chat chunks with the
    fields vLLM sets (``exclude_unset=True``): the first is role-only; the last token chunk has
    ``finish_reason``; the usage chunk has ``choices: []``. ``token_ids``: ids per piece
    (``return_token_ids``), else None. ``n_tokens``: the completion tokens usage reports (default:
    the token ids, else one per piece).
    """
    created = int(time.time()) if created is None else created
    ids = token_ids or [None] * len(pieces)
    n_out = n_tokens if n_tokens is not None else sum(len(t) for t in token_ids) if token_ids else len(pieces)
    out = []
    if api == "chat":
        rid = rid or f"chatcmpl-{uuid.uuid4().hex}"
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
        out.append({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}],
                    "prompt_token_ids": prompt_token_ids})
        for k, (text, tid) in enumerate(zip(pieces, ids)):
            last = k == len(pieces) - 1
            choice = {"index": 0, "delta": {"content": text}, "logprobs": None,
                      "finish_reason": finish_reason if last else None}
            if last:
                choice["stop_reason"] = None
            choice["token_ids"] = tid
            out.append({**head, "choices": [choice]})
        obj = "chat.completion.chunk"
    else:
        rid = rid or f"cmpl-{uuid.uuid4().hex}"
        head = {"id": rid, "object": "text_completion", "created": created, "model": model}
        for k, (text, tid) in enumerate(zip(pieces, ids)):
            last = k == len(pieces) - 1
            out.append({**head, "choices": [{"index": 0, "text": text, "logprobs": None,
                                             "finish_reason": finish_reason if last else None,
                                             "stop_reason": None,
                                             "prompt_token_ids": prompt_token_ids if k == 0 else None,
                                             "token_ids": tid}], "usage": None})
        obj = "text_completion"
    if include_usage:
        out.append({"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                    "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + n_out,
                              "completion_tokens": n_out}})
    return out


def _timings(prompt_n: int, prompt_ms: float, predicted_n: int, predicted_ms: float) -> dict:
    return {"cache_n": 0, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / max(prompt_n, 1),
            "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
            "predicted_n": predicted_n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / max(predicted_n, 1),
            "predicted_per_second": 1e3 * predicted_n / predicted_ms if predicted_ms > 0 else 0.0}


def llamacpp_chunks(api: str, pieces: list, *, model: str, prompt_tokens: int, include_usage: bool = True,
                    finish_reason: str = "length", prompt_ms: float = 1.0, predicted_ms: float = 1.0,
                    rid: Optional[str] = None, created: Optional[int] = None,
                    n_tokens: Optional[int] = None) -> list:
    """llama-server's OpenAI-compatible chunks, in its field order (nlohmann ordered_json).

    Completions: one chunk per token, then a final chunk with empty text, ``finish_reason``,
    ``usage`` (always) and ``timings``. Chat: a role-only first chunk (``content: null``), token
    deltas, a final chunk with an empty delta and ``finish_reason``, and a ``choices: []`` usage
    chunk only when ``include_usage``; ``timings`` ride on the last chunk. ``n_tokens``: the
    completion tokens usage and timings report (default: one per piece).
    """
    created = int(time.time()) if created is None else created
    rid = rid or "chatcmpl-" + uuid.uuid4().hex
    n = len(pieces) if n_tokens is None else n_tokens
    usage = {"completion_tokens": n, "prompt_tokens": prompt_tokens, "total_tokens": n + prompt_tokens}
    timings = _timings(prompt_tokens, prompt_ms, n, predicted_ms)
    out = []
    if api == "chat":
        def chunk(delta, finish=None):
            return {"choices": [{"finish_reason": finish, "index": 0, "delta": delta}], "created": created,
                    "id": rid, "model": model, "system_fingerprint": FINGERPRINT, "object": "chat.completion.chunk"}
        out.append(chunk({"role": "assistant", "content": None}))
        out += [chunk({"content": t}) for t in pieces]
        out.append(chunk({}, finish_reason))
        if include_usage:
            out.append({"choices": [], "created": created, "id": rid, "model": model,
                        "system_fingerprint": FINGERPRINT, "object": "chat.completion.chunk", "usage": usage})
        out[-1]["timings"] = timings
    else:
        def chunk(text, finish=None):
            return {"choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
                    "created": created, "model": model, "system_fingerprint": FINGERPRINT,
                    "object": "text_completion"}
        out += [{**chunk(t), "id": rid} for t in pieces]
        out.append({**chunk("", finish_reason), "usage": usage, "id": rid, "timings": timings})
    return out


# --- behaviours -------------------------------------------------------------------------------

@dataclass
class Synth:
    """A stream in an engine's format, sized by the request (``max_tokens`` unless ``n_tokens``)."""

    flavor: str = "vllm"                 # "vllm" or "llamacpp"
    ttft_s: float = 0.0                  # request arrival -> first token chunk
    itl_s: float = 0.0                   # gap between token chunks
    n_tokens: Optional[int] = None       # generate this many (short streams), default max_tokens
    tokens_per_chunk: int = 1            # vLLM --stream-interval
    abort_after: Optional[int] = None    # drop the connection after this many token chunks
    garbage_after: Optional[int] = None  # then send a line that is not JSON
    send_done: bool = True
    comment_every: int = 0               # a ': ping' comment line every k frames
    chunk_pattern: tuple = ()            # tokens per chunk, cycled (overrides tokens_per_chunk)
    continuous_usage: bool = False       # vLLM continuous_usage_stats: cumulative usage on each token chunk
    chunk_patch: Optional[dict] = None   # merged into every token chunk (e.g. a NaN field)
    usage_patch: Optional[dict] = None   # merged into the usage object (e.g. a NaN or a lying count)

    async def serve(self, request, body, api, model):
        n = int(self.n_tokens if self.n_tokens is not None else body.get("max_tokens") or 16)
        want_ids = bool(body.get("return_token_ids")) and self.flavor == "vllm"
        sizes = [max(1, int(x)) for x in self.chunk_pattern] or [max(1, self.tokens_per_chunk)]
        groups, i = [], 0
        while i < n:
            k = sizes[len(groups) % len(sizes)]
            groups.append(list(range(i, min(i + k, n))))
            i += k
        pieces = ["".join(f" w{j}" for j in g) for g in groups]
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        finish = "length" if n >= int(body.get("max_tokens") or n) else "stop"
        p = _prompt_len(body, api)
        if self.flavor == "llamacpp":
            chunks = llamacpp_chunks(api, pieces, model=model, prompt_tokens=p, include_usage=include_usage,
                                     finish_reason=finish, prompt_ms=self.ttft_s * 1e3,
                                     predicted_ms=self.itl_s * 1e3 * max(n - 1, 0), n_tokens=n)
        else:
            chunks = vllm_chunks(api, pieces, model=model, prompt_tokens=p, include_usage=include_usage,
                                 finish_reason=finish, token_ids=[[1000 + j for j in g] for g in groups] if want_ids else None,
                                 prompt_token_ids=list(range(p)) if want_ids else None, n_tokens=n)
        lead = 1 if api == "chat" else 0  # the role chunk goes out at once
        _patch(chunks, lead, groups, p, self)
        resp = await _start_stream(request)
        t0 = time.perf_counter()
        sent_tokens = 0
        for idx, ch in enumerate(chunks):
            is_token = lead <= idx < lead + len(pieces)
            if is_token:
                due = t0 + self.ttft_s + self.itl_s * sent_tokens
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
            frame = sse(ch)
            if self.comment_every and idx % self.comment_every == 0:
                frame = b": ping\n\n" + frame
            await resp.write(frame)
            if is_token:
                sent_tokens += 1
                if self.garbage_after is not None and sent_tokens == self.garbage_after:
                    await resp.write(b'data: {"id":"cmpl-broken","choices":[{"text":\n\n')
                if self.abort_after is not None and sent_tokens == self.abort_after:
                    await _abort(request)
                    return resp
        if self.send_done:
            await resp.write(sse("[DONE]"))
        await resp.write_eof()
        return resp


def _patch(chunks: list, lead: int, groups: list, prompt: int, synth: Synth) -> None:
    """Apply ``Synth``'s per-chunk usage and patches to the built chunks (in place)."""
    done = 0
    for idx in range(lead, lead + len(groups)):
        done += len(groups[idx - lead])
        if synth.continuous_usage:
            chunks[idx]["usage"] = {"prompt_tokens": prompt, "total_tokens": prompt + done,
                                    "completion_tokens": done}
        if synth.chunk_patch:
            chunks[idx].update(synth.chunk_patch)
    final = chunks[-1]  # the usage chunk (vLLM, llama.cpp chat) or llama.cpp's final chunk
    if synth.usage_patch and isinstance(final.get("usage"), dict):
        final["usage"].update(synth.usage_patch)


@dataclass
class Html:
    """A 200 HTML page (a captive portal, a proxy's login page) where a stream was expected."""

    body: str = "<!DOCTYPE html><html><head><title>Sign in</title></head><body>Please sign in</body></html>"

    async def serve(self, request, body, api, model):
        return web.Response(text=self.body, content_type="text/html")


@dataclass
class NonStreamed:
    """One JSON answer (vLLM's non-streamed shape), ``stream: true`` ignored, after ``delay_s``."""

    n_tokens: Optional[int] = None
    delay_s: float = 0.0

    async def serve(self, request, body, api, model):
        await asyncio.sleep(self.delay_s)
        n = int(self.n_tokens if self.n_tokens is not None else body.get("max_tokens") or 16)
        text = "".join(f" w{j}" for j in range(n))
        p = _prompt_len(body, api)
        finish = "length" if n >= int(body.get("max_tokens") or n) else "stop"
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                  if api == "chat" else {"index": 0, "text": text, "logprobs": None, "finish_reason": finish})
        return web.json_response({
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "chat.completion" if api == "chat" else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice],
            "usage": {"prompt_tokens": p, "total_tokens": p + n, "completion_tokens": n}})


@dataclass
class Replay:
    """Recorded frames, frame ``i`` written ``offsets_s[i]`` after the request arrived."""

    frames: list
    offsets_s: list = field(default_factory=list)

    async def serve(self, request, body, api, model):
        offsets = self.offsets_s or [0.0] * len(self.frames)
        resp = await _start_stream(request)
        t0 = time.perf_counter()
        for frame, off in zip(self.frames, offsets):
            await asyncio.sleep(max(0.0, t0 + off - time.perf_counter()))
            await resp.write(frame)
        await resp.write_eof()
        return resp


@dataclass
class HttpError:
    """An OpenAI-style JSON error with this status."""

    status: int = 500
    message: str = "replayed error"
    delay_s: float = 0.0

    async def serve(self, request, body, api, model):
        await asyncio.sleep(self.delay_s)
        kind = {400: "BadRequestError", 429: "RateLimitError"}.get(self.status, "InternalServerError")
        err = {"error": {"message": self.message, "type": kind, "param": None, "code": self.status}}
        return web.json_response(err, status=self.status)


@dataclass
class Hang:
    """Never finish: stall ``seconds`` (after sending 200 headers when ``after_headers``)."""

    seconds: float = 3600.0
    after_headers: bool = True

    async def serve(self, request, body, api, model):
        resp = await _start_stream(request) if self.after_headers else None
        await asyncio.sleep(self.seconds)
        return resp or web.Response(status=204)


@dataclass
class ByTenant:
    """Pick the behaviour by the tenant header (``default`` when absent or unknown)."""

    behaviours: dict
    default: object = None
    header: str = "X-Tenant"

    async def serve(self, request, body, api, model):
        b = self.behaviours.get(request.headers.get(self.header, ""), self.default)
        if b is None:
            return web.json_response({"error": {"message": "unknown tenant", "code": 400}}, status=400)
        return await b.serve(request, body, api, model)


def _prompt_len(body, api) -> int:
    if api == "chat":
        return sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
    p = body.get("prompt", "")
    return len(p) if isinstance(p, list) else len(str(p).split())


async def _start_stream(request):
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                   "Cache-Control": "no-cache"})
    await resp.prepare(request)
    return resp


async def _abort(request):
    if request.transport is not None:
        request.transport.abort()
    raise asyncio.CancelledError  # let aiohttp drop the handler without finishing the response


# --- the server -------------------------------------------------------------------------------

def _metrics_text(state: dict, model: str) -> str:
    lab = f'engine="0",model_name="{model}"'
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{lab}}} {float(state['active'])}",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{lab}}} 0.0",
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{{lab},finished_reason="length"}} {float(state["finished"])}',
        "# TYPE vllm:e2e_request_latency_seconds histogram",
        f'vllm:e2e_request_latency_seconds_bucket{{{lab},le="1.0"}} {float(state["finished"])}',
        f'vllm:e2e_request_latency_seconds_bucket{{{lab},le="+Inf"}} {float(state["finished"])}',
        "# TYPE process_cpu_seconds_total counter",
        "process_cpu_seconds_total 1.5",
    ]
    return "\n".join(lines) + "\n"


def make_app(routes: dict, model: str = "replay-model", state: Optional[dict] = None) -> web.Application:
    state = state if state is not None else {}
    state.setdefault("active", 0)
    state.setdefault("finished", 0)
    state.setdefault("requests", [])

    async def generate(request):
        behaviour = routes.get(request.match_info["route"])
        if behaviour is None:
            raise web.HTTPNotFound()
        api = "chat" if request.path.endswith("/chat/completions") else "completions"
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": {"message": "body is not JSON", "code": 400}}, status=400)
        state["requests"].append({"path": request.path, "headers": dict(request.headers), "body": body,
                                  "t": time.time()})
        state["active"] += 1
        try:
            return await behaviour.serve(request, body, api, model)
        except ConnectionError:  # the client went away mid-stream (as it should on bad data)
            raise asyncio.CancelledError from None
        finally:
            state["active"] -= 1
            state["finished"] += 1

    async def models(request):
        return web.json_response({"object": "list", "data": [
            {"id": model, "object": "model", "created": int(time.time()), "owned_by": "fairlib-replay",
             "root": model, "parent": None, "max_model_len": 8192}]})

    async def version(request):
        return web.json_response({"version": "fairlib-replay"})

    async def metrics(request):
        return web.Response(text=_metrics_text(state, model), content_type="text/plain")

    app = web.Application()
    app.router.add_post("/{route}/v1/completions", generate)
    app.router.add_post("/{route}/v1/chat/completions", generate)
    app.router.add_get("/{route}/v1/models", models)
    app.router.add_get("/{route}/version", version)
    app.router.add_get("/{route}/metrics", metrics)
    return app


async def _bind(app, host, port):
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, runner.addresses[0][1]


def _serve_process(routes, host, port, model, conn):
    async def main():
        runner, bound = await _bind(make_app(routes, model), host, port)
        conn.send(bound)
        await asyncio.Event().wait()
    asyncio.run(main())


class ReplayServer:
    """Run the test double on 127.0.0.1 in a background thread (default) or its own process."""

    def __init__(self, routes: dict, host: str = "127.0.0.1", port: int = 0, model: str = "replay-model",
                 process: bool = False):
        self.routes, self.host, self.port, self.model, self.process = routes, host, port, model, process
        self.state: dict = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._runner: Optional[web.AppRunner] = None
        self._proc: Optional[BaseProcess] = None

    def url(self, route: str) -> str:
        """The OpenAI base URL (ending in /v1) of a route."""
        return f"http://{self.host}:{self.port}/{route}/v1"

    def start(self) -> "ReplayServer":
        if self.process:
            ctx = mp.get_context("spawn")
            parent, child = ctx.Pipe()
            self._proc = ctx.Process(target=_serve_process, args=(self.routes, self.host, self.port, self.model, child),
                                     daemon=True, name="fairlib-replay")
            self._proc.start()
            if not parent.poll(60):
                self._proc.terminate()
                raise RuntimeError("replay server process did not start")
            self.port = parent.recv()
            return self
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def main():
            asyncio.set_event_loop(self._loop)
            self._runner, self.port = self._loop.run_until_complete(
                _bind(make_app(self.routes, self.model, self.state), self.host, self.port))
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=main, name="fairlib-replay", daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("replay server did not start")
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.join(5)
            self._proc = None
        if self._thread is not None:
            assert self._loop is not None       # start() sets the loop before the thread
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
