"""One upstream stream relayed: each token to the gateway as it arrives, the bytes to the client.

Upstream every request is streamed with ``stream_options.include_usage`` (:func:`upstream_body`),
so that the gateway sees each token and the engine's own count; :class:`Relay` reads that stream
chunk by chunk, charges the tokens (``Gateway.tokens``, ``usage_tokens``, ``finish_seen``),
passes on to a streaming client what it asked for (every event but the usage chunk it did not
ask for), and for a client that asked for no stream assembles one JSON answer (:meth:`Relay.assembled`).
"""
from __future__ import annotations

import asyncio
import time
from typing import Optional

from fairlib.gateway.core import Gateway, Pending
from fairlib.protocol.sse import DONE, MalformedSSE, SSEParser, StreamError, decode_data, read_chunk
from fairlib.protocol.wire import dumps

__all__ = ["Relay", "upstream_body"]


class Relay:
    """One upstream stream read chunk by chunk: tokens to the gateway, bytes to the client.

    The client's bytes: when it asked for ``include_usage`` nothing is left out and each read of
    the upstream goes to the client as it came (``raw``); otherwise every event but the usage
    chunk is passed on. They are written to the client's connection from the read itself (one
    HTTP/1.1 chunk each, after aiohttp sent the head: ``direct``), so a token costs no task
    wake-up; while more than ``HIGH_WATER`` bytes wait in that connection (a slow reader) they
    queue in ``out`` instead, for the handler to write with back-pressure."""

    HIGH_WATER = 1 << 18

    def __init__(self, gw: Gateway, p: Pending, api: str, client_stream: bool, include_usage: bool):
        self.gw, self.p, self.api = gw, p, api
        self.client_stream, self.include_usage = client_stream, include_usage
        self.raw = client_stream and include_usage
        self.parser = SSEParser()
        self.out: list = []
        self.transport: Optional[asyncio.Transport] = None   # the client's connection, once direct writes may begin
        self.waker: Optional[asyncio.Future] = None
        self.done = False           # [DONE] seen
        self.error: Optional[StreamError] = None     # an error event inside the stream
        self.fed = False            # the estimator has learnt from this answer
        self.text: list = []
        self.first: Optional[dict] = None            # the first chunk (id, model, created)
        self.finish_reason: Optional[str] = None
        self.usage: Optional[dict] = None
        self._kept: list = []
        # what the read being taken in carried (on_data): tokens, a finish, the usage count, [DONE]
        self._n, self._fin, self._usage, self._done = 0, False, None, False
        self.last_read = gw.clock()     # the idle timeout's clock (fairlib/gateway/forward.py)
        self.idle_out = False
        self.idle_timer: Optional[asyncio.TimerHandle] = None

    def stop_idle_timer(self) -> None:
        """Called once the upstream read has ended: the idle timer (forward.py's ``watch_idle``) is off."""
        if self.idle_timer is not None:
            self.idle_timer.cancel()

    def wake(self, *_):
        """Called when bytes queue in ``out`` or the upstream read ends.
        Returns nothing; :meth:`forward`, if it waits, resumes."""
        w = self.waker
        if w is not None and not w.done():
            w.set_result(None)

    def on_data(self, data: bytes, t: float) -> bool:
        """Called by the upstream's HTTP client for each read of the body (``t``: the gateway's clock).
        Returns False (read on); the tokens are charged and the bytes on their way to the client.

        One charge per read, after its events are read: ``Gateway.tokens`` with the read's tokens
        together (a read is one moment on the gateway's clock, whatever number of events it
        carried: several tokens of one stream in one read are one entry of the open step, not a
        zero-length step each), or ``finish_seen`` for a finish without tokens; then the usage
        count; then, at ``[DONE]``, the estimator."""
        self.last_read = t
        self._n, self._fin, self._usage, self._done = 0, False, None, False
        kept = self._kept
        for d in self.parser.feed_data(data):
            self._event(d)
        if self._n or self._fin or self._usage is not None or self._done:
            self._charge((t - self.gw.t0) * 1e3)
        if not self.client_stream:
            return False
        if self.raw:
            body = data
        else:
            body = b"".join(kept)
            kept.clear()
        if body:
            tr = self.transport
            if tr is not None and not self.out and not tr.is_closing() \
                    and tr.get_write_buffer_size() < self.HIGH_WATER:
                tr.write(b"%x\r\n%b\r\n" % (len(body), body))
            else:
                self.out.append(body)
                self.wake()
        return False

    def _charge(self, t_ms: float) -> None:
        gw, p = self.gw, self.p
        if self._n:
            gw.tokens(p, t_ms, self._n, self._fin)
        elif self._fin:
            gw.finish_seen(p, t_ms)
        if self._usage is not None:
            gw.usage_tokens(p, self._usage)
        if self._done:
            self.feed_estimator()   # before the client can read [DONE] and go

    async def forward(self, reading: asyncio.Task, sresp) -> None:
        """Until ``reading`` (the upstream's body read into :meth:`on_data`) ends: what queued in
        ``out`` written to the client's stream ``sresp`` (None: nothing is written) with back-pressure."""
        loop = asyncio.get_running_loop()
        while True:
            if self.out:
                data = b"".join(self.out)
                self.out.clear()
                if sresp is not None:
                    await sresp.write(data)
                continue
            if reading.done():
                break
            self.waker = loop.create_future()
            await self.waker

    def feed_estimator(self) -> None:
        """The answer is whole (its finish_reason came): the gateway's estimator learns from it,
        once, with the upstream's usage count when it gave one."""
        if not self.fed and self.finish_reason is not None and self.error is None:
            self.fed = True
            self.gw.answered(self.p, "".join(self.text), (self.usage or {}).get("completion_tokens"))

    def _keep(self, data: str) -> None:
        if self.client_stream and not self.raw:
            self._kept.append(b"data: " + data.encode() + b"\n\n")

    def _event(self, data: str) -> None:
        try:
            payload, _ = decode_data(data)
        except MalformedSSE:
            self._keep(data)
            return
        if payload is DONE:
            self.done = self._done = True
            self._keep(data)
            return
        try:
            text, n, _, finish, usage = read_chunk(payload)
        except StreamError as e:
            self.error = e
            self._keep(data)
            return
        except MalformedSSE:
            self._keep(data)
            return
        if self.first is None:
            self.first = payload
        if finish is not None:
            self.finish_reason = finish
            self._fin = True
        if text or n > 0:               # a token chunk (ChunkInfo.is_token_chunk)
            self.text.append(text)
            self._n += max(1, n)
        if usage is not None and isinstance(usage.get("completion_tokens"), int):
            self.usage = usage
            self._usage = usage["completion_tokens"]
        if usage is not None and not payload.get("choices") and not self.include_usage:
            return                  # the usage chunk the client did not ask for
        self._keep(data)

    def assembled(self) -> dict:
        """The answer of a client that asked for no stream, from what the stream carried."""
        f = self.first or {}
        text = "".join(self.text)
        if self.api == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": self.finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.finish_reason}
            obj = "text_completion"
        out = {"id": f.get("id"), "object": obj, "created": f.get("created", int(time.time())),
               "model": f.get("model"), "choices": [choice]}
        if self.usage is not None:
            out["usage"] = self.usage
        return out


def upstream_body(body: dict, consume: bool = False) -> bytes:
    """What goes upstream: the client's body, streamed with ``include_usage`` whatever it asked,
    without its ``priority`` (a client's claim: the gateway's priority is the tenants file's).
    ``consume``: empty ``body`` once it is written out, before the text is encoded, so that a
    large prompt is held at most twice at any moment (its parsed string and the JSON text, then
    the text and the bytes)."""
    b = dict(body)
    b.pop("priority", None)
    b["stream"] = True
    so = dict(b.get("stream_options") or {})
    so["include_usage"] = True
    b["stream_options"] = so
    text = dumps(b)
    if consume:
        b.clear()
        body.clear()
    return text.encode()
