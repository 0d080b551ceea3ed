"""Length distributions: what a tenant's prompt and output lengths (tokens, int >= 1) are drawn
from. Each ``sample(rng, n)`` gives ``n`` int64 lengths; ``mean`` is the distribution's mean."""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Tuple

import numpy as np

from fairlib.workload.checks import count, integer, number

__all__ = ["LengthDist", "Constant", "Geometric", "LogNormal", "Empirical", "Uniform"]


class LengthDist(ABC):
    """A distribution of token counts: ``sample(rng, n)`` gives ``n`` int64 values >= 1;
    ``mean`` is the nominal mean used to convert offered load into a request rate."""

    # a field of some distributions (Geometric, LogNormal), a property of the others (which mypy
    # flags as overriding a writeable attribute: ignored there)
    mean: float

    @abstractmethod
    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws, int64, each >= 1."""


@dataclass(frozen=True)
class Constant(LengthDist):
    """Always ``value`` tokens."""

    value: int

    def __post_init__(self):
        object.__setattr__(self, "value", integer("Constant", "value", self.value, low=1))

    @property
    def mean(self) -> float:  # type: ignore[override]
        return float(self.value)

    def sample(self, rng, n):
        return np.full(count(n), self.value, dtype=np.int64)


@dataclass(frozen=True)
class Geometric(LengthDist):
    """Geometric on 1, 2, ... with ``p = 1/mean`` (memoryless: each token ends the answer
    with probability p)."""

    mean: float

    def __post_init__(self):
        object.__setattr__(self, "mean", number("Geometric", "mean", self.mean, low=1.0))

    def sample(self, rng, n):
        return rng.geometric(1.0 / self.mean, size=count(n)).astype(np.int64)


@dataclass(frozen=True)
class LogNormal(LengthDist):
    """``round(exp(N(mu, sigma)))`` clipped to >= 1, with ``mu = ln(mean) - sigma**2/2`` so the
    continuous lognormal has mean ``mean``. Rounding and clipping move the realised mean slightly
    (upwards, for means near 1); ``mean`` stays the nominal value."""

    mean: float
    sigma: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "mean", number("LogNormal", "mean", self.mean, low=1.0))
        object.__setattr__(self, "sigma", number("LogNormal", "sigma", self.sigma, low=0.0))

    def sample(self, rng, n):
        mu = math.log(self.mean) - 0.5 * self.sigma ** 2
        x = np.rint(rng.lognormal(mu, self.sigma, size=count(n)))
        return np.maximum(x, 1).astype(np.int64)


@dataclass(frozen=True, repr=False)
class Empirical(LengthDist):
    """Draws with replacement from ``values`` (e.g. lengths from a public trace)."""

    values: Tuple[int, ...]
    _arr: np.ndarray = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self):
        try:
            arr = np.asarray(self.values)
        except Exception as e:  # pragma: no cover - ragged input
            raise ValueError(f"Empirical.values must be a 1-D sequence of integers >= 1: {e}") from None
        if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iuf" \
                or not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)) or np.any(arr < 1):
            raise ValueError("Empirical.values must be a non-empty 1-D sequence of integers >= 1")
        arr = arr.astype(np.int64)
        arr.setflags(write=False)
        object.__setattr__(self, "values", tuple(int(v) for v in arr))
        object.__setattr__(self, "_arr", arr)

    @property
    def mean(self) -> float:  # type: ignore[override]
        return float(self._arr.mean())

    def __repr__(self):
        return f"Empirical(<{self._arr.size} values, mean {self.mean:.4g}>)"

    def sample(self, rng, n):
        return self._arr[rng.integers(0, self._arr.size, size=count(n))]


@dataclass(frozen=True)
class Uniform(LengthDist):
    """Integers uniform on ``[low, high]`` (both included)."""

    low: int
    high: int

    def __post_init__(self):
        object.__setattr__(self, "low", integer("Uniform", "low", self.low, low=1))
        object.__setattr__(self, "high", integer("Uniform", "high", self.high, low=self.low))

    @property
    def mean(self) -> float:  # type: ignore[override]
        return 0.5 * (self.low + self.high)

    def sample(self, rng, n):
        return rng.integers(self.low, self.high, size=count(n), endpoint=True).astype(np.int64)
