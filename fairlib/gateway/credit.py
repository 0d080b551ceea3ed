"""``--max-inflight auto``: each upstream's in-flight cap is a credit learned from the engine
(the control law: fairlib/sim/credit.py; its argument: book/gateway.md).

At start, each upstream's credit starts from the limit the engine states, where it states one:

* vLLM: ``scheduler_config.max_num_seqs`` from ``GET /server_info?config_format=json`` (served
  only with ``VLLM_SERVER_DEV_MODE=1``; vLLM's ``/metrics`` has ``vllm:cache_config_info``, the KV
  blocks, but no ``max_num_seqs``);
* llama.cpp: ``total_slots`` from ``GET /props``;
* else the ``--cost-model`` (a ``fairlib probe``/``fit`` file)'s ``max_batch``, else ``--credit-start``.

Then every ``interval_s`` it reads the upstream's ``/metrics``: the waiting queue and the running
batch (:data:`LOAD_METRICS`: vLLM's names, which ``fairlib serve`` imitates, or llama.cpp's with
``--metrics``), and hands them to the upstream's :class:`CreditController` with the gateway's own
in-flight count there; the new credit is the upstream's ``max_inflight`` at once (a raise fills
the new slots now; a cut lets those in flight finish). An upstream whose ``/metrics`` cannot be
read or holds neither pair (an OpenAI-compatible server without them; counted in ``scrape_errors``)
is observed from the streams instead (:func:`stream_load`, counted in ``from_streams``): of the
gateway's own requests there, those a decode step rebuilt from the streams has carried run, those
sent that no step has carried yet wait (or are in their prefill). That sees only the gateway's own
traffic, which is why the engine's own counts come first.
"""
from __future__ import annotations

import asyncio
import json
import math
from typing import Optional

from aiohttp import web

from fairlib.client.http1 import ConnectError, Disconnected, HttpSession
from fairlib.client.prom import parse_prometheus
from fairlib.gateway.share import share_cap
from fairlib.sim import state
from fairlib.sim.credit import CreditController

__all__ = ["LOAD_METRICS", "engine_load", "stream_load", "stated_limit", "CreditLoop", "attach"]

#: (waiting, running) metric names per engine family, as their /metrics write them
LOAD_METRICS = (("vllm:num_requests_waiting", "vllm:num_requests_running"),
                ("llamacpp:requests_deferred", "llamacpp:requests_processing"))


def _sum(metrics: dict, name: str) -> Optional[float]:
    """The sum of ``name``'s samples over its label sets (vLLM writes one per engine), or None."""
    vals = [v for k, v in metrics.items() if (k == name or k.startswith(name + "{")) and v is not None]
    return float(sum(vals)) if vals else None


def engine_load(text: str) -> Optional[tuple]:
    """``(waiting, running)`` from a /metrics text, or None when it has neither family's pair."""
    m = parse_prometheus(text, ("vllm:", "llamacpp:"))
    for w_name, r_name in LOAD_METRICS:
        w, r = _sum(m, w_name), _sum(m, r_name)
        if w is not None and r is not None:
            return w, r
    return None


def stream_load(gate, in_flight) -> tuple:
    """``(waiting, running)`` of the requests ``in_flight`` (ids of ``gate``, a PolicyGate) from the
    streams: running = those a closed rebuilt decode step has carried (their first token in it),
    waiting = the others (sent, not yet emitting: in the engine's queue or its prefill, or emitting
    in the step still open). An upstream that answers without streaming shows every request as
    waiting until it ends: there the fallback can only cut (book/gateway.md)."""
    first = gate.S.RF[state.FIRST]
    running = sum(1 for rid in in_flight if not math.isnan(first[rid]))
    return float(len(in_flight) - running), float(running)


def _limit_from(body: bytes, path: tuple) -> Optional[int]:
    try:
        d = json.loads(body)
        for k in path:
            d = d[k]
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d) or d < 1:
        return None
    return int(d)


#: how long the start may wait for an engine's statement (vLLM's /server_info collects its
#: environment on the first call: seconds); the observations begin after it
STATED_TIMEOUT_S = 30.0
#: where an engine states its batch limit: (path, JSON keys to the number, what it is)
STATED = (("/server_info?config_format=json", ("vllm_config", "scheduler_config", "max_num_seqs"),
           "vLLM max_num_seqs"),
          ("/props", ("total_slots",), "llama.cpp total_slots"))


