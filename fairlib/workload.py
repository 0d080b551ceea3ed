"""Seeded multi-tenant workloads: length distributions, arrival processes, tenants, scenarios.

A :class:`Scenario` turns one run seed into a request table (the engine model's input,
book/engine-model.md). Every tenant and every purpose draws from its own stream,
``rng_for(seed, tenant_index, purpose)``, so the same seed gives a bitwise-identical table and
changing one tenant never changes another tenant's requests.

Units: times in milliseconds, rates in requests per second, lengths in tokens (int >= 1).
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Mapping, Optional, Tuple, Union

import numpy as np
import pandas as pd

from fairlib.sim.engine import Engine
from fairlib.sim.policies import POLICIES

__all__ = [
    "PURPOSES", "rng_for",
    "LengthDist", "Constant", "Geometric", "LogNormal", "Empirical", "Uniform",
    "Arrival", "Poisson", "Gamma", "Periodic", "OnOff",
    "Tenant", "Scenario", "REQUEST_COLUMNS",
]

#: Stream codes: ``SeedSequence([seed, tenant_index, PURPOSES[purpose]])``.
#: "content" is reserved for prompt text (the http backend); the simulator needs no text.
PURPOSES = {"arrivals": 0, "prompt": 1, "output": 2, "content": 3}

#: Columns of :meth:`Scenario.requests`, in order.
REQUEST_COLUMNS = ("arrival_ms", "tenant", "prompt_tokens", "output_tokens",
                   "est_output_tokens", "klass", "priority")


def rng_for(seed: int, tenant_index: int, purpose: str) -> np.random.Generator:
    """The independent stream of one tenant and one purpose:
    ``default_rng(SeedSequence([seed, tenant_index, PURPOSES[purpose]]))``."""
    if purpose not in PURPOSES:
        raise ValueError(f"rng_for: purpose must be one of {sorted(PURPOSES)}, got {purpose!r}")
    for name, v in (("seed", seed), ("tenant_index", tenant_index)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"rng_for: {name} must be an integer >= 0, got {v!r}")
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(tenant_index), PURPOSES[purpose]]))


# --- validation helpers --------------------------------------------------------------------
def _number(owner: str, name: str, v, *, low: float = -math.inf, strict: bool = False,
            allow_none: bool = False) -> Optional[float]:
    if v is None and allow_none:
        return None
    ok = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
    if not ok or not math.isfinite(v) or (v <= low if strict else v < low):
        rel = ">" if strict else ">="
        raise ValueError(f"{owner}.{name} must be a finite number {rel} {low:g}, got {v!r}")
    return float(v)


def _integer(owner: str, name: str, v, *, low: Optional[int] = None) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer, float, np.floating)) \
            or not math.isfinite(v) or not float(v).is_integer() or (low is not None and v < low):
        rel = f" >= {low}" if low is not None else ""
        raise ValueError(f"{owner}.{name} must be an integer{rel}, got {v!r}")
    return int(v)


def _count(n) -> int:
    return _integer("sample", "n", n, low=0)


# --- length distributions ------------------------------------------------------------------
class LengthDist(ABC):
    """A distribution of token counts: ``sample(rng, n)`` gives ``n`` int64 values >= 1;
    ``mean`` is the nominal mean used to convert offered load into a request rate."""

    mean: float

    @abstractmethod
    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws, int64, each >= 1."""


@dataclass(frozen=True)
class Constant(LengthDist):
    """Always ``value`` tokens."""

    value: int

    def __post_init__(self):
        object.__setattr__(self, "value", _integer("Constant", "value", self.value, low=1))

    @property
    def mean(self) -> float:
        return float(self.value)

    def sample(self, rng, n):
        return np.full(_count(n), self.value, dtype=np.int64)


@dataclass(frozen=True)
class Geometric(LengthDist):
    """Geometric on 1, 2, ... with ``p = 1/mean`` (memoryless: each token ends the answer
    with probability p)."""

    mean: float

    def __post_init__(self):
        object.__setattr__(self, "mean", _number("Geometric", "mean", self.mean, low=1.0))

    def sample(self, rng, n):
        return rng.geometric(1.0 / self.mean, size=_count(n)).astype(np.int64)


