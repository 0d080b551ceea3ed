"""A response of fairlib's HTTP/1.1 client (``fairlib.client.http1``), parsed as it arrives in the
connection's ``data_received``: the head, then the body de-framed (``Transfer-Encoding: chunked``,
``Content-Length``, or up to the server's close), each read handed with its arrival time to the
consumer's callback without waking its task."""
from __future__ import annotations

import asyncio
from typing import Callable, Optional, Protocol

from fairlib.client.http1_conn import MAX_HEAD_BYTES, Connection, Disconnected, Headers

__all__ = ["Response", "Pool"]


class Pool(Protocol):
    """What a response needs of its session: the event loop, the whole-request limit, and where a
    finished connection goes back."""

    timeout_s: float

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop of the session's requests."""

    def _put_back(self, conn: Connection, reusable: bool) -> None:
        """Keep ``conn`` for the next request when ``reusable``, else close it."""


# body framing
_LENGTH, _CHUNKED, _UNTIL_CLOSE = 0, 1, 2


class Response:
    """One response, parsed as it arrives. ``status``, ``headers`` (lower-case names),
    ``content_type``; the body through ``stream(on_data)`` or ``read(limit)``."""

    def __init__(self, session: Pool, conn: Connection, now: Callable[[], float]):
        self._session, self._conn, self._now = session, conn, now
        self._head_fut = session.loop.create_future()
        self._body_fut: Optional[asyncio.Future] = None
        self.status: Optional[int] = None
        self.reason = ""
        self.headers = Headers()
        self.retried: Optional[str] = None   # why the request was sent a second time
        self.got_bytes = False          # any byte of the answer
        self.ended = False              # the body's last byte arrived
        self.reusable = False
        self._buf = b""                 # head bytes, or a partial chunk-size line / CRLF
        self._framing: Optional[int] = None
        self._need = 0                  # chunk or body bytes still to come
        self._crlf = False              # a CRLF is due after a chunk's data
        self._trailers = False
        self._sink: Optional[Callable[[bytes, float], bool]] = None   # on_data(bytes, t) -> True when the consumer is done
        self._pending: list[tuple[bytes, float]] = []   # (bytes, t) that arrived before a consumer was attached
        self._consumer_done = False
        self._timer: Optional[asyncio.TimerHandle] = None   # the whole-request deadline
        self._error: Optional[BaseException] = None         # why the response failed
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
                rest = self._parse_head(data)
                if rest is None:
                    return
                data = rest
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
        self._body_fut = self._session.loop.create_future()
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
