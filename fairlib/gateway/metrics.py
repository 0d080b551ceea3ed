"""The gateway's ``/metrics``: its families (``fairlib_gateway_*``, on ``prometheus_client``
through fairlib/protocol/prometheus.py) and their update from the gateway's state at each scrape.

Units are base units: seconds (queue wait, TTFT, residency, a machine-time policy counter) and
tokens. Counters end in ``_total`` and are typed ``counter``. Per ``tenant``: admitted, rejected
(by ``reason``), prompt and output tokens, the residency charged (seconds of machine time: the
prefill price at admission, ``dt/B`` per observed decode step), requests waiting and in flight,
the policy's counter (``_tokens`` for vtc and lcf, weighted service tokens; ``_seconds`` for
residency's machine time and token_pool's debts; a ``policy`` label), the queue wait and the
time to the first token. Per ``upstream`` (its URL): in flight, healthy, the in-flight credit
(``max_inflight``, learned with ``--max-inflight auto``), decode steps rebuilt from the streams.
"""
from __future__ import annotations

from fairlib.protocol.prometheus import TTFT_BUCKETS, Counter, Gauge, Histogram, Registry

__all__ = ["QUEUE_WAIT_BUCKETS", "MetricFamilies", "build", "update"]

QUEUE_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
                      160.0, 640.0)


class MetricFamilies:
    """The attributes :func:`build` gives the gateway (its base class: declarations only)."""

    registry: Registry
    m_reject_reasons: tuple
    m_admitted: Counter
    m_rejected: Counter
    m_prompt: Counter
    m_output: Counter
    m_residency: Counter
    m_waiting: Gauge
    m_inflight: Gauge
    m_counter_tokens: Gauge
    m_counter_seconds: Gauge
    m_wait: Histogram
    m_ttft: Histogram
    m_up_inflight: Gauge
    m_up_healthy: Gauge
    m_up_credit: Gauge
    m_steps: Counter


def build(gw, reject_reasons=()) -> None:
    """The families, as the gateway's ``registry`` and ``m_*`` attributes (its call sites use them);
    ``reject_reasons``: the rejection counter's series each tenant has from its first scrape on, at 0."""
    r = gw.registry = Registry()
    gw.m_reject_reasons = tuple(reject_reasons)
    T, U = ("tenant",), ("upstream",)
    gw.m_admitted = r.add(Counter("fairlib_gateway_admitted", "Requests sent to an upstream", T))
    gw.m_rejected = r.add(Counter("fairlib_gateway_rejected", "Requests turned away, by reason", ("tenant", "reason")))
    gw.m_prompt = r.add(Counter("fairlib_gateway_prompt_tokens", "Prompt tokens of the admitted requests", T))
    gw.m_output = r.add(Counter("fairlib_gateway_output_tokens", "Output tokens streamed", T))
    gw.m_residency = r.add(Counter("fairlib_gateway_residency_seconds",
                                   "Machine time charged (seconds): prefill at admission, dt/B per observed step", T))
    gw.m_waiting = r.add(Gauge("fairlib_gateway_waiting", "Requests waiting in the gateway", T))
    gw.m_inflight = r.add(Gauge("fairlib_gateway_in_flight", "Requests in an upstream", T))
    gw.m_counter_tokens = r.add(Gauge("fairlib_gateway_policy_score_tokens",
                                      "The policy's per-tenant counter in weighted service tokens (vtc, lcf)",
                                      ("tenant", "policy")))
    gw.m_counter_seconds = r.add(Gauge("fairlib_gateway_policy_score_seconds",
                                       "The policy's per-tenant counter in machine seconds (residency: charged; "
                                       "token_pool: the debt)", ("tenant", "policy")))
    gw.m_wait = r.add(Histogram("fairlib_gateway_queue_wait_seconds", "Time from arrival to dispatch", T,
                                QUEUE_WAIT_BUCKETS))
    gw.m_ttft = r.add(Histogram("fairlib_gateway_time_to_first_token_seconds",
                                "Time from arrival at the gateway to the first token", T, TTFT_BUCKETS))
    gw.m_up_inflight = r.add(Gauge("fairlib_gateway_upstream_in_flight", "Requests in each upstream", U))
    gw.m_up_healthy = r.add(Gauge("fairlib_gateway_upstream_healthy", "1 if the upstream takes requests", U))
    gw.m_up_credit = r.add(Gauge("fairlib_gateway_upstream_credit", "Requests the gateway keeps in each upstream at "
                                 "most now (max_inflight; with --max-inflight auto the learned credit)", U))
    gw.m_steps = r.add(Counter("fairlib_gateway_upstream_steps", "Decode steps rebuilt from the streams", U))
    for up in gw.upstreams:
        gw.m_steps.touch((up.url,))


def update(gw) -> None:
    """The families that come from the gateway's state, brought to now (before each scrape)."""
    ts = gw.gate.tenant_state()
    policy = gw.gate.policy
    unit = getattr(policy, "counter_unit", None)
    counters = policy.counters(gw.gate.pf, gw.gate.n_tenants) if unit else None
    gw.m_counter_tokens.clear()
    gw.m_counter_seconds.clear()
    for i in range(len(gw.names)):
        name = (gw.tenant_name(i),)
        for why in gw.m_reject_reasons:
            gw.m_rejected.touch(name + (why,))
        for m in (gw.m_admitted, gw.m_prompt, gw.m_output):
            m.touch(name)
        gw.m_waiting.set(ts["waiting"][i], name)
        gw.m_inflight.set(ts["in_flight"][i], name)
        gw.m_residency.follow(float(ts["machine_ms"][i]) / 1e3, name)
        if counters is not None and i < len(counters):
            if unit == "ms":
                gw.m_counter_seconds.set(float(counters[i]) / 1e3, name + (policy.name,))
            else:
                gw.m_counter_tokens.set(float(counters[i]), name + (policy.name,))
    for u in gw.upstreams:
        gw.m_up_inflight.set(len(u.in_flight), (u.url,))
        gw.m_up_healthy.set(1.0 if u.healthy else 0.0, (u.url,))
        gw.m_up_credit.set(u.max_inflight, (u.url,))
