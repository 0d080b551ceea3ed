"""The gateway's state and decisions, apart from HTTP: tenants, the policy (``PolicyGate``), the
upstreams with their slots and decode steps, the waiting requests and the metrics.

Flow of one request (fairlib/gateway/app.py does the HTTP):

1. ``tenant_of``: the fairness id header or the API key names the tenant (or 401);
2. ``submit``: the tenant's queue cap (429), the policy's ``accept`` (429, e.g. rpm_quota with its
   Retry-After), a waiting line; returns a future that resolves to the upstream it goes to;
3. ``pump`` (after every arrival, finish and withdrawal): the policy's ``select`` fills the open
   slots; each admitted request goes to the healthy upstream with the most free slots (ties: the
   first listed);
4. while it streams, ``tokens`` feeds each read's tokens to its upstream's ``StepTracker``; every closed
   step is ``PolicyGate.observe`` (charges, the policy's counters), its finished requests free
   their slots;
5. ``release`` when its exchange with the upstream ends, however it ends; ``withdraw`` for a
   request that leaves while waiting (client gone, timed out).

Clock: milliseconds since the gateway started (``now_ms``), one clock for arrivals, steps and
the event log; ``t0_wall`` is the wall-clock time of its zero.
"""
from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from fairlib.gateway import metrics
from fairlib.gateway.access_log import GatewayLog
from fairlib.gateway.config import GatewayConfig, with_tenant_weights
from fairlib.gateway.estimate import GatewayEstimator
from fairlib.gateway.identity import Identity, Unauthorized, tenant_index
from fairlib.gateway.share import TenantShare, share_cap
from fairlib.gateway.steps import StepTracker
from fairlib.protocol.wire import ParamError
from fairlib.sim.credit import CreditController
from fairlib.sim.gate import PolicyGate

__all__ = ["Gateway", "Upstream", "Rejected", "Unauthorized", "REJECT_REASONS"]

#: why a request was turned away, as the metrics and the ``x-fairlib-rejected-reason`` header say
REJECT_REASONS = ("policy", "queue_full", "queue_timeout", "no_upstream", "unknown_tenant", "tenant_mismatch",
                  "upstream_broken")


class Rejected(Exception):
    """A request the gateway will not serve: ``status`` (429 or 503), ``reason`` (REJECT_REASONS),
    ``retry_after_s`` (None: no advice)."""

    def __init__(self, status: int, reason: str, message: str, retry_after_s: Optional[float] = None):
        super().__init__(message)
        self.status, self.reason, self.message, self.retry_after_s = status, reason, message, retry_after_s


@dataclass
class Upstream:
    index: int
    url: str                      # the OpenAI base, ".../v1"
    max_inflight: int
    tracker: StepTracker = field(init=False)    # Gateway._tracker(up), set at once (it closes over the Upstream)
    in_flight: set = field(default_factory=set)
    healthy: bool = True
    misses: int = 0
    dispatched: int = 0
    failures: int = 0
    drained: bool = False         # taken out by the operator (POST /admin/upstreams): no new requests
    credit: Optional[CreditController] = None     # --max-inflight auto: its CreditController (fairlib/gateway/credit.py)
    credit_source: Optional[str] = None
    scrape_errors: int = 0
    from_streams: int = 0         # credit observations made from the streams (no load in its /metrics)
    retried: int = 0              # requests sent on to another upstream after this one failed them
    broken: int = 0               # streams this upstream broke after their first byte

    @property
    def available(self) -> bool:
        """It takes new requests: healthy and not drained."""
        return self.healthy and not self.drained

    @property
    def root(self) -> str:
        return self.url[:-3] if self.url.endswith("/v1") else self.url

    @property
    def free(self) -> int:
        return self.max_inflight - len(self.in_flight)


