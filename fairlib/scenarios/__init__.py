"""Scenarios as data: the tenantbench scenarios as TOML files, loaded into a ``ScenarioSpec``.

    from fairlib import scenarios
    spec = scenarios.load("noisy_neighbor")                  # a name, or a path to a .toml file
    spec = scenarios.load("overload", rho=1.2, capacity="probe.json")
    spec = scenarios.load("victim_baseline", rate_scale=2)   # every tenant's rate x 2
    spec.scenario.requests(seed)     # the request table (fairlib.workload.Scenario)
    spec.slos["interactive"]         # SLO(ttft_ms=500.0, tpot_ms=50.0)

**Load is capacity-relative.** A file gives the total offered load ``rho`` (a fraction of the
replica's capacity) and each tenant's ``share`` of it (shares are normalised to sum to 1). Tenant
``i`` sends ``rate_i = rho * share_i * capacity_i`` requests/s, where ``capacity_i`` is what the
replica sustains of tenant ``i``'s mean request alone. From the engine model
(:func:`engine_capacity_rps`) that is ``1000 / engine.request_cost_ms(mean_prompt, mean_output)``,
so tenant ``i`` offers ``rho * share_i`` of the machine's milliseconds and the tenants together
offer ``rho``. A measured capacity can replace the model's (``capacity=``, below).

Two numbers, two names. ``rho`` is the load *knob*: the file's key, ``load(rho=)`` and ``fairlib
--rho``, the number every rate is computed from. ``offered_load`` is what a spec's own tenants
offer together, ``sum_i rate_i / capacity_i = rho * sum_i share_i``. They are equal except in a
baseline scenario (below): victim_baseline keeps noisy_neighbor's victim, so its ``rho`` is
noisy_neighbor's 0.9 (what sets the victim's rate, and what ``rho=`` changes for both) while its
``offered_load`` is the victim's 0.3. ``load(rate_scale=k)`` (``fairlib --rate-scale k``) multiplies
``rho``, hence every tenant's rate, by ``k`` in every scenario, a baseline included.

**File format** (keys not listed are errors, so a typo cannot pass silently)::

    name = "noisy_neighbor"              # required, as the file name: letters, digits, _ . - only
    description = "..."                  # required: what the scenario is
    question = "..."                     # optional: the question it answers
    duration_s = 60.0                    # run length (arrivals in [0, duration_s))
    rho = 0.9                            # total offered load / capacity (the knob: rate_i above)
    seeds = [0, 1, 2]                    # run seeds (three by default)
    policy = "fcfs"                      # the simulator's policy for this scenario
    policy_params = {}                   # its parameters
    victim = "interactive"               # optional: the tenant whose degradation is measured
    baseline = "victim_baseline"         # optional: the scenario holding the victim alone
    [engine]                             # optional: fairlib.Engine fields (default: seed 000's)
    [[tenants]]
    name = "interactive"
    share = 0.33                         # its part of rho
    prompt = { dist = "lognormal", mean = 256, sigma = 0.5 }   # or an int (constant)
    output = { dist = "lognormal", mean = 64, sigma = 0.5 }
    arrival = { process = "poisson" }    # gamma (burstiness), onoff (on_s, off_s), periodic
    ttft_slo_ms = 500                    # SLOs: per tenant, both required
    tpot_slo_ms = 50
    priority = 0                         # sent as vLLM's priority (lower = earlier)
    klass = 0                            # its class (the class-based policies: weighted, aging)
    weight = 1.0                         # its weight under the weighted policies (Scenario.policy_params)

Length distributions: ``constant`` (value), ``lognormal`` (mean, sigma), ``geometric`` (mean),
``uniform`` (low, high), ``empirical`` (values). A file may instead derive from another scenario:
``baseline_of = "noisy_neighbor"`` with ``keep_tenants = ["interactive"]`` keeps those tenants
with exactly the rates (and SLOs) they have there (the victim alone at the same rate). A baseline
states no ``rho``: its rates follow its base's ``rho`` (``load(rho=, rate_scale=)`` reach the base).

**Weights.** A tenant's ``weight`` (default 1) becomes the weighted policies' weights when the
scenario is simulated under one and its parameters give none (``Scenario.policy_params``): the
per-tenant ``weights`` of vtc, lcf, residency and vtc_predict, and ``weighted``'s per-class ``w``
(the common weight of each class's tenants, an integer). Explicit parameters (the file's
``policy_params``, ``--policy-param``) win.

**Capacity** (``load(..., capacity=...)``): ``None`` uses the engine model; a number is a measured
capacity in requests/s of the scenario's reference request (``[reference] prompt_tokens,
output_tokens``, default the share-weighted mean request), scaled to each tenant by the engine
model's cost ratio; a dict or the path of a JSON file (a probe result) may carry ``engine``
(``fairlib.Engine`` fields, e.g. a fitted cost model: then it is the engine) and/or
``capacity_rps`` with the ``prompt_tokens``/``output_tokens`` it was measured at.
"""
from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping, NamedTuple, Optional, Tuple, Union

