"""The open-loop sender.

Requests leave at their ABSOLUTE intended times (``RunClock``: ``perf_counter`` against one shared
start time; ``asyncio.sleep`` to 1 ms before, then a cooperative spin), each in its own task: a
send never waits for an earlier response, so a slow server cannot lower the offered load. HTTP is
``fairlib.client.http1``: keep-alive connections, each read parsed and timestamped as it arrives. Every
outcome is a record (``records.py``), never an exception. ``run`` writes a run directory; with
``workers=N`` the schedule is split round-robin over N processes aligned to one start time.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Callable, Optional

from fairlib.client.endpoint import EndpointConfig, build_request, redact
from fairlib.client.http1 import ConnectError, HttpSession
from fairlib.client.stream import StreamAccumulator
from fairlib.protocol.sse import (DONE, MalformedSSE, SSEParser, StreamError, UnexpectedContentType, decode_event,
                                  loads_finite)
from fairlib.records.schema import classify_status, finish_record, new_record

__all__ = ["RunClock", "send_request", "send_shard"]

STOP_POLL_S = 0.02   # how often a shard looks at its run's stop flag (a signal's, a parent's)
READ_BUFSIZE = 2 ** 20  # recorded in config.json; the client parses each read as it arrives, no buffer cap
# (aiohttp's 64 KiB default read buffer collapsed throughput at long contexts, vllm#39963)


class RunClock:
    """Seconds since the run's start, from ``perf_counter``; the start is a shared Unix time."""

    def __init__(self, t0_wall: float):
        self.t0_wall = float(t0_wall)
        offsets = []
        for _ in range(5):
            a = time.perf_counter()
            w = time.time()
            b = time.perf_counter()
            offsets.append((b - a, w - (a + b) / 2))
        wall_minus_perf = min(offsets)[1]  # the tightest bracket
        self.t0_perf = self.t0_wall - wall_minus_perf

    def now(self) -> float:
        return time.perf_counter() - self.t0_perf


async def pace_until(clock: RunClock, t: float, spin_s: float = 1e-3) -> None:
    """Return at run time ``t``: sleep to ``t - spin_s``, then yield-spin (other tasks still run)."""
    delay = t - clock.now()
    if delay > spin_s:
        await asyncio.sleep(delay - spin_s)
    while clock.now() < t:
        await asyncio.sleep(0)


# --- one request ------------------------------------------------------------------------------

async def _error_text(resp, limit: int = 4096) -> str:
    try:
        raw = await resp.read(limit)
    except Exception:  # the body is only for the message
        return ""
    text = raw.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        msg = err.get("message") if isinstance(err, dict) else None
        return str(msg) if msg else text
    except ValueError:
        return text


def _feed(events, acc: StreamAccumulator, t: float) -> bool:
    """Apply events to the accumulator; True once ``[DONE]`` arrives."""
    for ev in events:
        payload, nonfinite = decode_event(ev)
        if payload is DONE:
            acc.done = True
            return True
        acc.add(payload, t, nonfinite)
    return False


async def _consume(resp, acc: StreamAccumulator, clock: RunClock) -> None:
    """Read a 200 answer: an SSE stream (``text/event-stream``), or one JSON body from a server
    that ignored ``stream=True``; any other content type is ``UnexpectedContentType``."""
    if resp.content_type == "application/json":  # a server that ignored stream=True
        raw = await resp.read()
        try:
            payload, nonfinite = loads_finite(raw)
        except (ValueError, RecursionError) as e:
            raise MalformedSSE(f"non-stream body is not JSON: {e}") from None
        if not isinstance(payload, dict):
            raise MalformedSSE(f"non-stream body is not a JSON object: {raw[:200]!r}")
        acc.streamed = False
        acc.add(payload, clock.now(), nonfinite)
        acc.done = True
        return
    if resp.content_type != "text/event-stream":
        head = await resp.read(200)
        raise UnexpectedContentType(f"HTTP 200 with Content-Type {resp.headers.get('Content-Type', '(none)')!r}, "
                                    f"not text/event-stream; body starts {head!r}")
    acc.streamed = True
    parser = SSEParser()
    # each read is parsed as it arrives, stamped with its arrival time (fairlib.client.http1)
    if not await resp.stream(lambda data, t: _feed(parser.feed(data), acc, t)):
        _feed(parser.flush(), acc, clock.now())


