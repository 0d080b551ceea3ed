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

import math
import tomllib
from pathlib import Path
from typing import Optional, Tuple, Union

from fairlib.scenarios.fields import (TENANT_KEYS, TOP_KEYS, FieldReader, arrival, capacity_input, engine_table,
                                      length)
from fairlib.scenarios.spec import (NAME_RULE, SLO, ScenarioSpec, check_name, engine_capacity_rps,
                                    is_plain_name)
from fairlib.sim.engine import Engine
from fairlib.sim.policies import POLICIES
from fairlib.workload import Scenario, TenantSpec

__all__ = ["SLO", "ScenarioSpec", "load", "available", "engine_capacity_rps", "check_name", "SCENARIO_DIR",
           "SCENARIOS", "NAME_RULE"]

SCENARIO_DIR = Path(__file__).resolve().parent
#: The scenario files shipped with fairlib, in the book's order.
SCENARIOS = ("fair_share", "noisy_neighbor", "victim_baseline", "slo_mix", "overload", "prefill_mix", "seed000")


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

    Tenant ``i`` sends ``rate_i = rho * rate_scale * share_i / sum(shares) * capacity_i``
    requests/s, ``capacity_i`` what the replica sustains of its mean request alone
    (``1000 / engine.request_cost_ms(mean_prompt_i, mean_output_i)`` from the engine model, or a
    measured capacity scaled by the model's cost ratio; module docstring).

    Parameters
    ----------
    name_or_path : str or pathlib.Path
        A shipped scenario's name (``available()``: ``noisy_neighbor``, ...) or the path of a
        ``.toml`` file (the format in the module docstring).
    engine : Engine, optional
        Replaces the file's ``[engine]`` (default: the file's, else seed 000's); a ``capacity``
        carrying an ``engine`` replaces both.
    rho : float, optional
        Replaces the file's total offered load / capacity (> 0; a baseline's: its base's).
    capacity : None, float, dict, str or pathlib.Path, optional
        What the load is relative to: ``None`` the engine model; a number the measured requests/s
        (> 0) of the reference request; a dict or the path of a JSON probe result with
        ``engine`` (``fairlib.Engine`` fields) and/or ``capacity_rps`` (with ``prompt_tokens``,
        ``output_tokens``).
    duration_s : float, optional
        Replaces the run length (s, > 0; arrivals in ``[0, duration_s)``).
    rate_scale : float, optional
        Multiplies ``rho``, hence every tenant's rate (> 0).

    Returns
    -------
    ScenarioSpec
        The workload (``spec.scenario``, whose ``requests(seed)`` is the request table), its SLOs,
        ``rho``, ``shares``, ``offered_load``, ``capacity_rps``, seeds, policy and victim.

    Raises
    ------
    ValueError
        An unknown name (the known ones listed), a file that cannot be read or is not TOML, an
        unknown key, a missing or invalid field (naming the file and the field: ``tenants[0]
        (interactive).share``, ...), or an argument out of range (naming it).

    Examples
    --------
    >>> from fairlib import scenarios
    >>> spec = scenarios.load("noisy_neighbor", rate_scale=2)
    >>> round(spec.rho, 2), spec.victim
    (1.8, 'interactive')
    """
    _check_knobs(rho=rho, rate_scale=rate_scale)
    path, data = _read(name_or_path)
    ctx = FieldReader(f"file {path}")
    name, description, question = _header(ctx, data)
    if "baseline_of" in data:
        return _load_baseline(ctx, path, data, name, description, question, engine, rho, capacity, duration_s,
                              rate_scale)
    for key in ("keep_tenants",):
        if key in data:
            ctx.fail(key, "is allowed only together with baseline_of")
    eng, cap, cap_source = _engine_and_capacity(ctx, data, engine, capacity)
    the_rho, dur = _load_and_duration(ctx, data, rho, rate_scale, duration_s)
    seeds = _seeds(ctx, data, [0, 1, 2])
    policy, params = _policy(ctx, data)
    parsed = _tenants(ctx, data)
    total_share = sum(p["share"] for p in parsed)
    baseline = data.get("baseline")
    if baseline is not None and not is_plain_name(baseline):
        ctx.fail("baseline", f"must be a scenario name, {NAME_RULE}, got {baseline!r}")
    cap_rps = _capacity_per_tenant(ctx, data, eng, parsed, cap)
    sc = Scenario(_rated_tenants(parsed, the_rho, cap_rps), engine=eng, duration_s=dur, name=name, description=description,
                  seed=int(seeds[0]))
    return ScenarioSpec(name=name, scenario=sc, slos={p["name"]: p["slo"] for p in parsed}, description=description,
                        rho=the_rho, question=question, seeds=tuple(seeds), policy=policy, policy_params=dict(params),
                        capacity_rps=cap_rps, capacity_source=cap_source, victim=data.get("victim"),
                        baseline=baseline, path=str(path),
                        shares={p["name"]: p["share"] / total_share for p in parsed}, offered_load=the_rho)


def _check_knobs(**knobs) -> None:
    """``ValueError`` unless each given knob (``rho``, ``rate_scale``) is a finite number > 0."""
    for key, v in knobs.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                              or v <= 0):
            raise ValueError(f"{key} must be a finite number > 0, got {v!r}")


def _header(ctx: FieldReader, data) -> tuple:
    """``(name, description, question)`` of a file, its top-level keys checked."""
    if not isinstance(data, dict):
        ctx.fail("the file", "must hold a TOML table")
    ctx.unknown(data, TOP_KEYS, "")
    name = ctx.string(data, "name", required=True)
    if not is_plain_name(name):
        ctx.fail("name", f"must be {NAME_RULE}, got {name!r}")
    return name, ctx.string(data, "description", required=True), ctx.string(data, "question")


def _engine_and_capacity(ctx: FieldReader, data, engine, capacity) -> tuple:
    """``(engine, measured capacity or None, capacity source)``: the ``engine`` given, else the
    file's; a ``capacity`` carrying an engine replaces both."""
    if engine is not None and not isinstance(engine, Engine):
        raise ValueError(f"engine must be a fairlib.Engine, got {type(engine).__name__}")
    eng = engine if engine is not None else engine_table(ctx, data.get("engine"))
    cap_engine, cap, cap_source = capacity_input(capacity)
    if cap_engine is not None:
        eng = cap_engine
    return eng, cap, cap_source


def _load_and_duration(ctx: FieldReader, data, rho, rate_scale, duration_s) -> tuple:
    """``(rho, duration_s)``: ``rho`` (the given one, else the file's) times ``rate_scale``, and the
    run length (the given one, else the file's, default 60 s)."""
    file_rho = ctx.number(data, "rho", required=True)
    the_rho = float(rho) if rho is not None else file_rho
    if rate_scale is not None:
        the_rho *= float(rate_scale)
    dur = ctx.number(data, "duration_s", default=60.0)
    if duration_s is not None:
        if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)) or not duration_s > 0:
            raise ValueError(f"duration_s must be a number > 0, got {duration_s!r}")
        dur = float(duration_s)
    return the_rho, dur