import numpy as np

from fairlib.sim.engine import SEED000_ENGINE, Engine
from fairlib.workload import (Constant, Empirical, Gamma, Geometric, LogNormal, OnOff, Periodic, Poisson,
                              Scenario, Tenant, Uniform)
from fairlib.sim.policies import POLICIES

__all__ = ["SLO", "ScenarioSpec", "load", "available", "engine_capacity_rps", "check_name", "SCENARIO_DIR",
           "SCENARIOS"]

SCENARIO_DIR = Path(__file__).resolve().parent
#: The scenario files shipped with fairlib, in the book's order.
SCENARIOS = ("fair_share", "noisy_neighbor", "victim_baseline", "slo_mix", "overload", "prefill_mix", "seed000")


_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]+")
NAME_RULE = "a plain name: letters, digits, '_', '.' and '-' only (no path separators), not '.' or '..'"


def check_name(name, field: str = "name") -> str:
    """``name`` when it is a plain scenario name (it becomes a directory under ``runs/``), else
    ``ValueError`` naming ``field`` and the rule."""
    if not isinstance(name, str) or not _PLAIN_NAME.fullmatch(name) or name in (".", ".."):
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


# --- parsing helpers ---------------------------------------------------------------------------
_TOP_KEYS = {"name", "description", "question", "duration_s", "rho", "seeds", "policy", "policy_params",
             "victim", "baseline", "engine", "tenants", "reference", "baseline_of", "keep_tenants"}
_TENANT_KEYS = {"name", "share", "prompt", "output", "arrival", "ttft_slo_ms", "tpot_slo_ms", "priority",
                "klass", "weight"}
_DISTS = {"constant": ("value",), "lognormal": ("mean", "sigma"), "geometric": ("mean",),
          "uniform": ("low", "high"), "empirical": ("values",)}
_PROCESSES = {"poisson": (), "gamma": ("burstiness",), "onoff": ("on_s", "off_s"), "periodic": ("offset_ms",)}