@dataclass(frozen=True)
class LogNormal(LengthDist):
    """``round(exp(N(mu, sigma)))`` clipped to >= 1, with ``mu = ln(mean) - sigma**2/2`` so the
    continuous lognormal has mean ``mean``. Rounding and clipping move the realised mean slightly
    (upwards, for means near 1); ``mean`` stays the nominal value."""

    mean: float
    sigma: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "mean", _number("LogNormal", "mean", self.mean, low=1.0))
        object.__setattr__(self, "sigma", _number("LogNormal", "sigma", self.sigma, low=0.0))

    def sample(self, rng, n):
        mu = math.log(self.mean) - 0.5 * self.sigma ** 2
        x = np.rint(rng.lognormal(mu, self.sigma, size=_count(n)))
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
    def mean(self) -> float:
        return float(self._arr.mean())

    def __repr__(self):
        return f"Empirical(<{self._arr.size} values, mean {self.mean:.4g}>)"

    def sample(self, rng, n):
        return self._arr[rng.integers(0, self._arr.size, size=_count(n))]


@dataclass(frozen=True)
class Uniform(LengthDist):
    """Integers uniform on ``[low, high]`` (both included)."""

    low: int
    high: int

    def __post_init__(self):
        object.__setattr__(self, "low", _integer("Uniform", "low", self.low, low=1))
        object.__setattr__(self, "high", _integer("Uniform", "high", self.high, low=self.low))

    @property
    def mean(self) -> float:
        return 0.5 * (self.low + self.high)

    def sample(self, rng, n):
        return rng.integers(self.low, self.high, size=_count(n), endpoint=True).astype(np.int64)


# --- arrival processes ---------------------------------------------------------------------
class Arrival(ABC):
    """An open-loop arrival process. ``rate_rps`` is the long-run mean rate (requests/s); it may
    be left ``None`` and set later with :meth:`with_rate` (a :class:`Tenant` does this).
    ``times(rng, duration_ms)`` gives sorted float64 times in ``[0, duration_ms)``."""

    rate_rps: Optional[float]

    def with_rate(self, rate_rps: float) -> "Arrival":
        return replace(self, rate_rps=rate_rps)

    def _rate(self) -> float:
        if self.rate_rps is None:
            raise ValueError(f"{type(self).__name__}.rate_rps is not set (give a rate, or use with_rate)")
        return self.rate_rps

    def times(self, rng: np.random.Generator, duration_ms: float) -> np.ndarray:
        duration_ms = _number(type(self).__name__, "duration_ms", duration_ms, low=0.0)
        rate = self._rate()
        if rate == 0 or duration_ms == 0:
            return np.empty(0, dtype=np.float64)
        return self._times(rng, rate, duration_ms)

    @abstractmethod
    def _times(self, rng, rate, duration_ms):
        """Sorted arrival times in [0, duration_ms) at `rate` requests/s."""


def _renewal(rng, draw_gaps, mean_gap_ms: float, horizon_ms: float) -> np.ndarray:
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


def _rate_field(owner, v):
    return _number(owner, "rate_rps", v, low=0.0, allow_none=True)


@dataclass(frozen=True)
class Poisson(Arrival):
    """Exponential gaps with mean ``1000/rate_rps`` ms."""

    rate_rps: Optional[float] = None

    def __post_init__(self):
        object.__setattr__(self, "rate_rps", _rate_field("Poisson", self.rate_rps))

    def _times(self, rng, rate, duration_ms):
        gap = 1000.0 / rate
        return _renewal(rng, lambda k: rng.exponential(gap, size=k), gap, duration_ms)


