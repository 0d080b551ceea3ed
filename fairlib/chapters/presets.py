"""The seed-000 scenario of chapters 1-4, reconstructed from the figures the source blog post
publishes (each reconstructed parameter is derived in book/methods.ipynb).

One source: the tenants are those of the scenario file ``fairlib/scenarios/seed000.toml``
(:func:`read_seed000`); :func:`seed000` builds the book's variants (flood, spread, output
distribution) from them."""
from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple, Optional, Tuple, Union

import numpy as np

from fairlib.scenarios import SCENARIO_DIR, load
from fairlib.sim.engine import SEED000_ENGINE, Engine
from fairlib.workload import Constant, Geometric, LogNormal, Poisson, Scenario, TenantSpec

__all__ = ["seed000", "read_seed000", "Seed000", "SEED000", "SEED000_TENANTS", "SEED000_OUTPUT_MEANS",
           "SEED000_PROMPT_TOKENS", "SEED000_MACHINE_MS_PER_S", "SEED000_DURATION_S", "SEED000_OUTPUT_DISTS",
           "spread_means", "SEED000_ENGINE"]


class Seed000(NamedTuple):
    """What the seed-000 file states: tenant names, their common prompt length, their geometric
    output means, the machine ms per second each offers, the engine and the run length."""

    tenants: Tuple[str, ...]
    prompt_tokens: int
    output_means: Tuple[float, ...]
    machine_ms_per_s: float
    engine: Engine
    duration_s: float


def read_seed000(path: Union[str, Path] = SCENARIO_DIR / "seed000.toml") -> Seed000:
    """The seed-000 tenants from the scenario file: each offers ``1000 * rho * share`` machine ms
    per second (3.0 x 0.25 -> 750). The file must keep the seed's shape: one constant prompt
    length, geometric outputs, Poisson arrivals, equal shares."""
    spec = load(path)
    ts = spec.scenario.tenants

    def bad(what):
        raise ValueError(f"seed000 file {spec.path}: {what} (the seed-000 preset builds from it)")

    for t in ts:
        if not isinstance(t.output, Geometric):
            bad(f"tenant {t.name!r} must have a geometric output, got {t.output!r}")
        if not isinstance(t.prompt, Constant) or t.prompt != ts[0].prompt:
            bad(f"tenant {t.name!r} must have the same constant prompt as {ts[0].name!r}, got {t.prompt!r}")
        if not isinstance(t.arrival, Poisson):
            bad(f"tenant {t.name!r} must have Poisson arrivals, got {t.arrival!r}")
    ms = {1000.0 * spec.rho * spec.shares[t.name] for t in ts}
    if len(ms) != 1:
        bad(f"the tenants must have equal shares, got {dict(spec.shares)}")
    prompt = ts[0].prompt
    assert isinstance(prompt, Constant)   # checked above: every tenant has the same constant prompt
    return Seed000(spec.tenant_names, prompt.value, tuple(t.output.mean for t in ts), ms.pop(),
                   spec.engine, spec.duration_s)


SEED000 = read_seed000()
SEED000_TENANTS = SEED000.tenants                      # classify, chat, summarise, agent
#: Mean realised output lengths: 23.7 and 353.8 are published; 48 and 177 are reconstructed.
SEED000_OUTPUT_MEANS = SEED000.output_means            # 23.7, 48.0, 177.0, 353.8
SEED000_PROMPT_TOKENS = SEED000.prompt_tokens          # 387
SEED000_MACHINE_MS_PER_S = SEED000.machine_ms_per_s    # 750.0
SEED000_DURATION_S = SEED000.duration_s                # 120.0
SEED000_OUTPUT_DISTS = ("geometric", "lognormal", "constant")