def _classify_end(rec: dict, acc: StreamAccumulator) -> None:
    """A complete 200 answer's class: ``disconnect`` (no end), ``nonfinite_number`` (NaN/Infinity
    in its JSON), ``over_max_tokens`` (more tokens claimed than asked), ``short_stream`` (fewer),
    else ``none``."""
    if not acc.done and acc.finish_reason is None:
        rec["error_class"] = "disconnect"
        rec["error_message"] = "stream ended without [DONE] or a finish_reason"
        return
    n, want = acc.completion_tokens, rec["max_tokens"]
    if acc.nonfinite:
        rec["error_class"] = "nonfinite_number"
        rec["error_message"] = ("NaN/Infinity in the server's JSON (read as null): "
                                + ", ".join(acc.nonfinite))[:2000]
    elif n is not None and want is not None and n > want:
        rec["error_class"] = "over_max_tokens"
        rec["error_message"] = f"completion_tokens {n} > max_tokens {want} ({acc.tokens_source}): the count is not trusted"
    elif n is not None and n < want:
        rec["error_class"] = "short_stream"
        rec["error_message"] = f"completion_tokens {n} < max_tokens {want} ({acc.tokens_source})"
    elif n is None and acc.finish_reason != "length":
        rec["error_class"] = "short_stream"
        rec["error_message"] = f"no usage or token ids, finish_reason {acc.finish_reason!r}"


def _fail(rec: dict, cls: str, e: BaseException) -> None:
    rec["error_class"] = cls
    rec["error_message"] = f"{type(e).__name__}: {e}"[:2000]


async def send_request(session: HttpSession, req, cfg: EndpointConfig, clock: RunClock,
                       worker: int = 0) -> dict:
    """Send one planned request now and return its record (never raises, even when cancelled)."""
    rec = new_record(req, worker)
    acc = StreamAccumulator()
    end = None
    try:
        url, headers, body = build_request(req, cfg)
        rec["actual_send_s"] = clock.now()
        async with session.post(url, data=body, headers=headers, now=clock.now) as resp:
            rec["http_status"] = resp.status
            if resp.retried:   # the server closed the idle connection as the request left: sent again
                rec["retry_reason"] = redact(f"retried on a new connection ({resp.retried})", cfg.secrets)
            if resp.status != 200:
                rec["error_class"] = classify_status(int(resp.status or 0))
                rec["error_message"] = f"HTTP {resp.status}: {await _error_text(resp)}"[:2000]
            else:
                await _consume(resp, acc, clock)
                end = clock.now()
                _classify_end(rec, acc)
    except asyncio.CancelledError as e:
        _fail(rec, "interrupted", e)
        rec["error_message"] = "run stopped while the request was in flight"
    except MalformedSSE as e:
        _fail(rec, "malformed_sse", e)
    except UnexpectedContentType as e:
        _fail(rec, "bad_content_type", e)
    except StreamError as e:
        _fail(rec, classify_status(e.code) if e.code and e.code >= 400 else "http_5xx", e)
    except ConnectError as e:
        _fail(rec, "connect_error", e)
    except TimeoutError as e:  # the whole request's limit (or the connect limit)
        _fail(rec, "timeout", e)
        rec["error_message"] = f"no complete answer within {cfg.timeout_s} s ({type(e).__name__}: {e})"
    except (ConnectionError, OSError) as e:  # fairlib.client.http1.Disconnected, resets
        _fail(rec, "disconnect", e)
    except Exception as e:  # a client bug: still a record, never a crash
        _fail(rec, "client_error", e)
    if end is None:
        end = clock.now()
    if rec["error_message"]:    # the server's or the OS's words: a credential they echo is masked
        rec["error_message"] = redact(rec["error_message"], cfg.secrets)
    return finish_record(rec, acc, end, clock.t0_wall)


