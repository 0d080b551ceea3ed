"""How to talk to one OpenAI-compatible engine: ``EndpointConfig`` and the request it builds.

Every request streams with ``stream_options.include_usage``; the output length is forced with
``max_tokens`` (chat: also ``max_completion_tokens``) plus ``ignore_eos: true`` where the engine
accepts it, optionally ``min_tokens = max_tokens``; ``priority`` is sent only when asked (a
non-zero priority is an error on an FCFS vLLM server). ``extra_body`` is merged last, so it can
override anything (e.g. ``{"return_token_ids": true}`` for vLLM, ``{"cache_prompt": false}`` for
llama.cpp).
"""
from __future__ import annotations

import json
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Optional

__all__ = ["EndpointConfig", "build_request", "server_root", "resolve_model"]


def server_root(base_url: str) -> str:
    """An OpenAI base URL without its trailing ``/v1``: where ``/metrics``, ``/health`` and
    ``/version`` live."""
    root = str(base_url).rstrip("/")
    return root[:-3] if root.endswith("/v1") else root


@dataclass(frozen=True)
class EndpointConfig:
    """Connection and request-shaping settings for one engine."""

    base_url: str = "http://127.0.0.1:8000/v1"  # the OpenAI base, ending in /v1
    model: str = "default"
    api: Optional[str] = None        # "completions" / "chat"; None: each request's own api
    ignore_eos: bool = True
    send_min_tokens: bool = False    # also send min_tokens = max_tokens
    send_priority: bool = False      # send the request's priority (vLLM: lower = earlier)
    extra_body: dict = field(default_factory=dict)
    timeout_s: float = 600.0         # whole request, connect to last byte
    connect_timeout_s: Optional[float] = None
    tenant_header: Optional[str] = "X-Tenant"
    headers: dict = field(default_factory=dict)
    api_key: Optional[str] = None
    metrics_url: Optional[str] = None  # default: server root + /metrics

    def __post_init__(self):
        if self.api not in (None, "completions", "chat"):
            raise ValueError(f"EndpointConfig.api must be None, 'completions' or 'chat', got {self.api!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"EndpointConfig.timeout_s must be > 0, got {self.timeout_s!r}")

    @property
    def server_root(self) -> str:
        """``base_url`` without a trailing ``/v1``: where ``/metrics`` and ``/version`` live."""
        return server_root(self.base_url)

    @property
    def resolved_metrics_url(self) -> str:
        return self.metrics_url or self.server_root + "/metrics"

    def url(self, api: str) -> str:
        return self.base_url.rstrip("/") + ("/chat/completions" if api == "chat" else "/completions")

    def to_dict(self) -> dict:
        d = asdict(self)
        if d.get("api_key"):
            d["api_key"] = "<set>"
        d["resolved_metrics_url"] = self.resolved_metrics_url
        return d


def build_request(req, cfg: EndpointConfig) -> tuple:
    """``(url, headers, body_bytes)`` for one ``PlannedRequest``."""
    api = req.api
    if cfg.api is not None and cfg.api != api:
        raise ValueError(f"request {req.request_id} is a {api} request but the endpoint is set to {cfg.api}")
    body = {"model": cfg.model}
    if api == "chat":
        if not isinstance(req.prompt, str):
            raise ValueError(f"request {req.request_id}: chat needs a text prompt")
        body["messages"] = [{"role": "user", "content": req.prompt}]
        body["max_tokens"] = req.max_tokens
        body["max_completion_tokens"] = req.max_tokens
    else:
        body["prompt"] = req.prompt if isinstance(req.prompt, str) else list(req.prompt)
        body["max_tokens"] = req.max_tokens
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    if cfg.send_min_tokens:
        body["min_tokens"] = req.max_tokens
    if cfg.send_priority:
        body["priority"] = int(req.priority)
    body.update(cfg.extra_body)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **cfg.headers}
    if cfg.tenant_header:
        headers[cfg.tenant_header] = req.tenant_name
    if cfg.api_key:
        headers["Authorization"] = f"Bearer {cfg.api_key}"
    return cfg.url(api), headers, json.dumps(body, separators=(",", ":")).encode("utf-8")


def resolve_model(endpoint: str, timeout_s: float = 5.0) -> str:
    """The first model the endpoint lists at ``GET <base>/models`` (OpenAI API). Raises
    ``ValueError`` naming the endpoint when it cannot be read or lists none."""
    url = endpoint.rstrip("/") + "/models"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as r:
            data = json.loads(r.read(1 << 20))
        return str(data["data"][0]["id"])
    except (OSError, ValueError) as e:
        raise ValueError(f"{url}: cannot read the model list ({type(e).__name__}: {e}); pass the model name") from None
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"{url} lists no model; pass the model name") from None