def spread_means(means, spread: float) -> np.ndarray:
    """Rescale ``means`` geometrically about their geometric mean ``g``:
    ``m_i' = g * (m_i / g) ** (ln(spread) / ln(max m / min m))``, so ``max m' / min m' = spread``,
    the order is kept and the geometric mean is unchanged (to about 1e-11 relative: each mean
    is rounded to 12 significant digits). ``spread`` >= 1."""
    m = np.asarray(means, dtype=np.float64)
    if not (isinstance(spread, (int, float, np.integer, np.floating)) and not isinstance(spread, bool)
            and math.isfinite(spread) and spread >= 1):
        raise ValueError(f"spread must be a finite number >= 1 (max/min of the output means), got {spread!r}")
    if m.ndim != 1 or m.size < 2 or np.any(~np.isfinite(m)) or np.any(m <= 0) or m.max() == m.min():
        raise ValueError("spread_means: means must be >= 2 finite positive values, not all equal")
    # scalar libm calls, summed in a fixed order and rounded to 12 significant digits: numpy's
    # vectorised exp/log differ in the last bit between processors, and these means set the
    # workload of every grid run, which the book compares exactly across machines
    logm = [math.log(float(x)) for x in m]
    g = math.fsum(logm) / len(logm)
    k = math.log(spread) / (max(logm) - min(logm))
    return np.array([float(f"{math.exp(g + (lx - g) * k):.12g}") for lx in logm])


def seed000(seed: int = 0, duration_s: float = SEED000_DURATION_S, output_dist: str = "geometric",
            flood: float = 1.0, flood_tenant: Union[int, str, None] = None,
            spread: Optional[float] = None, engine: Optional[Engine] = None, *,
            lognormal_sigma: float = 1.0, est_output: Optional[str] = None,
            prompt_tokens: int = SEED000_PROMPT_TOKENS) -> Scenario:
    """The seed-000 scenario (book chapters 1-4): four tenants on one replica.

    The tenants and the engine are those of ``fairlib/scenarios/seed000.toml`` (:func:`read_seed000`).
    Engine: ``Engine(9.0, 0.55, 0.06, 24)`` (``SEED000_ENGINE``), i.e. ``dt = 9 + 0.55 B + 0.06 P``
    ms with ``max_batch`` 24. The three exchange rates the blog post publishes,
    ``(iter_base + iter_slope B) / (B prefill)`` = 27.92, 15.42, 12.29 at B = 8, 24, 48, fix only
    the ratios ``iter_base / prefill = 150`` and ``iter_slope / prefill = 55/6`` (any engine
    ``(150 s, 55/6 s, s)`` gives the same three rates); they do not fix the scale. The scale
    ``prefill = 0.06`` ms per prompt token comes from elsewhere: the published decode-token
    counts (93,932 and 92,864 in 120 s) point to a prefill of about 0.061, and the round 0.06 is
    kept. The book's methods page derives every reconstructed parameter; chapter 1 computes the
    two ratios from the published rates.

    Tenants ``classify, chat, summarise, agent``: identical prompts ``Constant(387)``; mean output
    lengths 23.7, 48.0, 177.0, 353.8 tokens (23.7 and 353.8 are published; 48 and 177 are
    reconstructed from the published shares within a few percent). Poisson arrivals. Each
    tenant offers 750 ms of machine per second: ``rate = 750 / (0.06 * 387 + mean_out *
    (9 + 0.55 * 24) / 24)`` requests/s (the cost of its mean request at B = 24, or at
    ``engine.max_batch`` for another engine), e.g. classify 750 / 45.1425 = 16.614 req/s,
    agent 750 / 350.485 = 2.140 req/s. Together 4 x 750 = 3x the machine: all stay backlogged.

    Parameters
    ----------
    seed : the scenario's default run seed (``Scenario.requests()``).
    output_dist : ``"geometric"`` (default), ``"lognormal"`` (``LogNormal(mean, lognormal_sigma)``)
        or ``"constant"`` (``Constant(round(mean))``).
    flood : the flood sweep: ``flood_tenant``'s offered load becomes ``750 * flood`` ms/s.
    flood_tenant : index or name of the flooded tenant; default ``0`` (classify).
    spread : ratio of the longest to the shortest mean output; the means are rescaled
        geometrically (:func:`spread_means`: order and geometric mean kept) and each tenant still
        offers 750 ms/s (rates recomputed). ``None`` keeps the published means.
    est_output : passed to every :class:`TenantSpec` (``None``/"mean" or "oracle").
    prompt_tokens : every tenant's prompt length (default the seed's 387); each tenant still
        offers 750 ms/s, so its request rate follows the longer or shorter prompt.
    """
    if output_dist not in SEED000_OUTPUT_DISTS:
        raise ValueError(f"seed000: output_dist must be one of {SEED000_OUTPUT_DISTS}, got {output_dist!r}")
    if isinstance(flood, bool) or not isinstance(flood, (int, float, np.integer, np.floating)) \
            or not math.isfinite(flood) or flood < 0:
        raise ValueError(f"seed000: flood must be a finite number >= 0, got {flood!r}")
    if flood_tenant is None:
        fi = 0
    elif isinstance(flood_tenant, str) and flood_tenant in SEED000_TENANTS:
        fi = SEED000_TENANTS.index(flood_tenant)
    elif isinstance(flood_tenant, (int, np.integer)) and not isinstance(flood_tenant, bool) \
            and 0 <= flood_tenant < len(SEED000_TENANTS):
        fi = int(flood_tenant)
    else:
        raise ValueError(f"seed000: flood_tenant must be None, 0..3 or one of {SEED000_TENANTS}, "
                         f"got {flood_tenant!r}")
    means = np.array(SEED000_OUTPUT_MEANS) if spread is None else spread_means(SEED000_OUTPUT_MEANS, spread)
    if np.any(means < 1):
        raise ValueError(f"seed000: spread={spread!r} puts a mean output below 1 token ({means.min():.3g})")
    engine = SEED000.engine if engine is None else engine

    def dist(mean):
        if output_dist == "geometric":
            return Geometric(float(mean))
        if output_dist == "lognormal":
            return LogNormal(float(mean), lognormal_sigma)
        return Constant(max(1, int(math.floor(mean + 0.5))))

    tenants = [
        TenantSpec(name, output=dist(m), prompt=Constant(prompt_tokens),
               machine_ms_per_s=SEED000_MACHINE_MS_PER_S * (flood if i == fi else 1.0),
               est_output=est_output)
        for i, (name, m) in enumerate(zip(SEED000_TENANTS, means))
    ]
    desc = (f"seed 000: four tenants, prompts 387, {output_dist} outputs with means "
            + ", ".join(f"{m:.1f}" for m in means)
            + "; 750 ms/s each" + (f", {SEED000_TENANTS[fi]} x{flood:g}" if flood != 1 else ""))
    return Scenario(tuple(tenants), engine=engine, duration_s=duration_s, name="seed000", description=desc, seed=seed)


