"""Server-Sent Events for OpenAI-style streaming: an incremental parser, a chunk interpreter, and
the frames a server writes.

``SSEParser`` turns bytes (split anywhere) into ``SSEEvent``s: ``data:`` lines (joined by ``\\n``
when an event has several), ``:`` comments skipped, LF / CRLF / CR line ends, one event per blank
line. ``decode_event`` turns an event into a JSON object or ``DONE`` (with where it held
non-finite numbers; ``decode_payload`` the object alone); anything else is a ``MalformedSSE``.
``interpret_chunk`` reads what one chunk carried (``ChunkInfo``: completions ``choices[0].text``,
chat ``choices[0].delta.content``, ``finish_reason``, ``usage``, llama.cpp's ``timings``, token
ids), or raises the ``StreamError`` a server reported inside a 200 stream.

Writing: ``data_line(obj)`` is one ``data: {compact JSON}`` event, ``DONE_LINE`` the stream's end,
``error_event(...)`` the error event vLLM writes inside a stream that has begun (``{"error":
{"object": "error", "message", "type", "param", "code"}}``).

JSON is read strictly enough to keep records writable: ``NaN``, ``Infinity`` and ``-Infinity``
(not JSON, but Python's ``json`` accepts them) become ``None``, and where they were is kept
(``loads_finite``: ``"usage.completion_tokens=NaN"``) for the record to flag.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Optional

from fairlib.protocol.wire import dumps

__all__ = [
    "DONE", "SSEEvent", "SSEParser", "MalformedSSE", "StreamError", "UnexpectedContentType",
    "loads_finite", "decode_event", "decode_data", "decode_payload", "ChunkInfo", "interpret_chunk", "read_chunk",
    "STREAM_HEADERS", "DONE_LINE", "data_line", "error_event",
]

_EOL = re.compile(rb"\r\n|\r|\n")


class MalformedSSE(ValueError):
    """The byte stream is not valid SSE, or an event's data is not a JSON object."""


class StreamError(RuntimeError):
    """The server reported an error inside a 200 stream (``{"error": {...}}``)."""

    def __init__(self, message: str, code: Optional[int] = None):
        super().__init__(message)
        self.code = code


class UnexpectedContentType(ValueError):
    """A 200 answer that is neither an SSE stream nor a JSON body (an HTML page from a proxy, ...)."""


class _Done:
    def __repr__(self):
        return "DONE"


DONE = _Done()
"""Sentinel returned by ``decode_payload`` for ``data: [DONE]``."""


@dataclass(frozen=True)
class SSEEvent:
    """One dispatched event: its data (lines joined by LF), event type and id if given."""

    data: str
    event: Optional[str] = None
    id: Optional[str] = None

    @property
    def is_done(self) -> bool:
        return self.data.strip() == "[DONE]"


