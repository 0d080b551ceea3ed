"""The send loop's HTTP/1.1 client: keep-alive connections, a response body handed to a callback
with the time each read arrived.

Why not aiohttp: it costs the sender about 0.2 ms of CPU per request and 15 us per streamed chunk
(one task wake-up per read), most of a core at 1,000 requests/s of 16-token streams. Here the
response is parsed in the connection's ``data_received``: each read is timestamped there (``now``,
the run clock) and handed, de-chunked, to the consumer's callback without waking its task; the
request's task wakes twice (headers, end).

Scope: ``POST``/``GET`` over ``http://`` or ``https://`` (TLS through asyncio, verified against
the system's CA bundle or the file in ``SSL_CERT_FILE``), no proxies (as
aiohttp without ``trust_env``), no redirects, no compression (no ``Accept-Encoding`` is sent).
Bodies: ``Transfer-Encoding: chunked``, ``Content-Length``, or up to the server's close.

Keep-alive: an idle connection is reused for at most ``keepalive_s`` (4 s: below the 5 s idle
timeout of uvicorn, hence vLLM, and of llama.cpp's server). A server may still close an idle
connection as a request crosses its close; a request that fails on a *reused* connection before
any byte of the answer arrived is sent once more on a fresh connection (the server never read it),
and the response says so (``retried``).

Modules: ``http1_conn`` (the URL, the request's bytes, the connection), ``http1_response`` (the
response's parser); this one the session (the pool of keep-alive connections).
"""
from __future__ import annotations

import asyncio
import ssl as ssl_module
import time
import weakref
from collections import deque
from typing import Callable, Optional

from fairlib.client.http1_conn import (SPLIT_BODY_BYTES, ConnectError, Connection, Disconnected, Headers, Target,
                                      head_bytes)
from fairlib.client.http1_response import Response

__all__ = ["HttpSession", "Response", "ConnectError", "Disconnected", "KEEPALIVE_S", "Headers"]

KEEPALIVE_S = 4.0


class _Request:
    """``async with session.post(...) as resp``: the response once its head has arrived."""

    def __init__(self, session, method, url, body, headers, now):
        self.session, self.args = session, (method, url, body, headers, now)
        self.resp = None

    async def __aenter__(self) -> Response:
        self.resp = await self.session._request(*self.args)
        return self.resp

    async def __aexit__(self, *exc):
        if self.resp is not None:
            self.resp.release()


class HttpSession:
    """Keep-alive connections per (host, port, TLS), no cap on their number (an open loop needs
    one per request in flight). ``timeout_s``: a whole request, connect to last byte;
    ``connect_timeout_s``: the connect alone (None: only the whole-request limit)."""

    def __init__(self, timeout_s: float = 600.0, connect_timeout_s: Optional[float] = None,
                 keepalive_s: float = KEEPALIVE_S, ssl_context: Optional[ssl_module.SSLContext] = None):
        self.timeout_s, self.connect_timeout_s, self.keepalive_s = timeout_s, connect_timeout_s, keepalive_s
        self._ssl = ssl_context
        self._idle: dict = {}           # key -> deque of (connection, idle since)
        self._all: weakref.WeakSet = weakref.WeakSet()   # every open connection, for close()
        self._targets: dict = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._closed = False
        self.stats = {"connections": 0, "reused": 0, "retries": 0}

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        self._closed = True
        for conn in list(self._all):
            conn.close()
        self._idle.clear()

    def post(self, url: str, data: bytes = b"", headers: Optional[dict] = None,
             now: Callable[[], float] = time.perf_counter, **_ignored) -> _Request:
        return _Request(self, "POST", url, data, headers or {}, now)

    def get(self, url: str, headers: Optional[dict] = None, now: Callable[[], float] = time.perf_counter,
            **_ignored) -> _Request:
        return _Request(self, "GET", url, b"", headers or {}, now)

    def _target(self, url: str) -> Target:
        t = self._targets.get(url)
        if t is None:
            t = self._targets[url] = Target(url)
        return t

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop of the session's requests (set by the first request)."""
        if self._loop is None:
            raise RuntimeError("the session has not sent a request yet")
        return self._loop

    async def _request(self, method, url, body, headers, now) -> Response:
        if self._closed:
            raise RuntimeError("the session is closed")
        loop = self._loop = asyncio.get_running_loop()
        target = self._target(url)
        split = len(body) > SPLIT_BODY_BYTES
        payload = head_bytes(method, target, headers, b"" if split else body, len(body))
        deadline = loop.time() + self.timeout_s
        retried = None
        while True:
            conn, reused = (None, False) if retried else self._take(target.key, loop)
            if conn is None:
                conn = await self._connect(target, deadline, loop)
            resp = Response(self, conn, now)
            resp.retried = retried
            resp._timer = loop.call_at(deadline, resp._timeout)
            conn.response = resp
            conn.transport.write(payload)
            if split:
                conn.transport.write(body)
            try:
                await resp._head_fut
            except Disconnected as e:
                if reused and not retried and not resp.got_bytes:
                    # the server closed this idle connection as the request left: it never read it
                    retried = f"the reused keep-alive connection closed before any answer: {e}"
                    self.stats["retries"] += 1
                    continue
                raise
            except BaseException:       # cancelled or timed out: this connection is spent
                resp.release()
                raise
            return resp

    def _take(self, key, loop):
        """An idle connection to ``key`` (the most recently used), or None; drops stale ones."""
        q = self._idle.get(key)
        if not q:
            return None, False
        now = loop.time()
        while q and (q[0][0].closed or now - q[0][1] > self.keepalive_s):
            q.popleft()[0].close()      # the oldest first: past keep-alive or closed by the server
        while q:
            conn, since = q.pop()
            if not conn.closed and not conn.transport.is_closing():
                self.stats["reused"] += 1
                return conn, True
            conn.close()
        return None, False

    def _put_back(self, conn: Connection, reusable: bool) -> None:
        if not reusable or conn.closed or self._closed or conn.response is not None:
            conn.close()
            return
        self._idle.setdefault(conn.key, deque()).append((conn, self.loop.time()))

    async def _connect(self, t: Target, deadline: float, loop) -> Connection:
        limit = deadline - loop.time()
        if self.connect_timeout_s is not None:
            limit = min(limit, self.connect_timeout_s)
        if t.tls and self._ssl is None:
            self._ssl = ssl_module.create_default_context()
        try:
            async with asyncio.timeout(max(limit, 0.0)):
                _, conn = await loop.create_connection(lambda: Connection(t.key), t.host, t.port,
                                                       ssl=self._ssl if t.tls else None,
                                                       server_hostname=t.host if t.tls else None)
        except TimeoutError:
            raise TimeoutError(f"no connection to {t.host}:{t.port} within {limit:.3g} s") from None
        except OSError as e:            # refused, unreachable, DNS, TLS
            raise ConnectError(f"cannot connect to {t.host}:{t.port}: {type(e).__name__}: {e}") from e
        self.stats["connections"] += 1
        self._all.add(conn)
        return conn