# --- one shard (one event loop) ---------------------------------------------------------------

def make_session(cfg: EndpointConfig) -> HttpSession:
    """A session without a connection cap (open loop); idle connections are kept ``KEEPALIVE_S``
    (below the servers' idle timeouts), and a request that meets a connection the server closed
    as it left is sent once more (``fairlib.client.http1``)."""
    return HttpSession(timeout_s=cfg.timeout_s, connect_timeout_s=cfg.connect_timeout_s)


async def send_shard(requests, cfg: EndpointConfig, clock: RunClock, on_record: Callable[[dict], None],
                     *, worker: int = 0, spin_s: float = 1e-3,
                     stop: Optional[asyncio.Event] = None, on_send: Optional[Callable[[], None]] = None) -> dict:
    """Send ``requests`` at their intended offsets; ``on_record`` gets each record as it completes,
    ``on_send()`` (when given) is called as each request leaves (a progress count).

    Setting ``stop`` ends the shard: unsent requests are dropped, in-flight ones are cancelled and
    recorded as ``interrupted``. Returns ``{"interrupted": bool}``.
    """
    stop = stop or asyncio.Event()
    inflight: set = set()
    idle = asyncio.Event()
    finished_dispatch = False

    async with make_session(cfg) as session:
        async def one(req):
            on_record(await send_request(session, req, cfg, clock, worker))

        def done(task):
            inflight.discard(task)
            if finished_dispatch and not inflight:
                idle.set()

        async def dispatch():
            nonlocal finished_dispatch
            for req in requests:
                if req.send_offset_s > clock.now():
                    await pace_until(clock, req.send_offset_s, spin_s)
                if stop.is_set():   # stopped while this one was due: it and the rest are never sent
                    return
                task = asyncio.create_task(one(req))
                inflight.add(task)
                task.add_done_callback(done)
                if on_send is not None:
                    on_send()
            finished_dispatch = True
            if not inflight:
                idle.set()

        dispatcher = asyncio.create_task(dispatch())
        waiters = [asyncio.create_task(idle.wait()), asyncio.create_task(stop.wait())]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        interrupted = stop.is_set() and not idle.is_set()
        if interrupted:
            dispatcher.cancel()
            for task in list(inflight):
                task.cancel()
        pending = [dispatcher, *inflight]
        await asyncio.gather(*pending, return_exceptions=True)
        for w in waiters:
            w.cancel()
    return {"interrupted": interrupted}


def _in_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def run_inprocess(schedule, cfg: EndpointConfig, on_record, t0_wall: float, *, spin_s: float = 1e-3,
                  stop=None, on_send=None) -> dict:
    """One event loop in this process (in a helper thread when a loop already runs here, e.g. Jupyter).

    ``stop``: anything with ``is_set()`` (``measure.RunStop``, set by a signal handler), polled
    every ``STOP_POLL_S``; once set, the shard stops as ``send_shard``'s ``stop`` does."""

    async def main():
        st = asyncio.Event()

        async def watch():
            while not stop.is_set():
                await asyncio.sleep(STOP_POLL_S)
            st.set()

        watcher = asyncio.create_task(watch()) if stop is not None else None
        try:
            return await send_shard(schedule, cfg, RunClock(t0_wall), on_record, spin_s=spin_s, stop=st,
                                    on_send=on_send)
        finally:
            if watcher is not None:
                watcher.cancel()

    if not _in_running_loop():
        return asyncio.run(main())
    box: dict = {}
    th = threading.Thread(target=lambda: box.setdefault("r", asyncio.run(main())), name="fairlib-client")
    th.start()
    th.join()
    return box["r"]


# --- a whole run ------------------------------------------------------------------------------

