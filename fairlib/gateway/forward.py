"""A request's exchange with its upstream: sent (once more elsewhere if the upstream fails before
its first byte: fairlib/gateway/health.py), read with an idle timeout, and relayed back as the
client asked (an event stream, or one JSON answer assembled from it).

An upstream that breaks the answer never makes a complete-looking one: a client that asked for
no stream gets 502, a streaming client (whose 200 head has gone) an OpenAI error event
(``{"error": {...}}``) and no ``[DONE]``. An upstream read that brings no byte for
``--upstream-idle-timeout-s`` (a frozen engine) ends the request so, and frees its slot.
"""
from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Optional

from aiohttp import web

from fairlib.client.http1 import ConnectError, Disconnected, HttpSession
from fairlib.gateway.access_log import UPSTREAM_ANSWER
from fairlib.gateway.config import GatewayConfig
from fairlib.gateway.core import Gateway, Pending
from fairlib.gateway.health import MAX_RETRIES, UpstreamFailed, connection_failed, retry_on
from fairlib.gateway.relay import Relay
from fairlib.protocol.parse import answer_text, answer_tokens
from fairlib.protocol.routes import MAX_BODY_BYTES, error_response
from fairlib.protocol.sse import STREAM_HEADERS, error_event
from fairlib.protocol.wire import dumps, error_type

__all__ = ["Forwarding"]


def _own(status: int, message: str, reason: str) -> web.Response:
    r = error_response(status, message, error_type(status))
    r.headers["x-fairlib-rejected-reason"] = reason
    return r


