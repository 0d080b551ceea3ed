"""A request's body read into one pre-sized buffer and parsed, so that its memory stays within
about 3x its size (on main a 10 MB prompt cost the gateway ~280 MB).

aiohttp's ``request.json()`` keeps the raw bytes cached for the request's life (a bytearray grown
chunk by chunk, then copied into bytes) beside the decoded text and the parsed object; the word
count of a text prompt made a list of every word. Here: the bytes go into a ``bytearray`` of the
``Content-Length`` (no growth, no copy), are decoded and dropped, the text parsed and dropped;
the prompt's words are counted piece by piece (:func:`fairlib.protocol.parse.word_count`); the
body sent upstream replaces the parsed one (:func:`fairlib.gateway.relay.upstream_body` with
``consume``) and is written after its head, not joined with it (fairlib/client/http1.py).
"""
from __future__ import annotations

import json

from aiohttp import web

from fairlib.protocol.routes import MAX_BODY_BYTES
from fairlib.protocol.wire import BadRequest

__all__ = ["read_body_json"]


def _too_large(limit: int) -> BadRequest:
    return BadRequest(f"the request body exceeds {limit} bytes ({limit / 2 ** 20:g} MiB)", None, 413,
                      "RequestEntityTooLargeError")


async def read_body_json(request: web.Request, limit: int = MAX_BODY_BYTES):
    """The request's JSON body; :class:`BadRequest` when it is not JSON (400), nested too deeply
    (400), or larger than ``limit`` bytes (413)."""
    n = request.content_length
    if n is not None and n > limit:
        raise _too_large(limit)
    buf = bytearray(n or 0)
    pos = 0
    while True:
        chunk = await request.content.readany()
        if not chunk:
            break
        end = pos + len(chunk)
        if end > limit:
            raise _too_large(limit)
        if end <= len(buf):
            buf[pos:end] = chunk
        else:
            del buf[pos:]
            buf += chunk
        pos = end
    del buf[pos:]
    try:
        text = buf.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(f"the request body is not valid JSON: not UTF-8 ({e})") from None
    del buf                         # the bytes, then the text, then the object: two at a time
    try:
        return json.loads(text)
    except ValueError as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise BadRequest("the request body is not valid JSON: nested too deeply") from None
