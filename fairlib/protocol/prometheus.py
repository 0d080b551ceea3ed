"""The metrics both fairlib servers expose, on ``prometheus_client`` (the registry and text format
vLLM's own metrics use): ``fairlib serve`` writes vLLM's names (``vllm:*``) and its own
(``fairlib_serve_*``), ``fairlib gateway`` its own (``fairlib_gateway_*``).

A thin layer keeps the servers' call sites short: ``Registry.add(Counter(name, help, labelnames))``
makes the ``prometheus_client`` metric in the server's own ``CollectorRegistry`` (never the
process-global one: a test runs several servers in one process); ``inc``/``set``/``observe`` take
the label values as one tuple; ``Counter.set_total`` moves a counter to a total kept elsewhere
(the engine model's counts), by incrementing it by the difference, so it stays a counter.
``Registry.exposition(accept)`` is what ``/metrics`` answers: the text ``prometheus_client``
writes and its content type (``choose_encoder``: the Prometheus text format 0.0.4, or OpenMetrics
when the scraper asks for it). Counters are written as ``<name>_total`` and typed ``counter``;
their ``_created`` samples are off, as in vLLM. Bucket bounds follow vLLM's
(``vllm/v1/metrics/loggers.py``) where it has them.
"""
from __future__ import annotations

import math
from typing import ClassVar, Iterable, Optional, Sequence, TypeVar

import prometheus_client
from prometheus_client import CollectorRegistry, exposition
from prometheus_client.metrics import MetricWrapperBase

__all__ = ["Counter", "Gauge", "Histogram", "Registry", "CONTENT_TYPE",
           "TTFT_BUCKETS", "ITL_BUCKETS", "REQUEST_LATENCY_BUCKETS", "ITERATION_TOKENS_BUCKETS", "LAG_BUCKETS"]

prometheus_client.disable_created_metrics()

#: the content type of the text format (what a scraper that asks for nothing in particular gets)
CONTENT_TYPE = exposition.CONTENT_TYPE_PLAIN_0_0_4

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
#: the server's own timing error (seconds late against the engine model's intended time)
LAG_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0)


class _Metric:
    """One family: its ``prometheus_client`` metric once added to a :class:`Registry`, and its
    children by label values (a dict: the hot path skips ``labels()``'s checks and lock)."""

    pc: ClassVar[type[MetricWrapperBase]]     # the prometheus_client class of a subclass's families

    def __init__(self, name: str, help_: str, labelnames: Sequence[str] = (), **kw):
        self.name, self.help, self.labelnames, self.kw = name, help_, tuple(labelnames), kw
        self._metric: Optional[MetricWrapperBase] = None
        self._children: dict = {}

    def bind(self, registry: CollectorRegistry) -> None:
        self._metric = self.pc(self.name, self.help, self.labelnames, registry=registry, **self.kw)

    @property
    def metric(self) -> MetricWrapperBase:
        """Its ``prometheus_client`` metric (a RuntimeError until it is added to a :class:`Registry`)."""
        if self._metric is None:
            raise RuntimeError(f"{self.name}: add it to a Registry before use (Registry.add)")
        return self._metric

    def child(self, labels: Optional[Sequence[str]]):
        key = labels if type(labels) is tuple else tuple(labels or ())
        c = self._children.get(key)
        if c is None:
            key = tuple(str(v) for v in key)
            if len(key) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {key}")
            c = self._children[key] = self.metric.labels(*key) if self.labelnames else self.metric
        return c

    def touch(self, labels: Optional[Sequence[str]] = None) -> None:
        """The series exists from now on, at 0 (as vLLM's labelled children do)."""
        self.child(labels)