@dataclass(frozen=True)
class Gamma(Arrival):
    """Gamma gaps, shape ``burstiness``, scale ``1/(rate*burstiness)`` (vLLM bench): mean gap
    ``1/rate``, coefficient of variation ``1/sqrt(burstiness)``. ``burstiness`` 1 is Poisson;
    below 1 is burstier, above 1 more regular."""

    rate_rps: Optional[float] = None
    burstiness: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "rate_rps", _rate_field("Gamma", self.rate_rps))
        object.__setattr__(self, "burstiness", _number("Gamma", "burstiness", self.burstiness, low=0.0, strict=True))

    def _times(self, rng, rate, duration_ms):
        gap = 1000.0 / rate
        k = self.burstiness
        return _renewal(rng, lambda m: rng.gamma(k, gap / k, size=m), gap, duration_ms)


@dataclass(frozen=True)
class Periodic(Arrival):
    """Deterministic: one request every ``1000/rate_rps`` ms, the first at ``offset_ms``
    (the rng is not used)."""

    rate_rps: Optional[float] = None
    offset_ms: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "rate_rps", _rate_field("Periodic", self.rate_rps))
        object.__setattr__(self, "offset_ms", _number("Periodic", "offset_ms", self.offset_ms, low=0.0))

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
        object.__setattr__(self, "rate_rps", _rate_field("OnOff", self.rate_rps))
        object.__setattr__(self, "on_s", _number("OnOff", "on_s", self.on_s, low=0.0, strict=True))
        object.__setattr__(self, "off_s", _number("OnOff", "off_s", self.off_s, low=0.0))

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


# --- tenants and scenarios -----------------------------------------------------------------
_ARRIVAL_KINDS = ("poisson", "gamma")
_EST_OUTPUT = (None, "oracle", "mean")