class SSEParser:
    """Incremental SSE parser: ``feed(bytes) -> [SSEEvent]``, ``flush() -> [SSEEvent]`` at EOF."""

    def __init__(self, max_line_bytes: int = 16 << 20):
        self.max_line_bytes = max_line_bytes
        self.comments = 0
        self._buf = bytearray()
        self._data: list[str] = []
        self._event: Optional[str] = None
        self._id: Optional[str] = None
        self._first_line = True

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        buf = self._buf
        buf += chunk
        events: list[SSEEvent] = []
        pos, n = 0, len(buf)
        while True:
            m = _EOL.search(buf, pos)
            if m is None:
                break
            if m.end() == n and buf[m.start()] == 0x0D and m.end() - m.start() == 1:
                break  # a CR at the end may be the first half of a CRLF split across reads
            ev = self._line(bytes(buf[pos:m.start()]))
            pos = m.end()
            if ev is not None:
                events.append(ev)
        if pos:
            del buf[:pos]
        if len(buf) > self.max_line_bytes:
            raise MalformedSSE(f"SSE line longer than {self.max_line_bytes} bytes")
        return events

    def feed_data(self, chunk: bytes) -> list[str]:
        """The data of each event ``chunk`` completes (what a relay reads; ``event:`` and ``id:`` are
        parsed and dropped). The common shape, whole ``data: ...`` events ended by a blank line in
        LF, is split without the line machine; anything else (CR, comments, several fields, an
        event split across reads) goes through :meth:`feed`, so both give the same data."""
        if self._buf or self._data or self._event is not None or self._first_line or b"\r" in chunk:
            return [ev.data for ev in self.feed(chunk)]
        blocks = chunk.split(b"\n\n")
        tail = blocks.pop()
        out: list[str] = []
        for i, b in enumerate(blocks):
            if b[:6] != b"data: " or b"\n" in b:
                return out + [ev.data for ev in self.feed(b"\n\n".join(blocks[i:] + [tail]))]
            try:
                out.append(b[6:].decode("utf-8"))
            except UnicodeDecodeError as e:
                raise MalformedSSE(f"SSE line is not UTF-8: {e}") from None
        if tail:
            out += [ev.data for ev in self.feed(tail)]
        return out

    def flush(self) -> list[SSEEvent]:
        """End of stream: take a last unterminated line and dispatch pending data (lenient)."""
        events = []
        if self._buf:
            line = bytes(self._buf.rstrip(b"\r"))
            self._buf.clear()
            ev = self._line(line)
            if ev is not None:
                events.append(ev)
        ev = self._line(b"")
        if ev is not None:
            events.append(ev)
        return events

    def _line(self, raw: bytes) -> Optional[SSEEvent]:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MalformedSSE(f"SSE line is not UTF-8: {e}") from None
        if self._first_line:
            self._first_line = False
            line = line.lstrip("\ufeff")
        if not line:
            if not self._data:
                self._event = None
                return None
            ev = SSEEvent("\n".join(self._data), self._event, self._id)
            self._data, self._event = [], None
            return ev
        if line[0] == ":":
            self.comments += 1
            return None
        name, sep, value = line.partition(":")
        if sep and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        return None  # "retry" and unknown fields are ignored, as the SSE spec says


class _NonFinite:
    """What ``NaN`` / ``Infinity`` / ``-Infinity`` parse to, until ``loads_finite`` nulls them."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


_STRICT = json.JSONDecoder(parse_constant=_NonFinite)


def _null_nonfinite(obj, path: str, found: list):
    if isinstance(obj, _NonFinite):
        found.append(f"{path or '$'}={obj.name}")
        return None
    if isinstance(obj, dict):
        return {k: _null_nonfinite(v, f"{path}.{k}" if path else k, found) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_null_nonfinite(v, f"{path}[{i}]", found) for i, v in enumerate(obj)]
    return obj


def loads_finite(text) -> tuple:
    """``(obj, nonfinite)``: ``text`` as JSON with every ``NaN``/``Infinity``/``-Infinity`` read as
    ``None``; ``nonfinite`` lists where each was (``"usage.completion_tokens=NaN"``)."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")
    if "NaN" not in text and "Infinity" not in text:  # the common case: nothing to walk
        return json.loads(text), []
    found: list = []
    return _null_nonfinite(_STRICT.decode(text), "", found), found


def decode_event(event: SSEEvent) -> tuple:
    """``(DONE, [])`` for ``[DONE]``, else ``(JSON object, nonfinite)`` as ``loads_finite``
    gives them; ``MalformedSSE`` when the data is not a JSON object."""
    return decode_data(event.data)


def decode_data(data: str) -> tuple:
    """:func:`decode_event` of an event's data alone (:meth:`SSEParser.feed_data`'s)."""
    if data.strip() == "[DONE]":
        return DONE, []
    try:
        obj, bad = loads_finite(data)
    except (ValueError, RecursionError) as e:
        raise MalformedSSE(f"event data is not JSON ({e}): {data[:200]!r}") from None
    if not isinstance(obj, dict):
        raise MalformedSSE(f"event data is not a JSON object: {data[:200]!r}")
    return obj, bad