def _policy(ctx: FieldReader, data) -> tuple:
    """``(policy, policy_params)``: one of :data:`fairlib.sim.policies.POLICIES` and a table."""
    policy = ctx.string(data, "policy", default="fcfs")
    if policy not in POLICIES:
        ctx.fail("policy", f"must be one of {', '.join(POLICIES)}, got {policy!r}")
    params = data.get("policy_params", {})
    if not isinstance(params, dict):
        ctx.fail("policy_params", f"must be a table, got {params!r}")
    return policy, params


def _seeds(ctx: FieldReader, data, default: list) -> list:
    """The file's ``seeds``: a non-empty list of integers >= 0."""
    seeds = data.get("seeds", default)
    if not isinstance(seeds, list) or not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0
                                                       for s in seeds):
        ctx.fail("seeds", f"must be a non-empty list of integers >= 0, got {seeds!r}")
    return seeds


def _tenants(ctx: FieldReader, data) -> list:
    """The ``[[tenants]]`` tables as dicts of checked fields (distinct names; the ``victim`` one of them)."""
    raw = data.get("tenants")
    if not isinstance(raw, list) or not raw:
        ctx.fail("tenants", "must be a non-empty array of tables ([[tenants]])")
    parsed = [_tenant(ctx, i, t) for i, t in enumerate(raw)]
    names = [p["name"] for p in parsed]
    if len(set(names)) != len(names):
        ctx.fail("tenants", f"must have distinct names, got {names}")
    for key in ("victim",):
        v = data.get(key)
        if v is not None and v not in names:
            ctx.fail(key, f"must name one of the tenants {names}, got {v!r}")
    return parsed