class Counter(_Metric):
    """A count that only grows; written as ``<name>_total`` (a name given with ``_total`` keeps it once)."""

    pc = prometheus_client.Counter

    def __init__(self, name: str, help_: str, labelnames: Sequence[str] = ()):
        super().__init__(name, help_, labelnames)
        self._totals: dict = {}
        self._last: dict = {}

    def inc(self, amount: float = 1.0, labels: Optional[Sequence[str]] = None) -> None:
        key = labels if type(labels) is tuple else tuple(labels or ())
        self.child(key).inc(amount)
        self._totals[key] = self._totals.get(key, 0.0) + amount

    def set_total(self, value: float, labels: Optional[Sequence[str]] = None) -> None:
        """Move the counter to ``value``, a total kept by a monotone source (the engine's own counts)."""
        key = labels if type(labels) is tuple else tuple(labels or ())
        d = float(value) - self._totals.get(key, 0.0)
        if d < 0 or not math.isfinite(d):
            raise ValueError(f"{self.name}{key}: a counter cannot go from {self._totals.get(key, 0.0)} to {value}")
        self.inc(d, key)

    def follow(self, value: float, labels: Optional[Sequence[str]] = None) -> None:
        """Follow a source's running total that may restart from 0 (the gateway's policy counters
        after a policy switch): add its growth since the last reading, or all of it after a restart."""
        key = labels if type(labels) is tuple else tuple(labels or ())
        v = float(value)
        last = self._last.get(key, 0.0)
        self._last[key] = v
        d = v - last if v >= last else v
        if d > 0 and math.isfinite(d):
            self.inc(d, key)

    def value(self, labels: Optional[Sequence[str]] = None) -> float:
        return self._totals.get(labels if type(labels) is tuple else tuple(labels or ()), 0.0)


class Gauge(_Metric):
    pc = prometheus_client.Gauge

    def __init__(self, name: str, help_: str, labelnames: Sequence[str] = ()):
        super().__init__(name, help_, labelnames)
        self._values: dict = {}

    def set(self, value: float, labels: Optional[Sequence[str]] = None) -> None:
        key = labels if type(labels) is tuple else tuple(labels or ())
        self.child(key).set(float(value))
        self._values[key] = float(value)

    def value(self, labels: Optional[Sequence[str]] = None) -> float:
        return self._values.get(labels if type(labels) is tuple else tuple(labels or ()), 0.0)

    def clear(self) -> None:
        """Drop every series (those of tenants or upstreams that are gone)."""
        self.metric.clear()
        self._children.clear()
        self._values.clear()


class Histogram(_Metric):
    pc = prometheus_client.Histogram

    def __init__(self, name: str, help_: str, labelnames: Sequence[str] = (), buckets: Iterable[float] = ()):
        bs = tuple(sorted(float(b) for b in buckets)) or prometheus_client.Histogram.DEFAULT_BUCKETS
        super().__init__(name, help_, labelnames, buckets=bs)
        self.buckets = tuple(b for b in bs if b != math.inf)
        self._stats: dict = {}

    def observe(self, value: float, labels: Optional[Sequence[str]] = None) -> None:
        key = labels if type(labels) is tuple else tuple(labels or ())
        self.child(key).observe(value)
        s = self._stats.get(key)
        self._stats[key] = (1, float(value)) if s is None else (s[0] + 1, s[1] + value)

    def count(self, labels: Optional[Sequence[str]] = None) -> int:
        return self._stats.get(labels if type(labels) is tuple else tuple(labels or ()), (0, 0.0))[0]

    def total(self, labels: Optional[Sequence[str]] = None) -> float:
        return self._stats.get(labels if type(labels) is tuple else tuple(labels or ()), (0, 0.0))[1]


M = TypeVar("M", bound=_Metric)


class Registry:
    """A server's metrics: a ``prometheus_client.CollectorRegistry`` of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.metrics: list[_Metric] = []

    def add(self, metric: M) -> M:
        metric.bind(self.registry)
        self.metrics.append(metric)
        return metric

    def exposition(self, accept: Optional[str] = None) -> tuple:
        """``(body bytes, content type)`` for a scraper that sent ``Accept: accept``."""
        encoder, content_type = exposition.choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def render(self) -> str:
        """The Prometheus text format (0.0.4)."""
        return exposition.generate_latest(self.registry).decode("utf-8")
