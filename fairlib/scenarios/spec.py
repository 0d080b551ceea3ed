"""A loaded scenario (:class:`ScenarioSpec`), its tenants' latency promises (:class:`SLO`), the
replica's capacity for one request shape (:func:`engine_capacity_rps`) and the rule for names."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Mapping, NamedTuple, Optional, Tuple

import numpy as np

from fairlib.sim.engine import Engine
from fairlib.workload import Scenario

__all__ = ["SLO", "ScenarioSpec", "engine_capacity_rps", "check_name", "NAME_RULE", "is_plain_name"]

_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]+")
NAME_RULE = "a plain name: letters, digits, '_', '.' and '-' only (no path separators), not '.' or '..'"


def is_plain_name(name) -> bool:
    """Whether ``name`` follows :data:`NAME_RULE`."""
    return isinstance(name, str) and bool(_PLAIN_NAME.fullmatch(name)) and name not in (".", "..")


def check_name(name, field: str = "name") -> str:
    """``name`` when it is a plain scenario name (it becomes a directory under ``runs/``), else
    ``ValueError`` naming ``field`` and the rule."""
    if not is_plain_name(name):
        raise ValueError(f"{field} must be {NAME_RULE}, got {name!r}")
    return name


def engine_capacity_rps(engine: Engine, mean_prompt: float, mean_output: float) -> float:
    """Requests/s the replica sustains of one request shape: ``max_batch / residency``.

    At a full batch ``B = max_batch`` a request holds a slot for ``mean_output`` iterations; in
    steady state ``B / mean_output`` requests enter per iteration, so each iteration also prefills
    ``mean_prompt * B / mean_output`` tokens and lasts ``dt = iter_base + iter_slope*B +
    prefill * mean_prompt * B / mean_output``. The residency is ``mean_output * dt`` and

        capacity = 1000 * B / (mean_output * dt) = 1000 / engine.request_cost_ms(mean_prompt, mean_output)

    requests/s (the same number residency accounting charges a mean request). It ignores
    ``max_prefill_tokens`` and the KV limit (a replica bounded by those sustains less)."""
    for name, v in (("mean_prompt", mean_prompt), ("mean_output", mean_output)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
                or not math.isfinite(v) or v < (0 if name == "mean_prompt" else 1):
            raise ValueError(f"engine_capacity_rps: {name} must be a finite number >= "
                             f"{0 if name == 'mean_prompt' else 1}, got {v!r}")
    b = engine.max_batch
    dt = engine.iter_base_ms + engine.iter_slope_ms * b + engine.prefill_ms_per_token * mean_prompt * b / mean_output
    return 1000.0 * b / (mean_output * dt)


class SLO(NamedTuple):
    """A tenant's latency promises (ms): time to first token and time per output token."""

    ttft_ms: float
    tpot_ms: float


@dataclass(frozen=True)
class ScenarioSpec:
    """A loaded scenario: the workload (``scenario``) plus what a workload does not hold.

    ``slos``: tenant name -> :class:`SLO`; ``rho``: the load knob, total offered load / capacity
    of the file that sets the rates (a baseline's: its base's); ``shares``: tenant name -> its
    normalised share of ``rho``, so ``rate_i = rho * shares[i] * capacity_rps[i]``;
    ``offered_load``: what these tenants offer together, ``rho * sum(shares)`` (equal to ``rho``
    except in a baseline); ``capacity_rps``: tenant name -> requests/s the replica sustains of that tenant's
    mean request (what ``rho`` is relative to); ``capacity_source``: ``"engine model"``,
    ``"given"`` or the probe file; ``seeds``; ``policy``/``policy_params``: what the simulator
    runs; ``victim``/``baseline``: the tenant whose degradation is measured and the scenario
    holding it alone; ``baseline_of``: for a baseline, the scenario it is the control of."""

    name: str
    scenario: Scenario
    slos: Mapping[str, SLO]
    description: str
    rho: float
    question: str = ""
    seeds: Tuple[int, ...] = (0, 1, 2)
    policy: str = "fcfs"
    policy_params: Mapping = field(default_factory=dict)
    capacity_rps: Mapping[str, float] = field(default_factory=dict)
    capacity_source: str = "engine model"
    victim: Optional[str] = None
    baseline: Optional[str] = None
    baseline_of: Optional[str] = None
    path: Optional[str] = None
    shares: Mapping[str, float] = field(default_factory=dict)
    offered_load: Optional[float] = None

    def __post_init__(self):
        check_name(self.name, "ScenarioSpec.name")
        if self.offered_load is None:
            object.__setattr__(self, "offered_load", self.rho)

    @property
    def tenant_names(self) -> Tuple[str, ...]:
        return self.scenario.tenant_names

    @property
    def engine(self) -> Engine:
        return self.scenario.engine

    @property
    def duration_s(self) -> float:
        return self.scenario.duration_s

    def requests(self, seed: int):
        """The request table for ``seed`` (``Scenario.requests``)."""
        return self.scenario.requests(seed)

    def with_duration(self, duration_s: float) -> "ScenarioSpec":
        """The same scenario over another run length (rates unchanged)."""
        return replace(self, scenario=replace(self.scenario, duration_s=duration_s))

    def to_dict(self) -> dict:
        """JSON-ready description (it goes into a run's ``config.json``; ``fairlib.analysis`` reads
        the SLOs, the victim and the duration back from it)."""
        rates = self.scenario.rates_rps()
        tenants = []
        for t, r in zip(self.scenario.tenants, rates):
            tenants.append({
                "name": t.name, "rate_rps": float(r), "prompt": repr(t.prompt), "output": repr(t.output),
                "mean_prompt": float(t.prompt.mean), "mean_output": float(t.output.mean),
                "arrival": repr(t.arrival_process(self.scenario.engine)), "priority": t.priority,
                "klass": t.klass, "weight": t.weight, "share": self.shares.get(t.name),
                "ttft_slo_ms": self.slos[t.name].ttft_ms, "tpot_slo_ms": self.slos[t.name].tpot_ms,
                "capacity_rps": self.capacity_rps.get(t.name),
                "offered_load": float(r / self.capacity_rps[t.name]) if self.capacity_rps.get(t.name) else None,
            })
        return {"name": self.name, "description": self.description, "question": self.question,
                "duration_s": self.scenario.duration_s, "rho": self.rho,
                "offered_load": self.offered_load, "seeds": list(self.seeds),
                "policy": self.policy, "policy_params": dict(self.policy_params),
                "engine": self.scenario.engine.to_dict(), "capacity_source": self.capacity_source,
                "victim": self.victim, "baseline": self.baseline, "baseline_of": self.baseline_of,
                "path": self.path, "tenants": tenants}