class _Ctx:
    def __init__(self, where: str):
        self.where = where

    def fail(self, key: str, msg: str):
        raise ValueError(f"scenario {self.where}: {key} {msg}")

    def number(self, d: Mapping, key: str, *, default=None, low: float = 0.0, strict: bool = True,
               required: bool = False, label: Optional[str] = None):
        label = label or key
        if key not in d:
            if required:
                self.fail(label, "is required")
            return default
        v = d[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or (v <= low if strict else v < low):
            self.fail(label, f"must be a finite number {'>' if strict else '>='} {low:g}, got {v!r}")
        return float(v)

    def integer(self, d: Mapping, key: str, *, default=0, low: Optional[int] = None, label: Optional[str] = None):
        label = label or key
        v = d.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or (low is not None and v < low):
            self.fail(label, f"must be an integer{f' >= {low}' if low is not None else ''}, got {v!r}")
        return int(v)

    def string(self, d: Mapping, key: str, *, required: bool = False, default: str = "", label=None):
        label = label or key
        if key not in d:
            if required:
                self.fail(label, "is required")
            return default
        v = d[key]
        if not isinstance(v, str) or (required and not v.strip()):
            self.fail(label, f"must be a non-empty string, got {v!r}")
        return v

    def unknown(self, d: Mapping, allowed, label: str):
        extra = sorted(set(d) - set(allowed))
        if extra:
            self.fail(f"{label}{extra[0]}" if label else extra[0],
                      f"is not a known field (allowed: {', '.join(sorted(allowed))})")


def _length(ctx: _Ctx, spec, label: str):
    if isinstance(spec, int) and not isinstance(spec, bool):
        if spec < 1:
            ctx.fail(label, f"must be an integer >= 1 (a constant length), got {spec!r}")
        return Constant(spec)
    if not isinstance(spec, dict):
        ctx.fail(label, f"must be an integer or a table with 'dist', got {spec!r}")
    kind = spec.get("dist")
    if kind not in _DISTS:
        ctx.fail(f"{label}.dist", f"must be one of {', '.join(_DISTS)}, got {kind!r}")
    ctx.unknown(spec, {"dist", *_DISTS[kind]}, f"{label}.")
    try:
        if kind == "constant":
            return Constant(ctx.integer(spec, "value", default=None, low=1, label=f"{label}.value"))
        if kind == "lognormal":
            return LogNormal(ctx.number(spec, "mean", required=True, low=1.0, strict=False, label=f"{label}.mean"),
                             ctx.number(spec, "sigma", default=1.0, low=0.0, strict=False, label=f"{label}.sigma"))
        if kind == "geometric":
            return Geometric(ctx.number(spec, "mean", required=True, low=1.0, strict=False, label=f"{label}.mean"))
        if kind == "uniform":
            return Uniform(ctx.integer(spec, "low", default=None, low=1, label=f"{label}.low"),
                           ctx.integer(spec, "high", default=None, low=1, label=f"{label}.high"))
        vals = spec.get("values")
        if not isinstance(vals, list) or not vals:
            ctx.fail(f"{label}.values", f"must be a non-empty list of integers >= 1, got {vals!r}")
        return Empirical(tuple(vals))
    except ValueError as e:
        if str(e).startswith("scenario "):
            raise
        ctx.fail(label, f"is invalid: {e}")


def _arrival(ctx: _Ctx, spec, label: str):
    if spec is None:
        return Poisson()
    if not isinstance(spec, dict):
        ctx.fail(label, f"must be a table with 'process', got {spec!r}")
    kind = spec.get("process", "poisson")
    if kind not in _PROCESSES:
        ctx.fail(f"{label}.process", f"must be one of {', '.join(_PROCESSES)}, got {kind!r}")
    ctx.unknown(spec, {"process", *_PROCESSES[kind]}, f"{label}.")
    if kind == "poisson":
        return Poisson()
    if kind == "gamma":
        return Gamma(None, ctx.number(spec, "burstiness", required=True, label=f"{label}.burstiness"))
    if kind == "onoff":
        return OnOff(None, ctx.number(spec, "on_s", required=True, label=f"{label}.on_s"),
                     ctx.number(spec, "off_s", required=True, strict=False, label=f"{label}.off_s"))
    return Periodic(None, ctx.number(spec, "offset_ms", default=0.0, strict=False, label=f"{label}.offset_ms"))


def _engine(ctx: _Ctx, spec) -> Engine:
    if spec is None:
        return SEED000_ENGINE
    if not isinstance(spec, dict):
        ctx.fail("engine", f"must be a table of fairlib.Engine fields, got {spec!r}")
    allowed = set(Engine.__dataclass_fields__)
    ctx.unknown(spec, allowed, "engine.")
    try:
        return Engine(**spec)
    except (ValueError, TypeError) as e:
        ctx.fail("engine", f"is invalid: {e}")


def _capacity_input(capacity):
    """(engine override or None, (rps, prompt, output) or None, source label)."""
    if capacity is None:
        return None, None, "engine model"
    if isinstance(capacity, (int, float)) and not isinstance(capacity, bool):
        if not math.isfinite(capacity) or capacity <= 0:
            raise ValueError(f"capacity must be a finite number > 0 (requests/s), got {capacity!r}")
        return None, (float(capacity), None, None), "given"
    source = "given"
    if isinstance(capacity, (str, Path)):
        p = Path(capacity)
        try:
            capacity = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ValueError(f"capacity file {p}: cannot read it as JSON ({e})") from None
        source = str(p)
    if not isinstance(capacity, Mapping):
        raise ValueError(f"capacity must be None, a number (requests/s), a dict or a JSON file path, got {capacity!r}")
    eng = None
    e = capacity.get("engine")
    if e is not None:
        if not isinstance(e, Mapping):
            raise ValueError(f"capacity: 'engine' must be a table of fairlib.Engine fields, got {e!r}")
        fields = {k: v for k, v in e.items() if k in Engine.__dataclass_fields__}
        try:
            eng = Engine(**fields)
        except (ValueError, TypeError) as err:
            raise ValueError(f"capacity: 'engine' is invalid: {err}") from None
    cap = None
    if capacity.get("capacity_rps") is not None:
        rps = capacity["capacity_rps"]
        if isinstance(rps, bool) or not isinstance(rps, (int, float)) or not math.isfinite(rps) or rps <= 0:
            raise ValueError(f"capacity: 'capacity_rps' must be a number > 0, got {rps!r}")
        cap = (float(rps), capacity.get("prompt_tokens"), capacity.get("output_tokens"))
    if eng is None and cap is None:
        raise ValueError("capacity: needs 'engine' (fitted cost model) and/or 'capacity_rps'")
    return eng, cap, source


def _read(name_or_path) -> tuple:
    p = Path(name_or_path)
    if not (p.suffix == ".toml" or p.exists()):
        if str(name_or_path) not in available():
            raise ValueError(f"unknown scenario {name_or_path!r}; known: {', '.join(available())} "
                             "(or give the path of a .toml file)")
        p = SCENARIO_DIR / f"{name_or_path}.toml"
    try:
        with open(p, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ValueError(f"scenario file {p}: cannot read it ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"scenario file {p}: not valid TOML ({e})") from None
    return p, data


def available() -> Tuple[str, ...]:
    """Names of the scenario files shipped with fairlib."""
    found = sorted(q.stem for q in SCENARIO_DIR.glob("*.toml"))
    return tuple([n for n in SCENARIOS if n in found] + [n for n in found if n not in SCENARIOS])


def load(name_or_path: Union[str, Path], engine: Optional[Engine] = None, rho: Optional[float] = None,
         capacity=None, duration_s: Optional[float] = None, rate_scale: Optional[float] = None) -> ScenarioSpec:
    """Load a scenario file (a name from :func:`available` or a path) into a :class:`ScenarioSpec`.

    ``engine`` replaces the file's engine; ``rho`` its total offered load (a baseline's: its
    base's); ``rate_scale`` multiplies ``rho``, so every tenant's rate, by that factor
    (``rate_i = rho * rate_scale * share_i * capacity_i``); ``capacity`` what the load is
    relative to (module docstring); ``duration_s`` its run length. Invalid files raise
    ``ValueError`` naming the file and the field."""
    for key, v in (("rho", rho), ("rate_scale", rate_scale)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                              or v <= 0):
            raise ValueError(f"{key} must be a finite number > 0, got {v!r}")
    path, data = _read(name_or_path)
    ctx = _Ctx(f"file {path}")
    if not isinstance(data, dict):
        ctx.fail("the file", "must hold a TOML table")
    ctx.unknown(data, _TOP_KEYS, "")
    name = ctx.string(data, "name", required=True)
    if not (_PLAIN_NAME.fullmatch(name) and name not in (".", "..")):
        ctx.fail("name", f"must be {NAME_RULE}, got {name!r}")
    description = ctx.string(data, "description", required=True)
    question = ctx.string(data, "question")
    if "baseline_of" in data:
        return _load_baseline(ctx, path, data, name, description, question, engine, rho, capacity, duration_s,
                              rate_scale)
    for key in ("keep_tenants",):
        if key in data:
            ctx.fail(key, "is allowed only together with baseline_of")
    if engine is not None and not isinstance(engine, Engine):
        raise ValueError(f"engine must be a fairlib.Engine, got {type(engine).__name__}")
    eng = engine if engine is not None else _engine(ctx, data.get("engine"))
    cap_engine, cap, cap_source = _capacity_input(capacity)
    if cap_engine is not None:
        eng = cap_engine
    file_rho = ctx.number(data, "rho", required=True)
    the_rho = float(rho) if rho is not None else file_rho
    if rate_scale is not None:
        the_rho *= float(rate_scale)
    dur = ctx.number(data, "duration_s", default=60.0)
    if duration_s is not None:
        if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)) or not duration_s > 0:
            raise ValueError(f"duration_s must be a number > 0, got {duration_s!r}")
        dur = float(duration_s)
    seeds = data.get("seeds", [0, 1, 2])
    if not isinstance(seeds, list) or not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0
                                                       for s in seeds):
        ctx.fail("seeds", f"must be a non-empty list of integers >= 0, got {seeds!r}")
    policy = ctx.string(data, "policy", default="fcfs")
    if policy not in POLICIES:
        ctx.fail("policy", f"must be one of {', '.join(POLICIES)}, got {policy!r}")
    params = data.get("policy_params", {})
    if not isinstance(params, dict):
        ctx.fail("policy_params", f"must be a table, got {params!r}")

    raw = data.get("tenants")
    if not isinstance(raw, list) or not raw:
        ctx.fail("tenants", "must be a non-empty array of tables ([[tenants]])")
    parsed = []
    for i, t in enumerate(raw):
        lab = f"tenants[{i}]"
        if not isinstance(t, dict):
            ctx.fail(lab, f"must be a table, got {t!r}")
        ctx.unknown(t, _TENANT_KEYS, f"{lab}.")
        tname = ctx.string(t, "name", required=True, label=f"{lab}.name")
        lab = f"tenants[{i}] ({tname})"
        for req in ("prompt", "output"):
            if req not in t:
                ctx.fail(f"{lab}.{req}", "is required")
        parsed.append(dict(
            name=tname,
            share=ctx.number(t, "share", required=True, label=f"{lab}.share"),
            prompt=_length(ctx, t["prompt"], f"{lab}.prompt"),
            output=_length(ctx, t["output"], f"{lab}.output"),
            arrival=_arrival(ctx, t.get("arrival"), f"{lab}.arrival"),
            slo=SLO(ctx.number(t, "ttft_slo_ms", required=True, label=f"{lab}.ttft_slo_ms"),
                    ctx.number(t, "tpot_slo_ms", required=True, label=f"{lab}.tpot_slo_ms")),
            priority=ctx.integer(t, "priority", label=f"{lab}.priority"),
            klass=ctx.integer(t, "klass", low=0, label=f"{lab}.klass"),
            weight=ctx.number(t, "weight", default=1.0, label=f"{lab}.weight"),
        ))
    names = [p["name"] for p in parsed]
    if len(set(names)) != len(names):
        ctx.fail("tenants", f"must have distinct names, got {names}")
    total_share = sum(p["share"] for p in parsed)
    for key in ("victim",):
        v = data.get(key)
        if v is not None and v not in names:
            ctx.fail(key, f"must name one of the tenants {names}, got {v!r}")
    baseline = data.get("baseline")
    if baseline is not None and not (isinstance(baseline, str) and _PLAIN_NAME.fullmatch(baseline)
                                     and baseline not in (".", "..")):
        ctx.fail("baseline", f"must be a scenario name, {NAME_RULE}, got {baseline!r}")

    # capacity per tenant: the engine model, or a measured number scaled by the model's cost ratio
    model_cap = {p["name"]: engine_capacity_rps(eng, p["prompt"].mean, p["output"].mean) for p in parsed}
    if cap is None:
        cap_rps = model_cap
    else:
        rps, ref_p, ref_o = cap
        ref = data.get("reference")
        if ref_p is None or ref_o is None:
            if ref is not None:
                if not isinstance(ref, dict):
                    ctx.fail("reference", f"must be a table with prompt_tokens and output_tokens, got {ref!r}")
                ctx.unknown(ref, {"prompt_tokens", "output_tokens"}, "reference.")
                ref_p = ctx.number(ref, "prompt_tokens", required=True, strict=False, label="reference.prompt_tokens")
                ref_o = ctx.number(ref, "output_tokens", required=True, low=1.0, strict=False,
                                   label="reference.output_tokens")
            else:
                ref_p = sum(p["share"] * p["prompt"].mean for p in parsed) / total_share
                ref_o = sum(p["share"] * p["output"].mean for p in parsed) / total_share
        ref_model = engine_capacity_rps(eng, float(ref_p), float(ref_o))
        cap_rps = {n: rps * c / ref_model for n, c in model_cap.items()}

    tenants = []
    for p in parsed:
        rate = the_rho * p["share"] / total_share * cap_rps[p["name"]]
        tenants.append(Tenant(p["name"], output=p["output"], prompt=p["prompt"], arrival=p["arrival"],
                              rate_rps=rate, klass=p["klass"], priority=p["priority"], weight=p["weight"]))
    sc = Scenario(tuple(tenants), engine=eng, duration_s=dur, name=name, description=description,
                  seed=int(seeds[0]))
    return ScenarioSpec(name=name, scenario=sc, slos={p["name"]: p["slo"] for p in parsed}, description=description,
                        rho=the_rho, question=question, seeds=tuple(seeds), policy=policy, policy_params=dict(params),
                        capacity_rps=cap_rps, capacity_source=cap_source, victim=data.get("victim"),
                        baseline=baseline, path=str(path),
                        shares={p["name"]: p["share"] / total_share for p in parsed}, offered_load=the_rho)


