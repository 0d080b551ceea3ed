"""What the gateway says: one JSON line per request (the access log) and one per event an
operator must hear of (an upstream turning unhealthy or healthy again, the drain, the exit).

Access-log line (``--access-log FILE``, default stderr; ``off``: none)::

    {"time": "2026-12-04T19:05:00.123Z", "tenant": "alice", "api": "chat", "stream": true,
     "upstream": "http://10.0.0.5:8000/v1", "status": 200, "queue_wait_s": 0.0123, "ttft_s": 0.2345,
     "duration_s": 1.5, "prompt_tokens": 20, "output_tokens": 64, "retried": false, "error": null,
     "reason": null}

``reason``: the ``x-fairlib-rejected-reason`` of an answer the gateway made itself; ``error``: a
stream the upstream broke (mid-stream: its status stays 200, the client got an error event). It
never holds a key, a prompt or an answer. Event lines (always stderr) carry ``"event"`` and
``"level"`` (``info``, ``warning``).
"""
from __future__ import annotations

import json
import sys
import time
from typing import Optional

from aiohttp import web

__all__ = ["GatewayLog", "utc_stamp", "access_record", "own_reason", "REASON_OF_STATUS", "UPSTREAM_ANSWER"]

#: set on a response that is the upstream's own answer passed back (no rejected reason of ours)
UPSTREAM_ANSWER = web.ResponseKey("upstream_answer", bool)

#: ``x-fairlib-rejected-reason`` of an answer the gateway made itself that named none
REASON_OF_STATUS = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "no_route",
                    405: "method_not_allowed", 409: "conflict", 413: "body_too_large", 415: "unsupported_media_type",
                    429: "rate_limited", 500: "gateway_fault", 502: "upstream_failed", 503: "unavailable"}


def own_reason(resp) -> Optional[str]:
    """The rejected reason of ``resp`` (None: a success, or the upstream's own answer passed back)."""
    if resp is None or resp.status < 400 or resp.get(UPSTREAM_ANSWER):
        return None
    return resp.headers.get("x-fairlib-rejected-reason") or REASON_OF_STATUS.get(resp.status, f"http_{resp.status}")


def _s(ms_a: float, ms_b: float) -> Optional[float]:
    d = (ms_b - ms_a) / 1e3
    return round(d, 6) if d == d else None          # NaN (never happened): null


def access_record(gw, note: dict, resp, t0: float) -> dict:
    """One request's access-log fields: ``note`` (filled in by the handler: tenant, api, stream,
    upstream, retried, error, ``p`` the Pending), the response (None: the client left first:
    499, nginx's code) and its start ``t0`` on the gateway's clock."""
    p = note.get("p")
    status = 499 if resp is None else resp.status
    return {"tenant": note.get("tenant"), "api": note.get("api"), "stream": note.get("stream"),
            "upstream": note.get("upstream"), "status": status,
            "queue_wait_s": None if p is None else _s(p.arrival_ms, p.dispatched_ms),
            "ttft_s": None if p is None else _s(p.arrival_ms, p.first_ms),
            "duration_s": round(gw.clock() - t0, 6), "prompt_tokens": note.get("prompt_tokens"),
            "output_tokens": None if p is None else p.counted, "retried": note.get("retried", False),
            "error": note.get("error"), "reason": "client_closed" if resp is None else own_reason(resp)}


def utc_stamp(t: Optional[float] = None) -> str:
    """``t`` (epoch seconds, default now) as ISO 8601 UTC to the millisecond."""
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


class GatewayLog:
    """The access log (``path``: "-" stderr, None nowhere, else a file appended to, line-buffered)
    and the event lines (stderr)."""

    def __init__(self, path: Optional[str] = "-", events=None):
        self.path = path
        self._own = None
        if path is None:
            self.out = None
        elif path == "-":
            self.out = sys.stderr
        else:
            try:
                self._own = self.out = open(path, "a", buffering=1, encoding="utf-8")
            except OSError as e:
                raise ValueError(f"--access-log {path}: cannot open it ({e.strerror or e})") from None
        self.events_out = events if events is not None else sys.stderr
        self.lines = 0

    def access(self, rec: dict) -> None:
        """One request's line (``rec``: its fields, no key and no prompt among them)."""
        if self.out is not None:
            self.out.write(json.dumps({"time": utc_stamp(), **rec}, separators=(",", ":")) + "\n")
            self.lines += 1

    def event(self, event: str, level: str = "info", message: str = "", **fields) -> None:
        """An operator's line: ``event`` (e.g. ``upstream_unhealthy``), its ``level`` and fields."""
        rec = {"time": utc_stamp(), "level": level, "event": event, "message": message, **fields}
        try:
            self.events_out.write("fairlib gateway: " + json.dumps(rec, separators=(",", ":")) + "\n")
            self.events_out.flush()
        except (OSError, ValueError):       # stderr closed: the gateway goes on
            pass

    def close(self) -> None:
        if self._own is not None:
            self._own.close()
            self._own = None