class Forwarding:
    """The relay handlers of :class:`fairlib.gateway.app.GatewayApp` (``self.gw``, ``self.cfg``,
    ``self.session``, ``self.upstream_headers``)."""

    gw: Gateway
    cfg: GatewayConfig
    if TYPE_CHECKING:       # the host class's, declared for the type checker
        @property
        def session(self) -> HttpSession: ...

        def upstream_headers(self, tenant: Optional[str] = None) -> dict: ...

    async def open_upstream(self, up, api: str, data: bytes, p: Pending):
        """The upstream's response head, or :class:`UpstreamFailed` (no connection, or no head
        within the idle timeout)."""
        gw, idle = self.gw, self.cfg.upstream_idle_timeout_s
        cm = self.session.post(up.url + ("/chat/completions" if api == "chat" else "/completions"), data=data,
                               headers=self.upstream_headers(gw.tenant_name(p.tenant)), now=gw.clock)
        try:
            async with asyncio.timeout(idle):
                return await cm.__aenter__()
        except TimeoutError:
            raise UpstreamFailed(f"no answer within {idle:g} s (--upstream-idle-timeout-s)") from None
        except (ConnectError, Disconnected, OSError) as e:
            raise UpstreamFailed(f"{type(e).__name__}: {e}") from None

    async def relay(self, request: web.Request, api: str, data: bytes, req: dict, p: Pending, up,
                    note: dict) -> web.StreamResponse:
        """Called by ``generate`` once the request holds a slot in upstream ``up`` (``data``: the
        body to send, :func:`upstream_body`; ``note``: the access log's fields, filled in here:
        upstream, retried, error).
        Returns the upstream's answer as the client asked for it (stream or JSON); the slot is free after."""
        gw = self.gw
        rl = Relay(gw, p, api, req["stream"], req["include_usage"])
        resp = None
        reading: Optional[asyncio.Task] = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.request_timeout_s
        try:
            for attempt in range(MAX_RETRIES + 1):
                note["upstream"] = up.url
                try:
                    resp = await self.open_upstream(up, api, data, p)
                    break
                except UpstreamFailed as e:
                    connection_failed(gw, up, str(e))
                    other = retry_on(gw, p) if attempt < MAX_RETRIES and loop.time() < deadline else None
                    if other is None:
                        note["error"] = str(e)
                        return _own(502, f"upstream {up.url} failed before answering: {e}", "upstream_failed")
                    note["retried"] = True
                    up = other
            assert resp is not None     # the loop above broke with it or returned
            if resp.status != 200:
                return await self.upstream_error(resp, up)
            if resp.content_type != "text/event-stream":
                return await self.upstream_json(resp, up, p)
            reading = loop.create_task(resp.stream(rl.on_data))
            reading.add_done_callback(rl.wake)
            return await self.stream_back(request, rl, reading, up, note)
        finally:
            if reading is not None and not reading.done():
                reading.cancel()
            if resp is not None:
                resp.release()          # an unfinished body closes the connection: the upstream aborts
            gw.release(p)

    async def upstream_error(self, resp, up) -> web.Response:
        """Called by :meth:`relay` when the upstream answered a status other than 200.
        Returns its error JSON as it came, or (not error JSON) a JSON error quoting its start."""
        raw = await resp.read(1 << 20)
        try:
            obj = json.loads(raw)
            ok_json = isinstance(obj, dict) and "error" in obj
        except ValueError:
            ok_json = False
        if ok_json:
            r = web.Response(body=raw, status=resp.status, content_type="application/json")
        else:
            r = error_response(resp.status, f"upstream {up.url} answered {resp.status}: "
                                            f"{raw[:300].decode('utf-8', 'replace')}", error_type(resp.status))
        r[UPSTREAM_ANSWER] = True     # the upstream's own status: no x-fairlib-rejected-reason
        return r

    async def upstream_json(self, resp, up, p: Pending) -> web.Response:
        """Called by :meth:`relay` when the upstream answered 200 with one body (it ignored ``stream``).
        Returns that JSON as it came (its tokens charged at once), or 502 when it is not JSON."""
        gw = self.gw
        raw = await resp.read(MAX_BODY_BYTES)
        try:
            obj = json.loads(raw)
        except ValueError:
            return _own(502, f"upstream {up.url} answered 200 with {resp.content_type or 'no type'}, not an event "
                             f"stream", "upstream_broken")
        n = answer_tokens(obj)
        gw.tokens(p, gw.now_ms(), n, True)
        gw.answered(p, answer_text(obj), n)
        return web.Response(body=raw, status=200, content_type="application/json")

    def watch_idle(self, rl: Relay, reading: asyncio.Task) -> None:
        """A timer (``rl.idle_timer``) that cancels ``reading`` once the upstream has sent no byte
        for the idle timeout (``rl.idle_out`` then says so); re-armed from the last read when it
        fires, so it costs one timer per idle span, not one per token."""
        idle, clock, loop = self.cfg.upstream_idle_timeout_s, self.gw.clock, asyncio.get_running_loop()

        def check():
            quiet = clock() - rl.last_read
            if quiet >= idle:
                rl.idle_out = True
                reading.cancel()
            else:
                rl.idle_timer = loop.call_later(idle - quiet, check)

        rl.idle_timer = loop.call_later(idle, check)

    def broken_by(self, rl: Relay, reading: asyncio.Task, up) -> Optional[str]:
        """Why the upstream's stream is broken (None: it ended whole). A reset connection or an
        idle one also takes the upstream out (passive health)."""
        if rl.idle_out:
            why = f"no byte for {self.cfg.upstream_idle_timeout_s:g} s (--upstream-idle-timeout-s)"
            connection_failed(self.gw, up, why)
            return why
        try:
            reading.result()
        except (Disconnected, TimeoutError, OSError) as e:
            why = f"{type(e).__name__}: {e}"
            if not isinstance(e, TimeoutError):
                connection_failed(self.gw, up, why)
            return why
        return None if (rl.done or rl.finish_reason) else "the stream ended without [DONE]"

    async def stream_back(self, request: web.Request, rl: Relay, reading: asyncio.Task, up,
                          note: dict) -> web.StreamResponse:
        """Called by :meth:`relay` while ``reading`` reads the upstream's event stream into ``rl``.
        Returns the client's stream written to its end (an error event if the upstream broke it), or the
        assembled JSON (502 if the upstream broke it)."""
        sresp = None
        if rl.client_stream:
            sresp = web.StreamResponse(status=200, headers=STREAM_HEADERS)
            if request.version >= (1, 1):
                sresp.enable_chunked_encoding()
            await sresp.prepare(request)
            await sresp.write(b"")          # the head goes out now; the reads follow it directly
            if request.version >= (1, 1):
                rl.transport = request.transport
        self.watch_idle(rl, reading)
        try:
            await rl.forward(reading, sresp)
            rl.stop_idle_timer()
            broken = self.broken_by(rl, reading, up)
            rl.feed_estimator()     # a stream without [DONE]: once it ended, if its finish_reason came
            if broken:
                up.broken += 1
                note["error"] = broken
                self.gw.count_rejected(self.gw.tenant_name(rl.p.tenant), "upstream_broken")
            if sresp is None:
                if broken:
                    return _own(502, f"upstream {up.url} broke the answer after {rl.p.counted} token(s): {broken}",
                                "upstream_broken")
                if rl.error is not None:
                    return error_response(rl.error.code or 500, str(rl.error), error_type(rl.error.code or 500))
                return web.Response(body=dumps(rl.assembled()).encode(), content_type="application/json")
            tail = b"".join(rl.out)
            if broken:
                tail += error_event(f"upstream {up.url} broke the stream: {broken}", "BadGatewayError", 502)
            await sresp.write_eof(tail)
        except ConnectionError:             # the client went away while we wrote to it
            pass
        finally:
            rl.stop_idle_timer()
        assert sresp is not None    # without it the answer was returned above; only writes to it raise ConnectionError
        return sresp
