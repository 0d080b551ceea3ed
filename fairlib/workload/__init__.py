"""Seeded multi-tenant workloads: length distributions, arrival processes, tenants, scenarios.

A :class:`Scenario` turns one run seed into a request table (the engine model's input,
book/engine-model.md). Every tenant and every purpose draws from its own stream,
``rng_for(seed, tenant_index, purpose)``, so the same seed gives a bitwise-identical table and
changing one tenant never changes another tenant's requests.

Units: times in milliseconds, rates in requests per second, lengths in tokens (int >= 1).

Modules: ``lengths`` (the length distributions), ``arrivals`` (the arrival processes), ``checks``
(the field checks); this one the tenants, the scenarios and their seeded streams.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple, Union

import numpy as np
import pandas as pd

from fairlib.sim.engine import Engine
from fairlib.sim.policies import POLICIES
from fairlib.workload.arrivals import Arrival, Gamma, OnOff, Periodic, Poisson
from fairlib.workload.checks import integer, number
from fairlib.workload.lengths import Constant, Empirical, Geometric, LengthDist, LogNormal, Uniform

__all__ = [
    "PURPOSES", "rng_for",
    "LengthDist", "Constant", "Geometric", "LogNormal", "Empirical", "Uniform",
    "Arrival", "Poisson", "Gamma", "Periodic", "OnOff",
    "TenantSpec", "Scenario", "REQUEST_COLUMNS",
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



# --- tenants and scenarios -----------------------------------------------------------------
_ARRIVAL_KINDS = ("poisson", "gamma")
_EST_OUTPUT = (None, "oracle", "mean")


@dataclass(frozen=True)
class TenantSpec:
    """One tenant's traffic in a scenario: its lengths, its arrival process and its offered load
    (what the gateway applies to a tenant is :class:`fairlib.gateway.config.TenantConfig`).

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
            raise ValueError(f"TenantSpec.name must be a non-empty string, got {self.name!r}")
        own = f"TenantSpec({self.name!r})"
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
        object.__setattr__(self, "burstiness", number(own, "burstiness", self.burstiness, low=0.0, strict=True))
        if self.burstiness != 1.0 and a != "gamma":
            raise ValueError(f"{own}.burstiness applies only to arrival='gamma' "
                             f"(got burstiness={self.burstiness} with arrival={a!r})")
        object.__setattr__(self, "rate_rps", number(own, "rate_rps", self.rate_rps, low=0.0, allow_none=True))
        object.__setattr__(self, "machine_ms_per_s",
                           number(own, "machine_ms_per_s", self.machine_ms_per_s, low=0.0, allow_none=True))
        given = [f for f in ("rate_rps", "machine_ms_per_s") if getattr(self, f) is not None]
        if isinstance(a, Arrival) and a.rate_rps is not None:
            given.append("arrival.rate_rps")
        if len(given) != 1:
            raise ValueError(f"{own}: give the offered load exactly once, as rate_rps or machine_ms_per_s "
                             f"(or an Arrival carrying rate_rps); got {given or 'none'}")
        if self.load_batch is not None:
            object.__setattr__(self, "load_batch", integer(own, "load_batch", self.load_batch, low=1))
        object.__setattr__(self, "klass", integer(own, "klass", self.klass))
        object.__setattr__(self, "priority", integer(own, "priority", self.priority))
        object.__setattr__(self, "weight", number(own, "weight", self.weight, low=0.0, strict=True))
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
        # __post_init__: the load is given exactly once, so here by an Arrival carrying its rate
        assert isinstance(self.arrival, Arrival) and self.arrival.rate_rps is not None
        return float(self.arrival.rate_rps)

    def arrival_process(self, engine: Engine) -> Arrival:
        """The arrival process with its rate resolved."""
        rate = self.resolved_rate_rps(engine)
        if self.arrival == "poisson":
            return Poisson(rate)
        if self.arrival == "gamma":
            return Gamma(rate, self.burstiness)
        assert isinstance(self.arrival, Arrival)
        return self.arrival.with_rate(rate)


@dataclass(frozen=True)
class Scenario:
    """Tenants on one engine for ``duration_s`` seconds; ``seed`` is the default run seed."""

    tenants: Tuple[TenantSpec, ...]
    engine: Engine = Engine()
    duration_s: float = 120.0
    name: str = ""
    description: str = ""
    seed: int = 0

    def __post_init__(self):
        ts = tuple(self.tenants) if not isinstance(self.tenants, TenantSpec) else (self.tenants,)
        if not ts or not all(isinstance(t, TenantSpec) for t in ts):
            raise ValueError("Scenario.tenants must be a non-empty sequence of TenantSpec")
        names = [t.name for t in ts]
        if len(set(names)) != len(names):
            raise ValueError(f"Scenario.tenants must have distinct names, got {names}")
        object.__setattr__(self, "tenants", ts)
        if not isinstance(self.engine, Engine):
            raise ValueError(f"Scenario.engine must be a fairlib.sim.engine.Engine, got {self.engine!r}")
        object.__setattr__(self, "duration_s", number("Scenario", "duration_s", self.duration_s, low=0.0, strict=True))
        object.__setattr__(self, "seed", integer("Scenario", "seed", self.seed, low=0))
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
        seed = self.seed if seed is None else integer("Scenario.requests", "seed", seed, low=0)
        duration_ms = 1000.0 * self.duration_s
        cols: dict = {c: [] for c in REQUEST_COLUMNS}
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