def decode_payload(event: SSEEvent):
    """``DONE`` for ``[DONE]``, else the event's JSON object (non-finite numbers as ``None``);
    ``MalformedSSE`` otherwise."""
    return decode_event(event)[0]


# --- chunk interpretation ---------------------------------------------------------------------

_STANDARD_KEYS = frozenset({
    "id", "object", "created", "model", "choices", "usage", "system_fingerprint", "timings",
    "service_tier", "prompt_token_ids", "prompt_logprobs", "kv_transfer_params", "error",
})


@dataclass(frozen=True)
class ChunkInfo:
    """What one decoded chunk carried."""

    text: str = ""
    n_tokens: int = 0  # len(token_ids), else 1 with text (the record's counts: resolve_chunk_tokens)
    token_ids: Optional[list] = None
    finish_reason: Optional[str] = None
    usage: Optional[dict] = None
    timings: Optional[dict] = None
    extra: Optional[dict] = None

    @property
    def is_token_chunk(self) -> bool:
        """Did it carry generated output (text or token ids)?"""
        return bool(self.text) or self.n_tokens > 0


def _choice_text(choice: dict) -> str:
    if "text" in choice:  # completions
        return choice.get("text") or ""
    part = choice.get("delta") or choice.get("message") or {}
    if not isinstance(part, dict):
        raise MalformedSSE(f"choice delta is not an object: {part!r}")
    return (part.get("content") or "") + (part.get("reasoning_content") or part.get("reasoning") or "")


def interpret_chunk(payload: dict) -> ChunkInfo:
    """Read one streaming chunk (completions or chat, vLLM or llama.cpp)."""
    text, n, ids, finish, usage = read_chunk(payload)
    timings = payload.get("timings")
    extra = {k: v for k, v in payload.items()
             if k not in _STANDARD_KEYS and isinstance(v, (int, float, dict)) and not isinstance(v, bool)}
    return ChunkInfo(text, n, ids, finish, usage, timings if isinstance(timings, dict) else None, extra or None)


def read_chunk(payload: dict) -> tuple:
    """``(text, n_tokens, token_ids, finish_reason, usage)`` of one chunk, as :class:`ChunkInfo`
    holds them: what a relay charges, without the chunk's timings and extra fields (the
    gateway's per-token path; :func:`interpret_chunk` adds them). Raises as it does."""
    err = payload.get("error")
    if err is not None or payload.get("object") == "error":
        e = err if isinstance(err, dict) else payload
        code = e.get("code")
        raise StreamError(str(e.get("message", err)), code if isinstance(code, int) else None)
    choices = payload.get("choices")
    if choices is None:
        choices = []
    if not isinstance(choices, list):
        raise MalformedSSE(f"'choices' is not a list: {choices!r}")
    choice = None
    for c in choices:
        if not isinstance(c, dict):
            raise MalformedSSE(f"a choice is not an object: {c!r}")
        if c.get("index", 0) == 0:
            choice = c
            break
    text, n, ids, finish = "", 0, None, None
    if choice is not None:
        text = _choice_text(choice)
        ids = choice.get("token_ids")
        if ids is not None and not isinstance(ids, list):
            raise MalformedSSE(f"'token_ids' is not a list: {ids!r}")
        n = len(ids) if ids is not None else (1 if text else 0)
        finish = choice.get("finish_reason")
    usage = payload.get("usage")
    return text, n, ids, finish, usage if isinstance(usage, dict) else None


# --- writing ----------------------------------------------------------------------------------

#: the head of a streamed answer (vLLM's)
STREAM_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
#: the last event of a stream
DONE_LINE = b"data: [DONE]\n\n"


def data_line(obj) -> bytes:
    """One event: ``data: `` + the object as compact JSON + a blank line."""
    return b"data: " + dumps(obj).encode() + b"\n\n"


def error_event(message: str, type_: str, code: int) -> bytes:
    """The event that reports an error inside a stream whose 200 has gone out (vLLM's shape; a
    reader's ``interpret_chunk`` raises it as ``StreamError``)."""
    return data_line({"error": {"object": "error", "message": message, "type": type_, "param": None,
                                "code": code}})
