"""The open-loop sender.

Requests leave at their ABSOLUTE intended times (``RunClock``: ``perf_counter`` against one shared
start time; ``asyncio.sleep`` to 1 ms before, then a cooperative spin), each in its own task: a
send never waits for an earlier response, so a slow server cannot lower the offered load. Every
outcome is a record (``records.py``), never an exception. ``run`` writes a run directory; with
``workers=N`` the schedule is split round-robin over N processes aligned to one start time.
"""
from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from typing import Callable, Optional

import aiohttp

from fairlib.client.endpoint import EndpointConfig, build_request
from fairlib.client.sse import DONE, MalformedSSE, SSEParser, StreamAccumulator, StreamError, decode_payload
from fairlib.records.schema import classify_status, finish_record, new_record

__all__ = ["RunClock", "send_request", "send_shard"]

READ_BUFSIZE = 2 ** 20  # aiohttp's 64 KiB default collapsed throughput at long contexts (vllm#39963)


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
        raw = await resp.content.read(limit)
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
        payload = decode_payload(ev)
        if payload is DONE:
            acc.done = True
            return True
        acc.add(payload, t)
    return False


async def _consume(resp, acc: StreamAccumulator, clock: RunClock) -> None:
    if resp.content_type == "application/json":  # a server that ignored stream=True
        raw = await resp.read()
        try:
            payload = json.loads(raw)
        except ValueError as e:
            raise MalformedSSE(f"non-stream body is not JSON: {e}") from None
        acc.add(payload, clock.now())
        acc.done = True
        return
    parser = SSEParser()
    async for data in resp.content.iter_any():
        if _feed(parser.feed(data), acc, clock.now()):
            return
    _feed(parser.flush(), acc, clock.now())


def _classify_end(rec: dict, acc: StreamAccumulator) -> None:
    if not acc.done and acc.finish_reason is None:
        rec["error_class"] = "disconnect"
        rec["error_message"] = "stream ended without [DONE] or a finish_reason"
        return
    n, want = acc.completion_tokens, rec["max_tokens"]
    if n is not None and n < want:
        rec["error_class"] = "short_stream"
        rec["error_message"] = f"completion_tokens {n} < max_tokens {want} ({acc.tokens_source})"
    elif n is None and acc.finish_reason != "length":
        rec["error_class"] = "short_stream"
        rec["error_message"] = f"no usage or token ids, finish_reason {acc.finish_reason!r}"


def _fail(rec: dict, cls: str, e: BaseException) -> None:
    rec["error_class"] = cls
    rec["error_message"] = f"{type(e).__name__}: {e}"[:2000]


async def send_request(session: aiohttp.ClientSession, req, cfg: EndpointConfig, clock: RunClock,
                       worker: int = 0) -> dict:
    """Send one planned request now and return its record (never raises, even when cancelled)."""
    rec = new_record(req, worker)
    acc = StreamAccumulator()
    end = None
    try:
        url, headers, body = build_request(req, cfg)
        rec["actual_send_s"] = clock.now()
        async with session.post(url, data=body, headers=headers, allow_redirects=False) as resp:
            rec["http_status"] = resp.status
            if resp.status != 200:
                rec["error_class"] = classify_status(resp.status)
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
    except StreamError as e:
        _fail(rec, classify_status(e.code) if e.code and e.code >= 400 else "http_5xx", e)
    except aiohttp.ClientConnectorError as e:
        _fail(rec, "connect_error", e)
    except TimeoutError as e:  # asyncio.TimeoutError and aiohttp's timeout errors
        _fail(rec, "timeout", e)
        rec["error_message"] = f"no complete answer within {cfg.timeout_s} s ({type(e).__name__})"
    except aiohttp.InvalidURL as e:
        _fail(rec, "connect_error", e)
    except (aiohttp.ClientError, ConnectionError, OSError) as e:
        _fail(rec, "disconnect", e)
    except Exception as e:  # a client bug: still a record, never a crash
        _fail(rec, "client_error", e)
    if end is None:
        end = clock.now()
    return finish_record(rec, acc, end, clock.t0_wall)


# --- one shard (one event loop) ---------------------------------------------------------------

def make_session(cfg: EndpointConfig) -> aiohttp.ClientSession:
    """A session without a connection cap (open loop) and with a 1 MiB read buffer."""
    timeout = aiohttp.ClientTimeout(total=cfg.timeout_s, sock_connect=cfg.connect_timeout_s)
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=READ_BUFSIZE)


async def send_shard(requests, cfg: EndpointConfig, clock: RunClock, on_record: Callable[[dict], None],
                     *, worker: int = 0, spin_s: float = 1e-3,
                     stop: Optional[asyncio.Event] = None) -> dict:
    """Send ``requests`` at their intended offsets; ``on_record`` gets each record as it completes.

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
                task = asyncio.create_task(one(req))
                inflight.add(task)
                task.add_done_callback(done)
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
                  handle_sigint: bool = True) -> dict:
    """One event loop in this process (in a helper thread when a loop already runs here, e.g. Jupyter)."""

    async def main():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        installed = False
        if handle_sigint and threading.current_thread() is threading.main_thread():
            try:
                loop.add_signal_handler(signal.SIGINT, stop.set)
                installed = True
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        try:
            return await send_shard(schedule, cfg, RunClock(t0_wall), on_record, spin_s=spin_s, stop=stop)
        finally:
            if installed:
                loop.remove_signal_handler(signal.SIGINT)

    if not _in_running_loop():
        return asyncio.run(main())
    box = {}
    th = threading.Thread(target=lambda: box.setdefault("r", asyncio.run(main())), name="fairlib-client")
    th.start()
    th.join()
    return box["r"]


# --- a whole run ------------------------------------------------------------------------------