@dataclass(frozen=True)
class Tenant:
    """One tenant: its lengths, its arrival process and its offered load.

    Give the load as exactly one of ``rate_rps`` (requests/s) or ``machine_ms_per_s`` (ms of
    machine per second, converted with ``rate = machine_ms_per_s /
    engine.request_cost_ms(prompt.mean, output.mean, load_batch)``, ``load_batch`` defaulting
    to the engine's ``max_batch``), or neither when ``arrival`` is an :class:`Arrival` that
    carries its own rate. ``arrival`` is ``"poisson"``, ``"gamma"`` (with ``burstiness``) or an
    :class:`Arrival`. ``est_output`` fills ``est_output_tokens``: ``None`` or ``"mean"`` =
    ``round(output.mean)`` (an uninformed estimate), ``"oracle"`` = the realised length.
    An int for ``prompt``/``output`` means :class:`Constant`.
    """

    name: str
    output: LengthDist
    prompt: LengthDist
    arrival: Union[str, Arrival] = "poisson"
    burstiness: float = 1.0
    rate_rps: Optional[float] = None
    machine_ms_per_s: Optional[float] = None
    load_batch: Optional[int] = None
    klass: int = 0
    priority: int = 0
    weight: float = 1.0
    est_output: Optional[str] = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Tenant.name must be a non-empty string, got {self.name!r}")
        own = f"Tenant({self.name!r})"
        for fname in ("output", "prompt"):
            v = getattr(self, fname)
            if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
                object.__setattr__(self, fname, Constant(v))
            elif not isinstance(v, LengthDist):
                raise ValueError(f"{own}.{fname} must be a LengthDist (Constant, Geometric, LogNormal, "
                                 f"Empirical, Uniform) or an int, got {v!r}")
        a = self.arrival
        if isinstance(a, str):
            if a not in _ARRIVAL_KINDS:
                raise ValueError(f"{own}.arrival must be one of {_ARRIVAL_KINDS} or an Arrival, got {a!r}")
        elif not isinstance(a, Arrival):
            raise ValueError(f"{own}.arrival must be one of {_ARRIVAL_KINDS} or an Arrival, got {a!r}")
        object.__setattr__(self, "burstiness", _number(own, "burstiness", self.burstiness, low=0.0, strict=True))
        if self.burstiness != 1.0 and a != "gamma":
            raise ValueError(f"{own}.burstiness applies only to arrival='gamma' "
                             f"(got burstiness={self.burstiness} with arrival={a!r})")
        object.__setattr__(self, "rate_rps", _number(own, "rate_rps", self.rate_rps, low=0.0, allow_none=True))
        object.__setattr__(self, "machine_ms_per_s",
                           _number(own, "machine_ms_per_s", self.machine_ms_per_s, low=0.0, allow_none=True))
        given = [f for f in ("rate_rps", "machine_ms_per_s") if getattr(self, f) is not None]
        if isinstance(a, Arrival) and a.rate_rps is not None:
            given.append("arrival.rate_rps")
        if len(given) != 1:
            raise ValueError(f"{own}: give the offered load exactly once, as rate_rps or machine_ms_per_s "
                             f"(or an Arrival carrying rate_rps); got {given or 'none'}")
        if self.load_batch is not None:
            object.__setattr__(self, "load_batch", _integer(own, "load_batch", self.load_batch, low=1))
        object.__setattr__(self, "klass", _integer(own, "klass", self.klass))
        object.__setattr__(self, "priority", _integer(own, "priority", self.priority))
        object.__setattr__(self, "weight", _number(own, "weight", self.weight, low=0.0, strict=True))
        if self.est_output not in _EST_OUTPUT:
            raise ValueError(f"{own}.est_output must be one of {_EST_OUTPUT}, got {self.est_output!r}")

    def mean_request_cost_ms(self, engine: Engine) -> float:
        """Machine ms of the mean request at ``load_batch`` (default ``engine.max_batch``)."""
        return float(engine.request_cost_ms(self.prompt.mean, self.output.mean, self.load_batch))

    def resolved_rate_rps(self, engine: Engine) -> float:
        """The request rate, converting ``machine_ms_per_s`` on ``engine`` when given that way."""
        if self.rate_rps is not None:
            return self.rate_rps
        if self.machine_ms_per_s is not None:
            return self.machine_ms_per_s / self.mean_request_cost_ms(engine)
        return float(self.arrival.rate_rps)

    def arrival_process(self, engine: Engine) -> Arrival:
        """The arrival process with its rate resolved."""
        rate = self.resolved_rate_rps(engine)
        if self.arrival == "poisson":
            return Poisson(rate)
        if self.arrival == "gamma":
            return Gamma(rate, self.burstiness)
        return self.arrival.with_rate(rate)