@dataclass
class Pending:
    """What the gateway keeps of one request it accepted."""
    rid: int
    tenant: int
    arrival_ms: float
    future: asyncio.Future
    upstream: Optional[Upstream] = None
    dispatched_ms: float = float("nan")
    first_ms: float = float("nan")
    max_tokens: Optional[int] = None
    counted: int = 0              # output tokens seen so far
    category: Optional[str] = None   # with an estimator: the request's category, tier, estimate
    tier: Optional[str] = None
    estimate: Optional[int] = None

    @property
    def sent_to(self) -> Upstream:
        """The upstream it was dispatched to (a RuntimeError before: a caller's bug)."""
        if self.upstream is None:
            raise RuntimeError(f"request {self.rid} has not been dispatched to an upstream")
        return self.upstream


class Gateway(metrics.MetricFamilies):
    def __init__(self, cfg: GatewayConfig, clock=time.perf_counter):
        self.cfg = cfg
        self.clock = clock
        self.t0 = clock()
        self.t0_wall = time.time()      # the wall clock at t0: aligns the event log with a client's run
        #: Prometheus text appended to /metrics (text format only): under ``--data-plane envoy`` Envoy's
        #: own stats; a blocking call, run off the event loop
        self.extra_metrics: Optional[Callable[[], bytes]] = None
        self.upstreams = [Upstream(i, u, m) for i, (u, m) in enumerate(zip(cfg.upstreams, cfg.max_inflight))]
        for up in self.upstreams:
            up.tracker = self._tracker(up)
        self.names: list = [t.name for t in cfg.tenants.tenants]
        self.by_name = {n: i for i, n in enumerate(self.names)}
        self.identity = Identity(cfg)
        self.log = GatewayLog(cfg.access_log)
        self.pending: dict = {}
        self.finishing = 0               # finished streams whose step has not closed yet
        self._timers: dict = {}
        self.late_finishes = 0
        self.stopping = False            # a stop signal came: no new request, the rest drain
        self.handlers: set = set()       # the request handlers running (a cut drain cancels them)
        self.cut_in_flight = 0           # requests a cut drain stopped
        self.policy_name, self.policy_params = cfg.policy, cfg.effective_policy_params()
        # each step the trackers rebuild is well formed by construction, so the policy's per-step
        # validation (ids, tokens, finished as arrays of one length, unique, >= 1 token: ~8 us a
        # step) is off; FAIRLIB_CHECK_STEPS=1 (tests/conftest.py sets it) turns it on
        self.check_steps = os.environ.get("FAIRLIB_CHECK_STEPS", "") == "1"
        self.gate = self._new_gate(cfg.policy, self.policy_params)
        # a tenant's share of the slots the upstreams hold now (with --max-inflight auto: the
        # credits, which fairlib/gateway/credit.py keeps the cap following), not of the ceiling
        self.share = TenantShare(share_cap(cfg.tenant_max_share, sum(u.max_inflight for u in self.upstreams)))
        self.estimator = self._new_estimator()
        self._warm_up()
        self._metrics()

    # --- set-up -----------------------------------------------------------------------------
    def _new_gate(self, policy: str, params: dict) -> PolicyGate:
        # room for as many parked requests as there are slots (share.py): the policy counts them as running
        extra = self.cfg.slots if share_cap(self.cfg.tenant_max_share, self.cfg.slots) < self.cfg.slots else 0
        return PolicyGate(policy, n_tenants=self.cfg.n_tenants, slots=self.cfg.slots + extra,
                          prefill_ms_per_token=self.cfg.prefill_ms_per_token, n_classes=self.cfg.n_classes,
                          record=self.cfg.record_events, **params)

    def _new_estimator(self) -> Optional[GatewayEstimator]:
        c = self.cfg
        return None if c.estimator is None else GatewayEstimator(c.estimator, c.estimator_key)

    def _warm_up(self) -> None:
        """Run every compiled entry once on a throwaway gate, so that loading (or compiling) the
        kernels happens before the first request, not during it."""
        g = PolicyGate(self.policy_name, n_tenants=self.cfg.n_tenants, slots=2, n_classes=self.cfg.n_classes,
                       **self.policy_params)
        a, _ = g.arrive(0, 1, 0.0, 1)
        b, _ = g.arrive(0, 1, 0.0, 1)
        for rid in g.admit(0.0):
            g.observe([rid], [1], [True], 1.0, 1.0)
        g.withdraw(b, 2.0)
        g.set_replicas(1, 3.0)

    def _tracker(self, up: Upstream) -> StepTracker:
        return StepTracker(lambda ids, toks, fin, dt, t: self._on_step(up, ids, toks, fin, dt, t),
                           lambda rid: self._on_late(up, rid), self.cfg.step_tol_ms)

    def _metrics(self) -> None:
        metrics.build(self, REJECT_REASONS)         # the families: fairlib/gateway/metrics.py

    # --- clock and tenants ------------------------------------------------------------------
    def now_ms(self) -> float:
        return (self.clock() - self.t0) * 1e3

    def tenant_name(self, i: int) -> str:
        return self.names[i] if i < len(self.names) else f"tenant{i}"

    def tenant_of(self, headers, bearer: Optional[str]) -> int:
        """The tenant index of a request, as :class:`~fairlib.gateway.identity.Identity` names it
        (401, 403, 400 raised from there), then :meth:`tenant_index`."""
        return self.tenant_index(self.identity.who(headers, bearer or "").name)

    def tenant_index(self, fid: Optional[str]) -> int:
        """The index of the tenant named ``fid`` (:func:`~fairlib.gateway.identity.tenant_index`)."""
        return tenant_index(self.names, self.by_name, self.cfg, fid)

    def count_rejected(self, tenant: str, reason: str) -> None:
        """One request of ``tenant`` turned away for ``reason`` (REJECT_REASONS), in the metrics."""
        self.m_rejected.inc(1, (tenant, reason))

    def tenant_config(self, i: int):
        tt = self.cfg.tenants.tenants
        return tt[i] if i < len(tt) else None

    # --- slots ------------------------------------------------------------------------------
    def open_slots(self) -> int:
        """How many may be in flight now, as the policy counts them: the healthy upstreams' slots,
        plus what still runs on the others, plus the finished streams whose step has not closed
        (their slots are free upstream already; the policy sees them leave when the step closes),
        plus the parked requests (the policy counts them as running; they hold no upstream slot)."""
        return (sum(u.max_inflight if u.available else len(u.in_flight) for u in self.upstreams) + self.finishing
                + min(self.share.n_parked, self.cfg.slots))

    def _pick(self) -> Optional[Upstream]:
        best = None
        for u in self.upstreams:
            if u.available and u.free > 0 and (best is None or u.free > best.free):
                best = u
        return best

    # --- a request's life -------------------------------------------------------------------
    def submit(self, tenant: int, prompt_tokens: int, est_output_tokens: Optional[int], klass: int, priority: int,
               max_tokens: Optional[int] = None, category: Optional[str] = None,
               tier: Optional[str] = None) -> Pending:
        """Accept a request into its waiting line (``Rejected`` if it is turned away). With an
        estimator, ``category`` and ``tier`` give the estimate, and the budget it makes replaces
        ``est_output_tokens``."""
        name = self.tenant_name(tenant)
        if not any(u.available for u in self.upstreams):
            self.m_rejected.inc(1, (name, "no_upstream"))
            raise Rejected(503, "no_upstream", "no upstream takes requests: every upstream failed its health checks "
                                               "or is drained", self.cfg.health_interval_s)
        tc = self.tenant_config(tenant)
        cap = tc.max_queue if tc is not None and tc.max_queue is not None else self.cfg.max_queue
        if cap is not None and self.gate.waiting_of()[tenant] >= cap:
            self.m_rejected.inc(1, (name, "queue_full"))
            raise Rejected(429, "queue_full", f"tenant {name!r} has {cap} requests waiting (its queue cap)", 1.0)
        t_est = None
        if self.estimator is not None:
            assert category is not None and tier is not None    # GatewayApp.admit: describe()'s, with an estimator
            t_est, est_output_tokens = self.estimator.budget(category, tier, int(prompt_tokens))
        if est_output_tokens is None and self.policy_name == "token_pool":
            raise ParamError("the token pool reserves prompt + estimated output at admission: send max_tokens (or "
                             "est_output_tokens), or run the gateway with --estimator", "max_tokens")
        t = self.now_ms()
        rid, ok = self.gate.arrive(tenant, max(1, int(prompt_tokens)), t, est_output_tokens, klass, priority)
        if not ok:
            self.m_rejected.inc(1, (name, "policy"))
            ra = self.gate.retry_after_s(tenant, t)
            why = f"the policy {self.policy_name!r} turned the request away (tenant {name!r})"
            if ra is None and self.policy_name == "token_pool":
                why += ("; it reserves more than the pool could ever fund (its prompt and max_tokens or estimate "
                        "against the pool's horizon or KV): lower max_tokens, retrying will not help")
            raise Rejected(429, "policy", why, ra)
        p = Pending(rid, tenant, t, asyncio.get_running_loop().create_future(), max_tokens=max_tokens,
                    category=category, tier=tier, estimate=t_est)
        self.pending[rid] = p
        self.pump()
        return p

    def pump(self) -> None:
        """Fill the open slots in the policy's order: first the parked requests whose tenant has
        room again (fairlib/gateway/share.py), then those the policy admits now."""
        t = self.now_ms()
        if self.share.n_parked:
            ready = self.share.ready()
            for i, p in enumerate(ready):
                up = self._pick()
                if up is None:
                    for q in reversed(ready[i:]):
                        self.share.back(q)
                    break
                self._dispatch(p, up, t)
        parked = True
        while parked and self.gate.waiting:     # each parked request opens one more slot to the policy
            parked = self._admit(t)

    def _admit(self, t: float) -> bool:
        """One round of the policy's admissions; True if one of them was parked."""
        parked = False
        for rid in self.gate.admit(t, self.open_slots()):
            p = self.pending.get(rid)
            if p is not None and not p.future.done() and self.share.full(p.tenant):
                self.share.park(p)      # the policy counts it as running; it goes when its tenant has room
                parked = True
                continue
            up = self._pick()
            if p is None or p.future.done() or up is None:
                # its client left between acceptance and now, or no slot on a healthy upstream
                self.gate.withdraw(rid, t)
                self.pending.pop(rid, None)
                if p is not None and not p.future.done():
                    self.m_rejected.inc(1, (self.tenant_name(p.tenant), "no_upstream"))
                    p.future.set_exception(Rejected(503, "no_upstream", "no upstream slot is free", 1.0))
                continue
            self._dispatch(p, up, t)
        return parked

    def _dispatch(self, p: Pending, up: Upstream, t: float) -> None:
        rid = p.rid
        p.upstream, p.dispatched_ms = up, t
        up.in_flight.add(rid)
        up.dispatched += 1
        up.tracker.dispatched(rid, t)
        self.share.sent(rid, p.tenant)
        name = self.tenant_name(p.tenant)
        self.m_admitted.inc(1, (name,))
        self.m_prompt.inc(self.gate.request(rid)["prompt_tokens"], (name,))
        self.m_wait.observe((t - p.arrival_ms) / 1e3, (name,))
        p.future.set_result(up)

    def withdraw(self, p: Pending, reason: Optional[str] = None) -> None:
        """A waiting request leaves (client gone, queue timeout): out of its line."""
        if p.upstream is None:
            self.share.unpark(p)            # admitted but parked: the policy counted it as running
            self.gate.withdraw(p.rid, self.now_ms())
            self.pending.pop(p.rid, None)
            if reason:
                self.m_rejected.inc(1, (self.tenant_name(p.tenant), reason))
            if not p.future.done():
                p.future.cancel()

    def tokens(self, p: Pending, t_ms: float, k: int, finished: bool) -> None:
        """``k`` output tokens of ``p`` arrived at ``t_ms`` (one upstream read; ``finished``: its
        last). ``k`` below 1 (an upstream's odd usage count) counts as 1, so that every step the
        trackers hand the policy is well formed (its check is off: ``check_steps``)."""
        k = max(1, int(k))
        if p.counted == 0:
            p.first_ms = t_ms
            self.m_ttft.observe((t_ms - p.arrival_ms) / 1e3, (self.tenant_name(p.tenant),))
        p.counted += k
        if p.max_tokens is not None and p.counted >= p.max_tokens:
            finished = True
        up = p.sent_to
        newly = up.tracker.tokens(p.rid, t_ms, k, finished)
        self.m_output.inc(k, (self.tenant_name(p.tenant),))
        if newly:
            self._finishing(up, p.rid)
        self._arm(up)

    def _finishing(self, up: Upstream, rid: int) -> None:
        """A stream ended inside the open step: its upstream slot is free now (the next request
        goes at once, as an engine admits at its next iteration); the policy's batch still holds it
        until the step closes."""
        if rid in up.in_flight:
            up.in_flight.discard(rid)
            self.share.freed(rid)
            self.finishing += 1
            self.pump()

    def finish_seen(self, p: Pending, t_ms: float) -> None:
        """A chunk with ``finish_reason`` and no tokens (llama.cpp's last chunk): the stream ends."""
        up = p.sent_to
        if up.tracker.finish(p.rid, t_ms):
            self._finishing(up, p.rid)
        self._arm(up)

    def usage_tokens(self, p: Pending, total: int) -> None:
        """The answer's ``usage.completion_tokens``: tokens the chunks did not show are added to
        the request's entry in the open step (a chunk that carried several tokens)."""
        extra = int(total) - p.counted
        if extra > 0 and p.sent_to.tracker.add_tokens(p.rid, extra):
            p.counted += extra
            self.m_output.inc(extra, (self.tenant_name(p.tenant),))

    def answered(self, p: Pending, text: str, usage_tokens: Optional[int] = None) -> None:
        """``p``'s answer came back in full: the estimator learns from it (its tokens: the
        upstream's ``usage`` when it gave one, else those the stream showed)."""
        n = usage_tokens if isinstance(usage_tokens, int) and usage_tokens >= 0 else p.counted
        if self.estimator is not None and p.category is not None and n > 0:
            assert p.tier is not None       # submit() keeps describe()'s category and tier together
            self.estimator.finished(p.category, p.tier, n, text)

    def release(self, p: Pending) -> None:
        """The request's exchange with its upstream ended (normally, failed, or its client left)."""
        up = p.upstream
        self.pending.pop(p.rid, None)
        if up is None:
            self.withdraw(p)
            return
        if up.tracker.finish(p.rid, self.now_ms()):
            self._finishing(up, p.rid)
        self._arm(up)

    # --- steps ------------------------------------------------------------------------------
    def _on_step(self, up: Upstream, ids, toks, fin, dt, t) -> None:
        self.gate.observe(ids, toks, fin, dt, t, check=self.check_steps)
        self.m_steps.inc(1, (up.url,))
        freed = False
        for r, f in zip(ids, fin):
            if f:
                if r in up.in_flight:        # finished without passing through _finishing
                    up.in_flight.discard(r)
                    self.share.freed(r)
                else:
                    self.finishing -= 1
                freed = True
        if freed:
            self.pump()

    def _on_late(self, up: Upstream, rid: int) -> None:
        self.late_finishes += 1
        self.gate.withdraw(rid, self.now_ms())
        up.in_flight.discard(rid)
        self.share.freed(rid)
        self.pump()

    def _arm(self, up: Upstream) -> None:
        """A timer that closes the upstream's open step when its tolerance has passed."""
        d = up.tracker.deadline()
        if d is None or self._timers.get(up.index) is not None:
            return
        loop = asyncio.get_running_loop()
        self._timers[up.index] = loop.call_later(max(0.0, d - self.now_ms()) / 1e3 + 1e-4, self._fire, up)

    def _fire(self, up: Upstream) -> None:
        self._timers[up.index] = None
        up.tracker.poll(self.now_ms())
        self._arm(up)

    # --- upstream health --------------------------------------------------------------------
    def drain(self, index: object, drained: bool) -> None:
        """Take upstream ``index`` out (it gets no new request; those in it run to their end) or put
        it back: a replica removed from the pool and restored."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.upstreams):
            raise ValueError(f"upstream must be an index in 0..{len(self.upstreams) - 1}, got {index!r}")
        up = self.upstreams[index]
        if up.drained != bool(drained):
            up.drained = bool(drained)
            self.capacity_changed()
            self.pump()

    def capacity_changed(self) -> None:
        """A pool policy learns how many replicas take requests now."""
        self.gate.set_replicas(sum(u.available for u in self.upstreams), self.now_ms())

    # --- policy switching -------------------------------------------------------------------
    def idle(self) -> bool:
        return not self.pending and self.gate.in_flight == 0 and self.gate.waiting == 0

    def switch_policy(self, policy: str, params: Optional[dict] = None) -> None:
        """A new policy with fresh counters, a fresh estimator and an empty event log (only while idle)."""
        if not self.idle():
            raise RuntimeError(f"the gateway is not idle ({self.gate.in_flight} in flight, {self.gate.waiting} "
                               f"waiting): switch policies between runs")
        p = with_tenant_weights(policy, params, self.cfg.tenants, self.cfg.pool_defaults())
        self.gate = self._new_gate(policy, p)
        self.estimator = self._new_estimator()
        self.policy_name, self.policy_params = policy, p
        for up in self.upstreams:
            up.tracker = self._tracker(up)
        if any(not u.available for u in self.upstreams):
            self.capacity_changed()

    # --- state ------------------------------------------------------------------------------
    def state(self) -> dict:
        ts = self.gate.tenant_state()
        fn = getattr(self.gate.policy, "pool_state", None)
        if fn is not None:        # the pool's reservations and debts, brought to now
            ps = fn(self.gate.pf, self.gate.n_tenants, self.now_ms(), ts["waiting"])
            ts.update({"reserved_ms": ps["reserved_ms"], "debt_ms": ps["debt_ms"], "cap_ms": ps["cap_ms"]})
        n = len(self.names)
        tenants = {}
        for i in range(n):
            tenants[self.tenant_name(i)] = {k: (float(v[i]) if v.dtype.kind == "f" else int(v[i]))
                                            for k, v in ts.items()}
        try:        # the loop it runs on: "uvloop" or "asyncio" (--event-loop)
            loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
        except RuntimeError:
            loop = None
        return {"policy": self.policy_name, "policy_params": self.policy_params, "now_ms": self.now_ms(),
                "event_loop": loop,
                "t0_wall": self.t0_wall,
                "in_flight": self.gate.in_flight, "waiting": self.gate.waiting, "pending": len(self.pending),
                "parked": self.share.n_parked, "tenant_max_inflight": min(self.share.cap, self.cfg.slots),
                "finishing": self.finishing,
                "estimator": None if self.estimator is None else self.estimator.state(),
                "late_finishes": self.late_finishes,
                "replicas_available": sum(u.available for u in self.upstreams), "stopping": self.stopping,
                "upstreams": [{"url": u.url, "healthy": u.healthy, "drained": u.drained, "in_flight": len(u.in_flight),
                               "max_inflight": u.max_inflight, "dispatched": u.dispatched, "failures": u.failures,
                               "retried": u.retried, "broken": u.broken,
                               "steps": u.tracker.steps, "step_tol_ms": u.tracker.tol_ms,
                               "credit": None if u.credit is None else {**u.credit.state(), "source": u.credit_source,
                                                                        "scrape_errors": u.scrape_errors,
                                                                        "from_streams": u.from_streams}}
                              for u in self.upstreams],
                "tenants": tenants, "gate": self.gate.spec}

    def render_metrics(self, accept: Optional[str] = None) -> tuple:
        """``(body, content type)`` of ``/metrics`` for a scraper that sent ``Accept: accept``."""
        metrics.update(self)
        return self.registry.exposition(accept)
