"""The connection side of fairlib's HTTP/1.1 client (``fairlib.client.http1``): what a URL resolves
to, the request's bytes, and the asyncio protocol that hands each read to the response in
progress (which parses it, ``fairlib.client.http1_response``)."""
from __future__ import annotations

import asyncio
from typing import Optional, Protocol
from urllib.parse import urlsplit

__all__ = ["ConnectError", "Disconnected", "Headers", "Target", "head_bytes", "Connection", "Receiver",
           "MAX_HEAD_BYTES", "SPLIT_BODY_BYTES", "USER_AGENT"]

MAX_HEAD_BYTES = 1 << 16
#: a body larger than this is written after its head, not copied into one buffer with it
SPLIT_BODY_BYTES = 1 << 16
USER_AGENT = "fairlib-client"


class ConnectError(ConnectionError):
    """No connection could be opened (refused, unreachable, name not resolved, TLS handshake)."""


class Disconnected(ConnectionError):
    """The connection closed, or the server sent bytes that are not HTTP/1.1, before the
    response ended."""


class Headers(dict):
    """Response headers: names lower-cased, looked up case-insensitively (repeats joined by ", ")."""

    def __getitem__(self, k):
        return dict.__getitem__(self, k.lower())

    def __contains__(self, k):
        return dict.__contains__(self, k.lower())

    def get(self, k, default=None):
        return dict.get(self, k.lower(), default)


class Target:
    """What one URL resolves to: pool key, request line target, Host header."""

    __slots__ = ("key", "host", "port", "tls", "target", "host_header")

    def __init__(self, url: str):
        try:
            parts = urlsplit(url)
            _ = parts.port                              # raises on a bad port
        except ValueError as e:
            raise ConnectError(f"not an http:// or https:// URL ({e})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConnectError("not an http:// or https:// URL with a host")
        if parts.username is not None or parts.password is not None:
            raise ConnectError("the URL holds credentials: send them as a header")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.key = (self.host, self.port, self.tls)
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        default = (self.port == 443) if self.tls else (self.port == 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default else f"{host}:{self.port}"


def head_bytes(method: str, t: Target, headers: dict, body: bytes, length: Optional[int] = None) -> bytes:
    """The request's bytes: request line, Host, User-Agent (unless ``headers`` has one), the headers,
    Content-Length (``length``, default the body's), the body."""
    lines = [f"{method} {t.target} HTTP/1.1", f"Host: {t.host_header}"]
    names = {k.lower() for k in headers}
    if "user-agent" not in names:
        lines.append(f"User-Agent: {USER_AGENT}")
    for k, v in headers.items():
        if k.lower() in ("host", "content-length", "transfer-encoding"):
            continue
        v = str(v)
        if "\r" in v or "\n" in v or "\r" in k or "\n" in k or ":" in k:
            raise ValueError(f"header {k!r}: a name or value with CR, LF (or a colon in the name)")
        lines.append(f"{k}: {v}")
    lines.append(f"Content-Length: {len(body) if length is None else length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + body


class Receiver(Protocol):
    """What a connection hands its bytes to: the response in progress."""

    def _feed(self, data: bytes) -> None:
        """Called with each read, as it arrives."""

    def _lost(self, exc) -> None:
        """Called once when the connection closes (``exc`` None on a clean close)."""


class Connection(asyncio.Protocol):
    """One connection; at most one response in progress (``response``)."""

    def __init__(self, key=None):
        self.key, self.transport = key, None
        self.response: Optional[Receiver] = None
        self.closed = False

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        if self.response is not None:
            self.response._feed(data)
        else:                           # bytes nobody asked for: this connection is not reusable
            self.close()

    def eof_received(self):
        return False                    # close the transport

    def connection_lost(self, exc):
        self.closed = True
        if self.response is not None:
            self.response._lost(exc)

    def close(self):
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
