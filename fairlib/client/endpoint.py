"""How to talk to one OpenAI-compatible engine: ``EndpointConfig`` and the request it builds.

Every request streams with ``stream_options.include_usage``; the output length is forced with
``max_tokens`` (chat: also ``max_completion_tokens``) plus ``ignore_eos: true`` where the engine
accepts it, optionally ``min_tokens = max_tokens``; ``priority`` is sent only when asked (a
non-zero priority is an error on an FCFS vLLM server). ``extra_body`` is merged last, so it can
override anything (e.g. ``{"return_token_ids": true}`` for vLLM, ``{"cache_prompt": false}`` for
llama.cpp).

Credentials: ``api_key`` is sent as ``Authorization: Bearer <key>``; a ``user:password@`` in
``base_url`` as ``Authorization: Basic`` (the URL itself is sent without it). Nothing the client
writes or prints holds a secret: ``to_dict`` and :func:`redact` mask the key, secret headers
(:func:`is_secret_name`), a URL's userinfo and its secret query parameters as ``***``.
"""
from __future__ import annotations

import base64
import json
import re
import urllib.request
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Optional
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = ["EndpointConfig", "build_request", "server_root", "resolve_model", "check_url", "mask_url",
           "mask_headers", "is_secret_name", "redact", "MASK"]

MASK = "***"
#: header and query-parameter names whose values are secrets (also any name containing one of _SECRET_PARTS)
SECRET_NAMES = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie", "api-key", "x-api-key",
                          "pwd", "sig"})
_SECRET_PARTS = ("token", "secret", "key", "password", "passwd", "auth", "cookie", "credential", "signature")
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@?#]*@")
_QUERY_PARAM = re.compile(r"([?&;])([^=&;#\s]+)=([^&;#\s]*)")


def is_secret_name(name) -> bool:
    """A header or query parameter that carries a secret: Authorization, Proxy-Authorization,
    Cookie, api-key, x-api-key, or any name containing token, secret, key, password, auth,
    cookie, credential or signature (case-insensitive)."""
    n = str(name).lower()
    return n in SECRET_NAMES or any(part in n for part in _SECRET_PARTS)


def mask_headers(headers) -> dict:
    """``headers`` with every secret header's value replaced by ``***``."""
    return {k: (MASK if is_secret_name(k) else v) for k, v in dict(headers or {}).items()}


def _mask_param(m) -> str:
    return f"{m.group(1)}{m.group(2)}={MASK}" if is_secret_name(unquote(m.group(2))) else m.group(0)


def mask_url(text) -> str:
    """``text`` (a URL, or a message holding URLs) with each URL's userinfo (``user:password@``)
    and the values of its secret query parameters (``?api_key=``, ``&token=``) masked."""
    return _QUERY_PARAM.sub(_mask_param, _URL_USERINFO.sub(lambda m: m.group(1) + MASK + "@", str(text)))