@dataclass(frozen=True)
class Scenario:
    """Tenants on one engine for ``duration_s`` seconds; ``seed`` is the default run seed."""

    tenants: Tuple[Tenant, ...]
    engine: Engine = Engine()
    duration_s: float = 120.0
    name: str = ""
    description: str = ""
    seed: int = 0

    def __post_init__(self):
        ts = tuple(self.tenants) if not isinstance(self.tenants, Tenant) else (self.tenants,)
        if not ts or not all(isinstance(t, Tenant) for t in ts):
            raise ValueError("Scenario.tenants must be a non-empty sequence of Tenant")
        names = [t.name for t in ts]
        if len(set(names)) != len(names):
            raise ValueError(f"Scenario.tenants must have distinct names, got {names}")
        object.__setattr__(self, "tenants", ts)
        if not isinstance(self.engine, Engine):
            raise ValueError(f"Scenario.engine must be a fairlib.sim.engine.Engine, got {self.engine!r}")
        object.__setattr__(self, "duration_s", _number("Scenario", "duration_s", self.duration_s, low=0.0, strict=True))
        object.__setattr__(self, "seed", _integer("Scenario", "seed", self.seed, low=0))
        self.rates_rps()  # surface conversion errors now

    @property
    def tenant_names(self) -> Tuple[str, ...]:
        return tuple(t.name for t in self.tenants)

    @property
    def weights(self) -> np.ndarray:
        return np.array([t.weight for t in self.tenants], dtype=np.float64)

    def policy_params(self, policy: str, params: Mapping) -> dict:
        """``params`` for ``policy`` with the tenants' weights filled in where the policy takes
        weights and ``params`` gives none: a per-tenant ``weights`` parameter (vtc, lcf, residency,
        vtc_predict) gets ``[t.weight for t in tenants]``; ``weighted``'s per-class ``w`` gets
        ``w[k]`` = the weight of class ``k``'s tenants (they must agree, and be an integer: it
        counts turns in the rotation; 0 for a class no tenant is in). When every weight is 1 (the
        default) nothing is filled in: the per-tenant policies then weigh tenants equally by their
        own default, and ``weighted`` still needs its ``w`` from ``params``."""
        out = dict(params)
        cls = POLICIES.get(policy) if isinstance(policy, str) else None
        if cls is None or all(t.weight == 1.0 for t in self.tenants):
            return out
        if "weights" in cls.params and "weights" not in out:
            out["weights"] = [t.weight for t in self.tenants]
        elif "w" in cls.params and "w" not in out:
            w = [0] * (max(t.klass for t in self.tenants) + 1)
            for k in range(len(w)):
                mine = [t for t in self.tenants if t.klass == k]
                if any(t.weight != mine[0].weight for t in mine):
                    raise ValueError(f"policy {policy!r} weighs classes: class {k} holds tenants with different "
                                     f"weights ({', '.join(f'{t.name}={t.weight:g}' for t in mine)}); give each "
                                     f"its own klass, or the class weights as policy_params w")
                if mine and not float(mine[0].weight).is_integer():
                    raise ValueError(f"policy {policy!r} takes integer class weights (turns in its rotation): "
                                     f"tenant {mine[0].name!r} has weight {mine[0].weight:g}; give policy_params w")
                w[k] = int(mine[0].weight) if mine else 0
            out["w"] = w
        return out

    def rates_rps(self) -> np.ndarray:
        """Each tenant's resolved request rate (requests/s)."""
        return np.array([t.resolved_rate_rps(self.engine) for t in self.tenants], dtype=np.float64)

    def offered_ms_per_s(self) -> np.ndarray:
        """Each tenant's offered machine ms per second: rate x cost of its mean request."""
        return np.array([t.resolved_rate_rps(self.engine) * t.mean_request_cost_ms(self.engine)
                         for t in self.tenants], dtype=np.float64)

    def requests(self, seed: Optional[int] = None) -> pd.DataFrame:
        """The request table for ``seed`` (default ``self.seed``): columns ``REQUEST_COLUMNS``,
        sorted by ``arrival_ms`` with a stable merge (ties ordered by tenant index)."""
        seed = self.seed if seed is None else _integer("Scenario.requests", "seed", seed, low=0)
        duration_ms = 1000.0 * self.duration_s
        cols = {c: [] for c in REQUEST_COLUMNS}
        for i, t in enumerate(self.tenants):
            times = t.arrival_process(self.engine).times(rng_for(seed, i, "arrivals"), duration_ms)
            n = times.size
            out = t.output.sample(rng_for(seed, i, "output"), n)
            if t.est_output == "oracle":
                est = out.copy()
            else:
                est = np.full(n, max(1, int(math.floor(t.output.mean + 0.5))), dtype=np.int64)
            cols["arrival_ms"].append(times)
            cols["tenant"].append(np.full(n, i, dtype=np.int64))
            cols["prompt_tokens"].append(t.prompt.sample(rng_for(seed, i, "prompt"), n))
            cols["output_tokens"].append(out)
            cols["est_output_tokens"].append(est)
            cols["klass"].append(np.full(n, t.klass, dtype=np.int64))
            cols["priority"].append(np.full(n, t.priority, dtype=np.int64))
        arr = {c: np.concatenate(v) for c, v in cols.items()}
        order = np.argsort(arr["arrival_ms"], kind="stable")
        df = pd.DataFrame({c: arr[c][order].astype(np.float64 if c == "arrival_ms" else np.int64)
                           for c in REQUEST_COLUMNS})
        return df
