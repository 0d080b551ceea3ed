"""Prometheus text exposition for ``fairlib serve``: vLLM's metric names, plus ``fairlib:*``.

A tiny registry (no dependency): counters, gauges and histograms keyed by their label values,
rendered in the Prometheus text format 0.0.4 the way ``prometheus_client`` writes it (``# HELP``,
``# TYPE``, ``_total`` counters, cumulative ``_bucket{le=...}`` lines, ``_sum``, ``_count``).
Bucket bounds follow vLLM's (``vllm/v1/metrics/loggers.py``) where it has them.
"""
from __future__ import annotations

import bisect
import math
from typing import Iterable, Optional, Sequence

__all__ = ["Counter", "Gauge", "Histogram", "Registry", "fmt_value",
           "TTFT_BUCKETS", "ITL_BUCKETS", "REQUEST_LATENCY_BUCKETS", "ITERATION_TOKENS_BUCKETS", "LAG_BUCKETS"]

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
#: the server's own timing error (seconds late against the engine model's intended time)
LAG_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0)


def fmt_value(v: float) -> str:
    """A sample value as prometheus_client writes it (``+Inf``, ``NaN``, Python repr otherwise)."""
    v = float(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def _escape(s: str) -> str:
    return str(s).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help_: str, labelnames: Sequence[str] = ()):
        self.name, self.help, self.labelnames = name, help_, tuple(labelnames)
        self._series: dict = {}

    def _key(self, labels: Optional[Sequence[str]]) -> tuple:
        if type(labels) is tuple and len(labels) == len(self.labelnames) \
                and all(type(v) is str for v in labels):
            return labels  # the hot path: the driver passes tuples of strings
        key = tuple(str(v) for v in (labels or ()))
        if len(key) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {key}")
        return key

    def header(self, base: str) -> list:
        return [f"# HELP {base} {self.help}", f"# TYPE {base} {self.kind}"]


class Counter(_Metric):
    """A monotonically increasing count; rendered as ``<name>_total``."""

    kind = "counter"

    def inc(self, amount: float = 1.0, labels: Optional[Sequence[str]] = None) -> None:
        k = self._key(labels)
        self._series[k] = self._series.get(k, 0.0) + amount

    def set_total(self, value: float, labels: Optional[Sequence[str]] = None) -> None:
        """Set from a source of truth that is itself monotone (e.g. the engine's own counts)."""
        self._series[self._key(labels)] = float(value)

    def value(self, labels: Optional[Sequence[str]] = None) -> float:
        return self._series.get(self._key(labels), 0.0)

    def render(self) -> list:
        base = self.name[:-6] if self.name.endswith("_total") else self.name
        out = self.header(base)
        for k, v in sorted(self._series.items()):
            out.append(f"{base}_total{_labels(self.labelnames, k)} {fmt_value(v)}")
        return out


class Gauge(_Metric):
    kind = "gauge"

    def set(self, value: float, labels: Optional[Sequence[str]] = None) -> None:
        self._series[self._key(labels)] = float(value)

    def value(self, labels: Optional[Sequence[str]] = None) -> float:
        return self._series.get(self._key(labels), 0.0)

    def render(self) -> list:
        out = self.header(self.name)
        for k, v in sorted(self._series.items()):
            out.append(f"{self.name}{_labels(self.labelnames, k)} {fmt_value(v)}")
        return out


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, help_: str, labelnames: Sequence[str] = (), buckets: Iterable[float] = ()):
        super().__init__(name, help_, labelnames)
        self.buckets = tuple(sorted(float(b) for b in buckets))

    def _get(self, labels) -> list:
        k = self._key(labels)
        s = self._series.get(k)
        if s is None:
            s = self._series[k] = [[0] * (len(self.buckets) + 1), 0.0, 0]  # per-bucket counts, sum, count
        return s

    def observe(self, value: float, labels: Optional[Sequence[str]] = None) -> None:
        s = self._get(labels)
        s[0][bisect.bisect_left(self.buckets, value)] += 1
        s[1] += value
        s[2] += 1

    def count(self, labels: Optional[Sequence[str]] = None) -> int:
        s = self._series.get(self._key(labels))
        return 0 if s is None else s[2]

    def total(self, labels: Optional[Sequence[str]] = None) -> float:
        s = self._series.get(self._key(labels))
        return 0.0 if s is None else s[1]

    def render(self) -> list:
        out = self.header(self.name)
        for k, (counts, total, n) in sorted(self._series.items()):
            acc = 0
            for b, c in zip(self.buckets + (math.inf,), counts):
                acc += c
                le = 'le="' + fmt_value(b) + '"'
                out.append(f"{self.name}_bucket{_labels(self.labelnames, k, le)} {fmt_value(acc)}")
            out.append(f"{self.name}_sum{_labels(self.labelnames, k)} {fmt_value(total)}")
            out.append(f"{self.name}_count{_labels(self.labelnames, k)} {fmt_value(n)}")
        return out


class Registry:
    def __init__(self):
        self.metrics: list = []

    def add(self, metric):
        self.metrics.append(metric)
        return metric

    def render(self) -> str:
        lines = []
        for m in self.metrics:
            lines.extend(m.render())
        return "\n".join(lines) + "\n"