def redact(obj, secrets=()):
    """``obj`` (JSON-like) with every string passed through :func:`mask_url` and every
    occurrence of a value in ``secrets`` (e.g. ``EndpointConfig.secrets``) replaced by ``***``
    (values of 4 characters or more: a shorter one is masked only where it is known to stand, a
    header's value or a URL's userinfo, lest every ``a`` in a file be masked)."""
    values = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def walk(o):
        if isinstance(o, str):
            o = mask_url(o)
            for v in values:
                o = o.replace(v, MASK)
            return o
        if isinstance(o, dict):
            return {walk(k) if isinstance(k, str) else k: walk(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [walk(v) for v in o]
        return o

    return walk(obj)


def check_url(url, what: str = "base_url") -> str:
    """``url`` when it is an ``http://`` or ``https://`` URL with a host; else ``ValueError``
    naming ``what`` (the URL masked)."""
    shown = mask_url(url)
    try:
        parts = urlsplit(str(url).strip())
        _ = parts.port                                      # raises on a bad port
    except ValueError as e:
        raise ValueError(f"{what} must be an http:// or https:// URL such as http://127.0.0.1:8000/v1, got "
                         f"{shown!r} ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{what} must be an http:// or https:// URL such as http://127.0.0.1:8000/v1, got {shown!r}")
    return str(url).strip()


def _split_userinfo(url: str) -> tuple:
    """``(url without user:password@, "Basic ..." header value or None)``."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode("utf-8")).decode("ascii")
    return urlunsplit(parts._replace(netloc=host)), f"Basic {token}"


def server_root(base_url: str) -> str:
    """An OpenAI base URL without its trailing ``/v1``: where ``/metrics``, ``/health`` and
    ``/version`` live."""
    root = str(base_url).rstrip("/")
    return root[:-3] if root.endswith("/v1") else root


@dataclass(frozen=True)
class EndpointConfig:
    """Connection and request-shaping settings for one engine (module docstring: the request body).

    Parameters
    ----------
    base_url : str, default "http://127.0.0.1:8000/v1"
        The OpenAI base URL, ``http://`` or ``https://`` with a host, ending in ``/v1``; a
        ``user:password@`` in it is sent as ``Authorization: Basic``.
    model : str, default "default"
        The ``model`` every request names.
    api : {None, "completions", "chat"}, default None
        The one API every request must use; ``None``: each request's own ``api``.
    ignore_eos : bool, default True
        Send ``ignore_eos: true`` so the output runs to ``max_tokens``.
    send_min_tokens : bool, default False
        Also send ``min_tokens = max_tokens``.
    send_priority : bool, default False
        Send the request's ``priority`` (vLLM: lower = earlier; an error on an FCFS server).
    extra_body : dict, optional
        Merged into every request body last (it can override any field).
    timeout_s : float, default 600.0
        Limit on one whole request, connect to last byte (s, > 0).
    connect_timeout_s : float, optional
        Limit on the connect alone (s); ``None``: only ``timeout_s``.
    tenant_header : str or None, default "X-Tenant"
        The header carrying the tenant's name; ``None`` sends none.
    headers : dict, optional
        More headers on every request (and on the ``/metrics`` reads).
    api_key : str, optional
        Sent as ``Authorization: Bearer <api_key>``; never written or printed.
    metrics_url : str, optional
        Where ``/metrics`` is read; default the server root's ``/metrics``.

    Raises
    ------
    ValueError
        ``base_url`` or ``metrics_url`` not an http(s) URL with a host, ``api`` not one of the
        three, ``timeout_s`` not > 0 (each naming the field).
    """

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
        check_url(self.base_url, "EndpointConfig.base_url")
        if self.metrics_url is not None:
            check_url(self.metrics_url, "EndpointConfig.metrics_url")
        if self.api not in (None, "completions", "chat"):
            raise ValueError(f"EndpointConfig.api must be None, 'completions' or 'chat', got {self.api!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"EndpointConfig.timeout_s must be > 0, got {self.timeout_s!r}")

    @cached_property
    def _plain(self) -> tuple:
        """``(base_url without userinfo, its Basic authorization or None)``."""
        return _split_userinfo(self.base_url)

    @property
    def plain_base_url(self) -> str:
        """``base_url`` without ``user:password@`` (those go in the Authorization header)."""
        return self._plain[0]

    @property
    def server_root(self) -> str:
        """``base_url`` (without userinfo) and without a trailing ``/v1``: where ``/metrics`` and
        ``/version`` live."""
        return server_root(self.plain_base_url)

    @property
    def resolved_metrics_url(self) -> str:
        """Where ``/metrics`` is read: ``metrics_url`` (without userinfo) or the server root's."""
        return _split_userinfo(self.metrics_url)[0] if self.metrics_url else self.server_root + "/metrics"

    @property
    def metrics_headers(self) -> dict:
        """The headers a ``/metrics`` GET sends: the endpoint's own and its credentials (those of
        ``metrics_url``'s userinfo when it has some), as a gateway in front may guard it."""
        basic = _split_userinfo(self.metrics_url)[1] if self.metrics_url else None
        auth = {"Authorization": basic} if basic else self.auth_headers
        return {**{k: v for k, v in self.headers.items() if not (auth and k.lower() == "authorization")}, **auth}

    @cached_property
    def auth_headers(self) -> dict:
        """The credentials as headers: ``Authorization: Bearer <api_key>``, else ``Basic`` from
        the URL's userinfo, unless ``headers`` sets its own Authorization."""
        if self.api_key:
            return {"Authorization": f"Bearer {self.api_key}"}
        if self._plain[1] and not any(k.lower() == "authorization" for k in self.headers):
            return {"Authorization": self._plain[1]}
        return {}

    @property
    def secrets(self) -> tuple:
        """The secret strings this configuration holds (never to be written or printed)."""
        out = [self.api_key] if self.api_key else []
        for k, v in self.headers.items():
            if is_secret_name(k) and v:
                out += [str(v), *str(v).split()[1:]]     # "Bearer xyz": also xyz
        for url in (self.base_url, self.metrics_url):
            if url:
                p = urlsplit(url)
                if "@" in p.netloc:
                    userinfo = p.netloc.rpartition("@")[0]
                    password = userinfo.partition(":")[2]
                    out += [userinfo, password, unquote(password)]
                for m in _QUERY_PARAM.finditer("?" + p.query):
                    if is_secret_name(unquote(m.group(2))) and m.group(3):
                        out += [m.group(3), unquote(m.group(3))]
        return tuple(s for s in out if s)

    def url(self, api: str) -> str:
        return self.plain_base_url.rstrip("/") + ("/chat/completions" if api == "chat" else "/completions")

    def to_dict(self) -> dict:
        """The settings as written to ``config.json``: secrets masked (``api_key`` "<set>",
        secret headers and URL credentials ``***``)."""
        d = asdict(self)
        if d.get("api_key"):
            d["api_key"] = "<set>"
        d["base_url"] = mask_url(self.base_url)
        d["metrics_url"] = None if self.metrics_url is None else mask_url(self.metrics_url)
        d["headers"] = mask_headers(self.headers)
        d["resolved_metrics_url"] = mask_url(self.resolved_metrics_url)
        return redact(d, self.secrets)


def build_request(req, cfg: EndpointConfig) -> tuple:
    """``(url, headers, body_bytes)`` for one ``PlannedRequest``."""
    api = req.api
    if cfg.api is not None and cfg.api != api:
        raise ValueError(f"request {req.request_id} is a {api} request but the endpoint is set to {cfg.api}")
    body: dict = {"model": cfg.model}
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
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **cfg.headers,
               **dict(getattr(req, "headers", ()) or ())}
    if cfg.tenant_header:
        headers[cfg.tenant_header] = req.tenant_name
    auth = cfg.auth_headers
    if auth:
        for k in [k for k in headers if k.lower() == "authorization"]:
            del headers[k]
        headers.update(auth)
    return cfg.url(api), headers, json.dumps(body, separators=(",", ":")).encode("utf-8")


def resolve_model(endpoint, timeout_s: float = 5.0) -> str:
    """The first model the endpoint lists at ``GET <base>/models`` (OpenAI API); ``endpoint``: its
    base URL or an ``EndpointConfig`` (whose credentials are sent). Raises ``ValueError`` naming
    the endpoint (credentials masked) when it cannot be read or lists none."""
    cfg = endpoint if isinstance(endpoint, EndpointConfig) else EndpointConfig(base_url=endpoint)
    url = cfg.plain_base_url.rstrip("/") + "/models"
    shown = mask_url(url)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, headers={**cfg.headers, **cfg.auth_headers}),
                         timeout=timeout_s) as r:
            data = json.loads(r.read(1 << 20))
        return str(data["data"][0]["id"])
    except (OSError, ValueError) as e:
        why = redact(f"{type(e).__name__}: {e}", cfg.secrets)
        raise ValueError(f"{shown}: cannot read the model list ({why}); pass the model name") from None
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"{shown} lists no model; pass the model name") from None
