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
"""
from __future__ import annotations

import asyncio
import ssl as ssl_module
import time
import weakref
from collections import deque
from typing import Callable, Optional
from urllib.parse import urlsplit

__all__ = ["HttpSession", "Response", "ConnectError", "Disconnected", "KEEPALIVE_S"]

KEEPALIVE_S = 4.0
MAX_HEAD_BYTES = 1 << 16
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


class _Target:
    """What one URL resolves to: pool key, request line target, Host header."""

    __slots__ = ("key", "host", "port", "tls", "target", "host_header")

    def __init__(self, url: str):
        try:
            parts = urlsplit(url)
            parts.port                              # raises on a bad port
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


def _head_bytes(method: str, t: _Target, headers: dict, body: bytes) -> bytes:
    """The request's bytes: request line, Host, User-Agent (unless ``headers`` has one), the headers,
    Content-Length, the body."""
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
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + body


class _Connection(asyncio.Protocol):
    """One connection; at most one response in progress (``response``)."""

    def __init__(self, key=None):
        self.key, self.transport = key, None
        self.response: Optional[Response] = None
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


# body framing
_LENGTH, _CHUNKED, _UNTIL_CLOSE = 0, 1, 2


class Response:
    """One response, parsed as it arrives. ``status``, ``headers`` (lower-case names),
    ``content_type``; the body through ``stream(on_data)`` or ``read(limit)``."""

    def __init__(self, session: "HttpSession", conn: _Connection, now: Callable[[], float]):
        self._session, self._conn, self._now = session, conn, now
        self._head_fut = session._loop.create_future()
        self._body_fut = None
        self.status: Optional[int] = None
        self.reason = ""
        self.headers = Headers()
        self.retried: Optional[str] = None   # why the request was sent a second time
        self.got_bytes = False          # any byte of the answer
        self.ended = False              # the body's last byte arrived
        self.reusable = False
        self._buf = b""                 # head bytes, or a partial chunk-size line / CRLF
        self._framing = None
        self._need = 0                  # chunk or body bytes still to come
        self._crlf = False              # a CRLF is due after a chunk's data
        self._trailers = False
        self._sink = None               # on_data(bytes, t) -> True when the consumer is done
        self._pending = []              # (bytes, t) that arrived before a consumer was attached
        self._consumer_done = False
        self._timer = None              # the whole-request deadline
        self._error = None              # why the response failed
        self._released = False

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";", 1)[0].strip().lower()

    # --- parsing (called by the connection) ------------------------------------------------

    def _feed(self, data: bytes) -> None:
        t = self._now()
        self.got_bytes = True
        try:
            if self.status is None:
                data = self._parse_head(data)
                if data is None:
                    return
            body = self._frame(data)
        except Disconnected as e:
            self._fail(e)
            return
        if body:
            self._deliver(body, t)
        if self.ended:
            self._end()

    def _parse_head(self, data: bytes) -> Optional[bytes]:
        buf = self._buf + data if self._buf else data
        while True:
            i = buf.find(b"\r\n\r\n")
            if i < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise Disconnected(f"response head longer than {MAX_HEAD_BYTES} bytes")
                self._buf = buf
                return None
            lines = buf[:i].decode("latin-1").split("\r\n")
            buf = buf[i + 4:]
            try:
                version, code = lines[0].split(" ", 2)[:2]
                status = int(code)
            except ValueError:
                raise Disconnected(f"not an HTTP status line: {lines[0][:200]!r}") from None
            if not version.startswith("HTTP/1."):
                raise Disconnected(f"not an HTTP/1.x status line: {lines[0][:200]!r}")
            if 100 <= status < 200:     # 100 Continue and other interim answers: skip
                continue
            break
        self._buf = b""
        self.status = status
        self.reason = lines[0].split(" ", 2)[2] if lines[0].count(" ") >= 2 else ""
        h = Headers()
        for line in lines[1:]:
            k, sep, v = line.partition(":")
            if sep:
                k = k.strip().lower()
                h[k] = f"{dict.__getitem__(h, k)}, {v.strip()}" if k in h else v.strip()
        self.headers = h
        conn_hdr = h.get("connection", "").lower()
        self.reusable = ("close" not in conn_hdr) and (version != "HTTP/1.0" or "keep-alive" in conn_hdr)
        if "chunked" in h.get("transfer-encoding", "").lower():
            self._framing = _CHUNKED
        elif "content-length" in h:
            try:
                self._need = int(h["content-length"])
            except ValueError:
                raise Disconnected(f"bad Content-Length {h['content-length']!r}") from None
            self._framing = _LENGTH
        elif status in (204, 304):
            self._framing, self._need = _LENGTH, 0
        else:
            self._framing, self.reusable = _UNTIL_CLOSE, False
        if self._framing == _LENGTH and self._need == 0:
            self.ended = True
        if not self._head_fut.done():
            self._head_fut.set_result(None)   # not self: a cycle the collector would have to free
        return buf

    def _frame(self, data: bytes) -> bytes:
        """The body bytes in ``data`` (chunked framing removed); sets ``ended``."""
        if self.ended:
            if data:                    # bytes past the end of the answer
                self.reusable = False
            return b""
        if self._framing == _UNTIL_CLOSE:
            return data
        if self._framing == _LENGTH:
            body = data[:self._need]
            self._need -= len(body)
            if self._need == 0:
                self.ended = True
                if len(data) > len(body):
                    self.reusable = False
            return body
        if not (self._buf or self._need or self._crlf or self._trailers):
            j = data.find(b"\r\n")             # the common read: one whole chunk, "size CRLF data CRLF"
            if 0 < j < 16:
                try:
                    end = j + 2 + int(data[:j], 16)
                except ValueError:
                    end = -1
                if end > j + 2 and len(data) == end + 2 and data[end:] == b"\r\n":
                    return data[j + 2:end]
        buf = self._buf + data if self._buf else data
        self._buf = b""
        out, pos, n = [], 0, len(buf)
        while pos < n:
            if self._need:
                take = min(self._need, n - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self._need -= take
                self._crlf = self._need == 0
                continue
            if self._crlf:
                if n - pos < 2:
                    self._buf = buf[pos:]
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise Disconnected("chunked body: no CRLF after a chunk")
                pos += 2
                self._crlf = False
                continue
            j = buf.find(b"\r\n", pos)
            if j < 0:
                if n - pos > 4096:
                    raise Disconnected("chunked body: a chunk-size line longer than 4096 bytes")
                self._buf = buf[pos:]
                break
            line, pos = buf[pos:j], j + 2
            if self._trailers:
                if not line:            # the blank line after the last chunk (and trailers)
                    self.ended = True
                    if pos < n:
                        self.reusable = False
                    break
                continue
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                size = -1
            if size < 0:
                raise Disconnected(f"chunked body: bad chunk size {line[:40]!r}")
            if size == 0:
                self._trailers = True
            else:
                self._need = size
        return b"".join(out) if len(out) != 1 else out[0]

    def _deliver(self, body: bytes, t: float) -> None:
        if self._consumer_done:
            return
        if self._sink is None:
            self._pending.append((body, t))
            return
        try:
            done = self._sink(body, t)
        except Exception as e:          # the consumer rejected the stream: stop reading it
            self._consumer_done = True
            self.reusable = False
            self._settle(exc=e)
            self._conn.close()
            return
        if done:
            self._consumer_done = True
            self._settle(result=True)

    def _end(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        conn = self._conn
        if conn.response is self:
            conn.response = None
        self._settle(result=False)
        if self._released:
            self._session._put_back(conn, self.reusable)

    def _lost(self, exc) -> None:
        if self._framing == _UNTIL_CLOSE and exc is None and not self.ended:
            self.ended = True
            self._end()
            return
        if not self.ended:
            why = f"{type(exc).__name__}: {exc}" if exc else "closed by the server"
            self._fail(Disconnected(f"the connection closed before the response ended ({why})"))

    def _fail(self, e: BaseException) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._error is None:
            self._error = e
        self.reusable = False
        if not self._head_fut.done():
            self._head_fut.set_exception(e)
            self._head_fut.exception()  # seen: a retry may drop this future
        self._settle(exc=e)
        if self._conn.response is self:
            self._conn.response = None
        self._conn.close()

    def _timeout(self) -> None:
        self._timer = None
        self._fail(TimeoutError(f"no complete answer within {self._session.timeout_s} s"))

    def _settle(self, result=None, exc=None) -> None:
        f = self._body_fut
        if f is not None and not f.done():
            if exc is not None:
                f.set_exception(exc)
            else:
                f.set_result(result)

    # --- the consumer's side ---------------------------------------------------------------

    async def stream(self, on_data: Callable[[bytes, float], bool]) -> bool:
        """Hand each piece of the body to ``on_data(bytes, t)`` (``t``: the run time its read
        arrived) until it returns True (then True) or the body ends (then False). An exception
        from ``on_data`` stops reading (the connection is closed) and is raised here."""
        if self._body_fut is not None:
            raise RuntimeError("the body is already being read")
        self._body_fut = self._session._loop.create_future()
        self._sink = on_data
        pending, self._pending = self._pending, []
        for body, t in pending:
            self._deliver(body, t)
            if self._consumer_done:
                break
        if self._error is not None:
            self._settle(exc=self._error)
        elif self.ended:
            self._settle(result=False)
        return await self._body_fut

    async def read(self, limit: Optional[int] = None) -> bytes:
        """The body (its first ``limit`` bytes when given)."""
        parts, size = [], 0

        def take(body, t):
            nonlocal size
            parts.append(body)
            size += len(body)
            return limit is not None and size >= limit

        await self.stream(take)
        raw = b"".join(parts)
        return raw if limit is None else raw[:limit]

    def release(self) -> None:
        """Done with the response: its connection goes back to the pool when the body has
        ended (at once, or when the rest of it arrives), else it is closed."""
        if self._released:
            return
        self._released = True
        if self.ended:
            self._session._put_back(self._conn, self.reusable)
        elif self._consumer_done and self.reusable and not self._conn.closed and self._timer is not None:
            pass                        # the rest of the body drains; _end puts the connection back
        else:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._conn.response is self:
                self._conn.response = None
            self._conn.close()


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
        self._all = weakref.WeakSet()   # every open connection, for close()
        self._targets: dict = {}
        self._loop = None
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

    def _target(self, url: str) -> _Target:
        t = self._targets.get(url)
        if t is None:
            t = self._targets[url] = _Target(url)
        return t

    async def _request(self, method, url, body, headers, now) -> Response:
        if self._closed:
            raise RuntimeError("the session is closed")
        loop = self._loop = asyncio.get_running_loop()
        target = self._target(url)
        payload = _head_bytes(method, target, headers, body)
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

    def _put_back(self, conn: _Connection, reusable: bool) -> None:
        if not reusable or conn.closed or self._closed or conn.response is not None:
            conn.close()
            return
        self._idle.setdefault(conn.key, deque()).append((conn, self._loop.time()))

    async def _connect(self, t: _Target, deadline: float, loop) -> _Connection:
        limit = deadline - loop.time()
        if self.connect_timeout_s is not None:
            limit = min(limit, self.connect_timeout_s)
        if t.tls and self._ssl is None:
            self._ssl = ssl_module.create_default_context()
        try:
            async with asyncio.timeout(max(limit, 0.0)):
                _, conn = await loop.create_connection(lambda: _Connection(t.key), t.host, t.port,
                                                       ssl=self._ssl if t.tls else None,
                                                       server_hostname=t.host if t.tls else None)
        except TimeoutError:
            raise TimeoutError(f"no connection to {t.host}:{t.port} within {limit:.3g} s") from None
        except OSError as e:            # refused, unreachable, DNS, TLS
            raise ConnectError(f"cannot connect to {t.host}:{t.port}: {type(e).__name__}: {e}") from e
        self.stats["connections"] += 1
        self._all.add(conn)
        return conn
