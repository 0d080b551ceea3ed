"""Preflight: one request per API before a run's clock starts, as ``vllm bench serve`` sends its
test request first.

A setup in which every request would fail (the server is down, the base URL lacks ``/v1``, the
model is not served, a credential is missing) ends before the run starts, with the server's own
message and a hint that fits the cause, instead of a window of identical errors whose message
only ``records.jsonl`` holds. The test request is the schedule's first request of each API with
``max_tokens`` 1 (its own prompt, tenant and headers, so a context limit or an unknown tenant
shows too); its outcome goes to ``config.json`` (``preflight``), never to the records.

Causes (``PreflightError.cause``) and their hints:

- ``down``: no connection, or no answer: is the server up, is this its base URL?
- ``path``: HTTP 404 that names no model: the server has no such route (most often a base URL
  without ``/v1``);
- ``model``: HTTP 404 naming the model: the models the server lists (``GET /v1/models``);
- ``auth``: HTTP 401/403: the key or header to pass;
- ``server``: any other failure (a 400 naming a field, a 5xx, a stream that is not SSE).
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from typing import Optional

from fairlib.client.endpoint import EndpointConfig, mask_url, redact
from fairlib.client.runner import RunClock, make_session, send_request

__all__ = ["PreflightError", "list_models", "resolve_model", "preflight", "CAUSES"]

CAUSES = ("down", "path", "model", "auth", "server")
TIMEOUT_S = 60.0    # the test request's limit (the run's own --timeout-s when shorter)

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class PreflightError(RuntimeError):
    """The setup cannot serve the run: ``cause`` (:data:`CAUSES`), the server's ``message`` (or the
    connection's), a ``hint`` fitting the cause, the HTTP ``status`` when there was one."""

    def __init__(self, cause: str, message: str, hint: str, status: Optional[int] = None):
        self.cause, self.message, self.hint, self.status = cause, message, hint, status
        super().__init__(f"{message.rstrip().rstrip('.')}; {hint}")


def _base_hint(cfg: EndpointConfig) -> str:
    return f"is the server up, and is {mask_url(cfg.plain_base_url)} its base URL (http://HOST:PORT/v1)?"


def _path_hint(cfg: EndpointConfig, what: str) -> str:
    base = mask_url(cfg.plain_base_url.rstrip("/"))
    if not base.endswith("/v1"):
        return f"the server has no {what}: is the base URL missing /v1? (try --endpoint {base}/v1)"
    return f"the server has no {what}: is {base} an OpenAI-compatible base URL (http://HOST:PORT/v1)?"


def _auth_hint() -> str:
    return "pass the server's key with --api-key (or OPENAI_API_KEY), or the header it wants with --header"


def _server_message(raw: bytes) -> str:
    """The ``error.message`` (OpenAI, vLLM) or ``detail`` (FastAPI) of an error body, else its text."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
    except ValueError:
        return text[:500] or "(empty body)"
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict) and (err.get("message") or err.get("detail")):
            return str(err.get("message") or err.get("detail"))
        if isinstance(err, str):
            return err
    return text[:500]


def list_models(cfg: EndpointConfig, timeout_s: float = 5.0) -> list:
    """The model ids ``GET <base>/models`` lists (credentials sent); :class:`PreflightError` with
    the cause's hint when it cannot be read."""
    url = cfg.plain_base_url.rstrip("/") + "/models"
    shown = mask_url(url)
    try:
        with _opener.open(urllib.request.Request(url, headers={**cfg.headers, **cfg.auth_headers}),
                          timeout=timeout_s) as r:
            data = json.loads(r.read(1 << 20))
    except urllib.error.HTTPError as e:
        msg = redact(f"GET {shown}: HTTP {e.code}: {_server_message(e.read(4096))}", cfg.secrets)
        if e.code == 404:
            raise PreflightError("path", msg, _path_hint(cfg, "/models"), 404) from None
        if e.code in (401, 403):
            raise PreflightError("auth", msg, _auth_hint(), e.code) from None
        raise PreflightError("server", msg, "the server failed to list its models", e.code) from None
    except (OSError, ValueError) as e:   # refused, unreachable, timed out; a body that is not JSON
        why = redact(f"{type(e).__name__}: {getattr(e, 'reason', e)}", cfg.secrets)
        if isinstance(e, ValueError):
            raise PreflightError("path", f"GET {shown}: the answer is not JSON ({why})",
                                 _path_hint(cfg, "OpenAI /models route")) from None
        raise PreflightError("down", f"GET {shown}: cannot connect ({why})", _base_hint(cfg)) from None
    try:
        return [str(m["id"]) for m in data["data"]]
    except (KeyError, TypeError):
        raise PreflightError("path", f"GET {shown}: not an OpenAI model list",
                             _path_hint(cfg, "OpenAI /models route")) from None


