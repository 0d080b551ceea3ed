"""Upstream failures: passive health, the one retry, and what a failed request is charged.

A connection to an upstream that fails (refused, reset, no answer within the idle timeout) takes
that upstream out at once (:func:`mark` with ``at_once``: Envoy's outlier detection does
the same on consecutive 5xx / connect failures); its health checks put it back when one passes.

A request whose upstream failed before its first byte never reached the engine's batch: it is
sent once more, to another upstream that takes requests and has a free slot (:func:`retry_on`),
within its deadline; a second failure, or no such upstream, answers 502. A stream that fails after
its first byte is never retried (tokens were delivered): it ends with an error, counted. Either
way the request is charged what it used: the prompt at its dispatch (the policy's admission
charge) and the tokens it streamed, nothing for the tokens it never got.
"""
from __future__ import annotations

from typing import Optional

from fairlib.gateway.core import Gateway, Pending, Upstream

__all__ = ["UpstreamFailed", "mark", "connection_failed", "retry_on", "MAX_RETRIES"]

#: sends to another upstream after the first failed before its first byte
MAX_RETRIES = 1


class UpstreamFailed(Exception):
    """The upstream failed before the first byte of its answer (the request may go elsewhere)."""


def mark(gw: Gateway, up: Upstream, ok: bool, why: str = "", at_once: bool = False) -> None:
    """One health check's outcome (``health_failures`` misses in a row take ``up`` out), or a
    failed connection's (``at_once``: passive health, as Envoy's outlier detection); the next
    passing check puts it back. Each change is a warning line."""
    if ok:
        up.misses = 0
        if not up.healthy:
            up.healthy = True
            gw.log.event("upstream_healthy", "warning", f"upstream {up.url} passes its health check again",
                         upstream=up.url)
            gw.capacity_changed()
            gw.pump()
    else:
        up.misses += 1
        if (at_once or up.misses >= gw.cfg.health_failures) and up.healthy:
            up.healthy = False
            gw.log.event("upstream_unhealthy", "warning", f"upstream {up.url} is taken out: {why}",
                         upstream=up.url, in_flight=len(up.in_flight))
            gw.capacity_changed()


def connection_failed(gw: Gateway, up: Upstream, why: str) -> None:
    """``up``'s connection failed: counted, and ``up`` is taken out until a health check passes."""
    up.failures += 1
    mark(gw, up, False, why, at_once=True)


def retry_on(gw: Gateway, p: Pending) -> Optional[Upstream]:
    """Move ``p`` (which no upstream has answered yet) to the available upstream with the most
    free slots but its own, or None when there is none. The policy's view does not change: it
    is the same request in flight."""
    old = p.sent_to
    best = None
    for u in gw.upstreams:
        if u is not old and u.available and u.free > 0 and (best is None or u.free > best.free):
            best = u
    if best is None or not old.tracker.forget(p.rid):
        return None
    old.in_flight.discard(p.rid)
    old.retried += 1
    t = gw.now_ms()
    best.in_flight.add(p.rid)
    best.dispatched += 1
    best.tracker.dispatched(p.rid, t)
    p.upstream = best
    return best