def _load_baseline(ctx, path, data, name, description, question, engine, rho, capacity, duration_s, rate_scale):
    allowed = {"name", "description", "question", "baseline_of", "keep_tenants", "duration_s", "seeds", "policy",
               "policy_params"}
    of = ctx.string(data, "baseline_of", required=True)
    if "rho" in data:
        ctx.fail("rho", f"is not allowed in a baseline: its tenants keep the rates they have in baseline_of "
                        f"({of!r}), set by that file's rho (load(rho=...) / --rho move both)")
    ctx.unknown(data, allowed, "")
    keep = data.get("keep_tenants")
    if not isinstance(keep, list) or not keep or not all(isinstance(k, str) for k in keep):
        ctx.fail("keep_tenants", f"must be a non-empty list of tenant names, got {keep!r}")
    if Path(of).stem == name:
        ctx.fail("baseline_of", "must name another scenario")
    base = load(of if not (path.parent / f"{of}.toml").exists() else path.parent / f"{of}.toml",
                engine=engine, rho=rho, capacity=capacity, duration_s=duration_s, rate_scale=rate_scale)
    missing = [k for k in keep if k not in base.tenant_names]
    if missing:
        ctx.fail("keep_tenants", f"names tenants {missing} that {of!r} does not have ({list(base.tenant_names)})")
    tenants = tuple(t for t in base.scenario.tenants if t.name in keep)
    dur = ctx.number(data, "duration_s", default=base.duration_s)
    if duration_s is not None:
        dur = float(duration_s)
    seeds = data.get("seeds", list(base.seeds))
    if not isinstance(seeds, list) or not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0
                                                       for s in seeds):
        ctx.fail("seeds", f"must be a non-empty list of integers >= 0, got {seeds!r}")
    policy = ctx.string(data, "policy", default=base.policy)
    sc = Scenario(tenants, engine=base.engine, duration_s=dur, name=name, description=description, seed=int(seeds[0]))
    # Request streams are keyed by tenant index (workload.rng_for): a kept tenant sees the very
    # requests it sends in the base scenario when it keeps its index there (list it first).
    shares = {k: base.shares[k] for k in keep}
    return ScenarioSpec(name=name, scenario=sc, slos={k: base.slos[k] for k in keep}, description=description,
                        rho=base.rho, question=question, seeds=tuple(seeds), policy=policy,
                        policy_params=dict(data.get("policy_params", base.policy_params)),
                        capacity_rps={k: base.capacity_rps[k] for k in keep}, capacity_source=base.capacity_source,
                        victim=keep[0] if len(keep) == 1 else None, baseline=None, baseline_of=base.name,
                        path=str(path), shares=shares, offered_load=base.rho * math.fsum(shares.values()))