def _tenant(ctx: FieldReader, i: int, t) -> dict:
    """Tenant ``i``'s table: name, share, lengths, arrival process, SLO, priority, class, weight."""
    lab = f"tenants[{i}]"
    if not isinstance(t, dict):
        ctx.fail(lab, f"must be a table, got {t!r}")
    ctx.unknown(t, TENANT_KEYS, f"{lab}.")
    tname = ctx.string(t, "name", required=True, label=f"{lab}.name")
    lab = f"tenants[{i}] ({tname})"
    for req in ("prompt", "output"):
        if req not in t:
            ctx.fail(f"{lab}.{req}", "is required")
    return dict(
        name=tname,
        share=ctx.number(t, "share", required=True, label=f"{lab}.share"),
        prompt=length(ctx, t["prompt"], f"{lab}.prompt"),
        output=length(ctx, t["output"], f"{lab}.output"),
        arrival=arrival(ctx, t.get("arrival"), f"{lab}.arrival"),
        slo=SLO(ctx.number(t, "ttft_slo_ms", required=True, label=f"{lab}.ttft_slo_ms"),
                ctx.number(t, "tpot_slo_ms", required=True, label=f"{lab}.tpot_slo_ms")),
        priority=ctx.integer(t, "priority", label=f"{lab}.priority"),
        klass=ctx.integer(t, "klass", low=0, label=f"{lab}.klass"),
        weight=ctx.number(t, "weight", default=1.0, label=f"{lab}.weight"),
    )


def _capacity_per_tenant(ctx: FieldReader, data, eng: Engine, parsed: list, cap) -> dict:
    """Tenant name -> requests/s: the engine model's ``engine_capacity_rps`` of its mean request,
    or a measured ``cap = (rps, ref_prompt, ref_output)`` scaled by the model's cost ratio
    ``rps * model(tenant) / model(reference)`` (the reference: ``cap``'s, the file's
    ``[reference]``, else the share-weighted mean request)."""
    model_cap = {p["name"]: engine_capacity_rps(eng, p["prompt"].mean, p["output"].mean) for p in parsed}
    if cap is None:
        return model_cap
    total_share = sum(p["share"] for p in parsed)
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
    return {n: rps * c / ref_model for n, c in model_cap.items()}


def _rated_tenants(parsed: list, rho: float, cap_rps: dict) -> tuple:
    """The tenants, each at ``rate_i = rho * share_i / sum(shares) * capacity_i`` requests/s."""
    total_share = sum(p["share"] for p in parsed)
    return tuple(TenantSpec(p["name"], output=p["output"], prompt=p["prompt"], arrival=p["arrival"],
                        rate_rps=rho * p["share"] / total_share * cap_rps[p["name"]], klass=p["klass"],
                        priority=p["priority"], weight=p["weight"]) for p in parsed)


def _load_baseline(ctx: FieldReader, path, data, name, description, question, engine, rho, capacity, duration_s, rate_scale):
    """A ``baseline_of`` file: some of another scenario's tenants, at the rates they have there."""
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
    seeds = _seeds(ctx, data, list(base.seeds))
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