def resolve_model(cfg: EndpointConfig) -> str:
    """The first model the endpoint lists (``fairlib run`` without ``--model``)."""
    models = list_models(cfg)
    if not models:
        raise PreflightError("model", f"GET {mask_url(cfg.plain_base_url.rstrip('/'))}/models lists no model",
                             "pass the model name with --model")
    return models[0]


def _explain(rec: dict, cfg: EndpointConfig, url: str) -> PreflightError:
    """The failed test request's record as a :class:`PreflightError`."""
    cls, status = rec["error_class"], rec["http_status"]
    msg = f"POST {mask_url(url)}: {rec['error_message']}"
    if cls in ("connect_error", "timeout"):
        return PreflightError("down", msg, _base_hint(cfg))
    if status == 404:   # a route the server lacks, or a model it does not serve: its model list tells which
        route = url[len(cfg.plain_base_url.rstrip("/")):] or url
        try:
            models = list_models(cfg)
        except PreflightError as e:
            if e.cause == "path":
                return PreflightError("path", msg, _path_hint(cfg, route), 404)
            models = None
        if models is not None and cfg.model in models:
            return PreflightError("path", msg, _path_hint(cfg, route), 404)
        hint = (f"the server serves {', '.join(repr(m) for m in models)}: pass one with --model" if models
                else "pass a model the server serves with --model (GET /v1/models lists them)")
        return PreflightError("model", msg, hint, 404)
    if status in (401, 403):
        return PreflightError("auth", msg, _auth_hint(), status)
    hints = {
        "http_4xx": "the server refused the run's first request: the message names what it wants (--api, "
                    "--no-ignore-eos for a server that rejects ignore_eos, --model)",
        "http_429": "the server refuses new requests (a rate limit or a full queue): wait, or lower the load",
        "http_5xx": "the server failed on the run's first request (its log says why)",
        "bad_content_type": "the answer is not an OpenAI stream: is this an OpenAI-compatible endpoint?",
        "malformed_sse": "the stream is not OpenAI's server-sent events: is this an OpenAI-compatible endpoint?",
        "disconnect": "the server closed the stream before its end",
        "short_stream": "the server ended the stream before max_tokens: it ignores ignore_eos (try --send-min-tokens)",
    }
    return PreflightError("server", msg, hints.get(cls, "the run's requests would fail the same way"), status)


def _send(req, cfg: EndpointConfig) -> dict:
    async def main():
        async with make_session(cfg) as session:
            return await send_request(session, req, cfg, RunClock(time.time()))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    box: dict = {}   # a loop runs in this thread (Jupyter): send from a helper thread
    th = threading.Thread(target=lambda: box.setdefault("r", asyncio.run(main())), name="fairlib-preflight")
    th.start()
    th.join()
    return box["r"]


def preflight(schedule, cfg: EndpointConfig) -> list:
    """Send the schedule's first request of each API, with ``max_tokens`` 1, and wait for it;
    returns one ``{"api", "tenant", "http_status", "ttft_ms", "e2e_ms"}`` per API, or raises
    :class:`PreflightError` for the first that failed (the server's message and the hint)."""
    first: dict = {}
    for r in schedule:
        first.setdefault(r.api, r)
    pcfg = replace(cfg, timeout_s=min(cfg.timeout_s, TIMEOUT_S))
    out = []
    for api, req in first.items():
        rec = _send(replace(req, max_tokens=1, send_offset_s=0.0), pcfg)
        if rec["error_class"] != "none":
            raise _explain(rec, cfg, cfg.url(api))
        ms = (lambda v: None if v is None else round(1e3 * v, 3))
        out.append({"api": api, "tenant": req.tenant_name, "http_status": rec["http_status"],
                    "ttft_ms": ms(rec["ttft_s"]), "e2e_ms": ms(rec["e2e_s"])})
    return out
