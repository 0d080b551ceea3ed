"""Open-loop arrival processes: when a tenant's requests are sent. ``times(rng, duration_ms)`` gives
sorted float64 times (ms) in ``[0, duration_ms)`` at the long-run mean rate ``rate_rps``."""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from fairlib.workload.checks import number

__all__ = ["Arrival", "Poisson", "Gamma", "Periodic", "OnOff", "renewal", "rate_field"]


class Arrival(ABC):
    """An open-loop arrival process. ``rate_rps`` is the long-run mean rate (requests/s); it may
    be left ``None`` and set later with :meth:`with_rate` (a :class:`TenantSpec` does this).
    ``times(rng, duration_ms)`` gives sorted float64 times in ``[0, duration_ms)``."""

    rate_rps: Optional[float]

    def with_rate(self, rate_rps: float) -> "Arrival":
        return replace(self, rate_rps=rate_rps)  # type: ignore[type-var]  # every Arrival is a dataclass

    def _rate(self) -> float:
        if self.rate_rps is None:
            raise ValueError(f"{type(self).__name__}.rate_rps is not set (give a rate, or use with_rate)")
        return self.rate_rps

    def times(self, rng: np.random.Generator, duration_ms: float) -> np.ndarray:
        horizon = number(type(self).__name__, "duration_ms", duration_ms, low=0.0)
        rate = self._rate()
        if rate == 0 or horizon == 0:
            return np.empty(0, dtype=np.float64)
        return self._times(rng, rate, horizon)

    @abstractmethod
    def _times(self, rng, rate, duration_ms):
        """Sorted arrival times in [0, duration_ms) at `rate` requests/s."""


def renewal(rng, draw_gaps, mean_gap_ms: float, horizon_ms: float) -> np.ndarray:
    """Times of a renewal process (cumulative gaps) in ``[0, horizon_ms)``, drawn in chunks."""
    expected = horizon_ms / mean_gap_ms
    chunk = int(expected + 6.0 * math.sqrt(expected) + 16)
    parts, t = [], 0.0
    while True:
        ts = t + np.cumsum(draw_gaps(chunk))
        parts.append(ts)
        if ts[-1] >= horizon_ms:
            break
        t = float(ts[-1])
    out = np.concatenate(parts)
    return out[out < horizon_ms]


def rate_field(owner, v):
    """A process's ``rate_rps``: None (set later) or a finite number >= 0."""
    return number(owner, "rate_rps", v, low=0.0, allow_none=True)


@dataclass(frozen=True)
class Poisson(Arrival):
    """Exponential gaps with mean ``1000/rate_rps`` ms."""

    rate_rps: Optional[float] = None

    def __post_init__(self):
        object.__setattr__(self, "rate_rps", rate_field("Poisson", self.rate_rps))

    def _times(self, rng, rate, duration_ms):
        gap = 1000.0 / rate
        return renewal(rng, lambda k: rng.exponential(gap, size=k), gap, duration_ms)


@dataclass(frozen=True)
class Gamma(Arrival):
    """Gamma gaps, shape ``burstiness``, scale ``1/(rate*burstiness)`` (vLLM bench): mean gap
    ``1/rate``, coefficient of variation ``1/sqrt(burstiness)``. ``burstiness`` 1 is Poisson;
    below 1 is burstier, above 1 more regular."""

    rate_rps: Optional[float] = None
    burstiness: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "rate_rps", rate_field("Gamma", self.rate_rps))
        object.__setattr__(self, "burstiness", number("Gamma", "burstiness", self.burstiness, low=0.0, strict=True))

    def _times(self, rng, rate, duration_ms):
        gap = 1000.0 / rate
        k = self.burstiness
        return renewal(rng, lambda m: rng.gamma(k, gap / k, size=m), gap, duration_ms)


@dataclass(frozen=True)
class Periodic(Arrival):
    """Deterministic: one request every ``1000/rate_rps`` ms, the first at ``offset_ms``
    (the rng is not used)."""

    rate_rps: Optional[float] = None
    offset_ms: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "rate_rps", rate_field("Periodic", self.rate_rps))
        object.__setattr__(self, "offset_ms", number("Periodic", "offset_ms", self.offset_ms, low=0.0))

    def _times(self, rng, rate, duration_ms):
        gap = 1000.0 / rate
        n = max(0, math.ceil((duration_ms - self.offset_ms) / gap))
        t = self.offset_ms + gap * np.arange(n + 1, dtype=np.float64)
        return t[t < duration_ms]


@dataclass(frozen=True)
class OnOff(Arrival):
    """Bursts: on for ``on_s`` seconds, off for ``off_s``, repeating from an on-window at t=0.
    ``rate_rps`` is the long-run mean; inside on-windows arrivals are Poisson at the peak rate
    ``rate_rps * (on_s + off_s) / on_s``, none while off."""

    rate_rps: Optional[float] = None
    on_s: float = 1.0
    off_s: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "rate_rps", rate_field("OnOff", self.rate_rps))
        object.__setattr__(self, "on_s", number("OnOff", "on_s", self.on_s, low=0.0, strict=True))
        object.__setattr__(self, "off_s", number("OnOff", "off_s", self.off_s, low=0.0))

    @property
    def peak_rps(self) -> float:
        return self._rate() * (self.on_s + self.off_s) / self.on_s

    def _times(self, rng, rate, duration_ms):
        on, cycle = 1000.0 * self.on_s, 1000.0 * (self.on_s + self.off_s)
        full, rem = divmod(duration_ms, cycle)
        on_time = full * on + min(rem, on)  # total on-time inside [0, duration)
        tau = Poisson(self.peak_rps).times(rng, on_time)  # arrivals on the on-time axis
        k, within = np.divmod(tau, on)
        t = k * cycle + within
        return t[t < duration_ms]