def rpm_capacity_per_tenant(scenario: Scenario, batch: Optional[int] = None) -> float:
    """Requests per minute per tenant the machine can serve if every tenant sends the same number
    of its own mean requests: 60000 / sum_i cost_i, with
    cost_i = prefill_ms_per_token * mean prompt_i + mean output_i * (iter_base + iter_slope B) / B
    at the nominal batch B (default max_batch). Seed 000: 60000 / 650.2 = 92.3."""
    eng = scenario.engine
    total = sum(float(eng.request_cost_ms(t.prompt.mean, t.output.mean, batch)) for t in scenario.tenants)
    return 60000.0 / total


def operator_rpm_limit(scenario: Scenario, batch: Optional[int] = None, round_to: int = 10) -> int:
    """The equal requests/min quota an operator would set: the per-tenant capacity
    (`rpm_capacity_per_tenant`) rounded up to a round number (a multiple of `round_to`), so that the
    quota never throttles a tenant the machine could serve. Seed 000: 92.3 -> 100 per minute.

    The seed does not state its quota; this rule is the book's reconstruction, and chapter 1 shows
    how the split moves with the quota around it."""
    if isinstance(round_to, bool) or not float(round_to).is_integer() or round_to < 1:
        raise ValueError(f"round_to must be an integer >= 1, got {round_to!r}")
    cap = rpm_capacity_per_tenant(scenario, batch)
    return int(math.ceil(cap / round_to) * round_to)