async def stated_limit(sess: HttpSession, root: str, headers: dict) -> Optional[tuple]:
    """``(limit, source)``: the batch limit the engine at ``root`` states (:data:`STATED`), or None."""
    for path, keys, what in STATED:
        try:
            async with sess.get(root + path, headers=headers) as r:
                body = await r.read(1 << 22)
                if r.status != 200:
                    continue
        except (ConnectError, Disconnected, TimeoutError, OSError):
            continue
        n = _limit_from(body, keys)
        if n is not None:
            return n, what
    return None


class CreditLoop:
    """The gateway's credit task: the start limits, then one observation per upstream every
    ``interval_s`` (the gateway's ``cfg.credit``)."""

    def __init__(self, gw, headers: dict):
        self.gw, self.headers = gw, dict(headers)
        self.opt = gw.cfg.credit
        self.task: Optional[asyncio.Task] = None
        for up in gw.upstreams:
            up.credit = CreditController(up.max_inflight, self.opt)
            up.credit_source = "--cost-model max_batch" if gw.cfg.cost_model and \
                gw.cfg.cost_model.get("max_batch") else "--credit-start"
            up.scrape_errors = 0

    async def start_limits(self, sess: HttpSession) -> None:
        for up in self.gw.upstreams:
            got = await stated_limit(sess, up.root, self.headers)
            if got is not None:
                n, up.credit_source = got
                up.credit = CreditController(n, self.opt)
                self.apply(up, up.credit.credit)

    def apply(self, up, credit: int) -> None:
        """``up``'s cap becomes ``credit``: new slots are filled now; a token pool learns its slots."""
        old, up.max_inflight = up.max_inflight, int(credit)
        if old == up.max_inflight:
            return
        gw = self.gw
        avail = [u.max_inflight for u in gw.upstreams if u.available] or [up.max_inflight]
        gw.gate.set_slots(max(1, sum(avail) // len(avail)), gw.now_ms())
        # each tenant's share follows the slots the upstreams hold now (share.py)
        gw.share.cap = share_cap(gw.cfg.tenant_max_share, sum(u.max_inflight for u in gw.upstreams))
        if up.max_inflight > old:
            gw.pump()

    async def observe(self, sess: HttpSession, up) -> None:
        try:
            async with sess.get(up.root + "/metrics", headers=self.headers) as r:
                body = await r.read(1 << 24)
                ok = r.status == 200
        except (ConnectError, Disconnected, TimeoutError, OSError):
            ok = False
        load = engine_load(body.decode("utf-8", "replace")) if ok else None
        if load is None:          # no engine counts: the gateway's own requests, from the streams
            up.scrape_errors += 1
            up.from_streams += 1
            load = stream_load(self.gw.gate, up.in_flight)
        self.apply(up, up.credit.observe(load[0], load[1], len(up.in_flight)))

    async def run(self) -> None:
        """Until cancelled: the start limits, then the observations (all upstreams at once)."""
        first = HttpSession(timeout_s=STATED_TIMEOUT_S, connect_timeout_s=2.0)
        try:
            await self.start_limits(first)
        finally:
            await first.close()
        sess = HttpSession(timeout_s=max(1.0, 4 * self.opt.interval_s), connect_timeout_s=1.0)
        try:
            loop = asyncio.get_running_loop()
            nxt = loop.time()
            while True:
                nxt += self.opt.interval_s
                await asyncio.sleep(max(0.0, nxt - loop.time()))
                await asyncio.gather(*(self.observe(sess, u) for u in self.gw.upstreams if u.available))
        finally:
            await sess.close()


def attach(app: web.Application, gw, headers: dict) -> None:
    """With ``gw.cfg.credit`` set: the credit task runs while ``app`` does."""
    if gw.cfg.credit is None:
        return
    cl = CreditLoop(gw, headers)

    async def on_startup(app):
        cl.task = asyncio.get_running_loop().create_task(cl.run())

    async def on_cleanup(app):
        if cl.task is not None:
            cl.task.cancel()
            await asyncio.gather(cl.task, return_exceptions=True)

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
