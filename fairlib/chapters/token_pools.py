"""Chapter 6's experiments: token pools under a spot flood and under the loss of a replica.

Both run the same compiled policy (``token_pool``): experiment 1 inside the engine loop
(``simulate``: one replica, the policy decides admission at delivery), experiment 2 in the
gateway in front of two simulated replicas (fairlib/sim/cluster.py: ``PolicyGate`` + replicas),
as the live runs do through ``fairlib gateway``.

Workloads: per tenant, Poisson arrivals at the rate that makes its offered machine time ``rho_i``
(machine-ms per ms; chapter 1's unit: ``rate_i = rho_i / c̄_i`` with ``c̄_i = p P̄_i + u Ō_i`` the
machine time of its mean request at the full batch), prompts and outputs lognormal (sigma 0.6 and
0.8) around the tenant's means, outputs cut at ``max_tokens``. The reservation uses the tenant's
true mean output (an oracle of the mean: no gateway knows it), chapter 5's estimator at its fixed
point (:func:`drift_estimate`) or ``max_tokens``.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import pandas as pd

import fairlib
from fairlib.drift import CLAMP, S_TENANT, f_input, lognormal_capped_mean
from fairlib.pools import decode_price_ms, pool_params
from fairlib.sim.cluster import simulate_gateway
from fairlib.sim.engine import SEED000_ENGINE, Engine
from fairlib.sim.limiters import CountAfterResponse

__all__ = ["TenantLoad", "workload", "SPOT_FLOOD", "CAPACITY_LOSS", "CLASS_TIER", "drift_estimate", "flood_run", "flood_runs", "flood_table",
           "by_class", "loss_run", "loss_runs", "loss_phase_table", "loss_series", "SEEDS", "BURSTY", "STEADY", "OVERSHOOT_K",
           "OVERSHOOT_VARIANTS", "overshoot_workload", "overshoot_run", "overshoot_table"]

SEEDS = (0, 1, 2)
PROMPT_SIGMA, OUTPUT_SIGMA = 0.6, 0.8


class TenantLoad:
    """One tenant of an experiment: its class, share, TTFT SLO, request mix and offered load."""

    def __init__(self, name: str, klass: str, share: float, slo_ms: float, prompt: float, output: float,
                 max_tokens: int, rho: float):
        self.name, self.klass, self.share, self.slo_ms = name, klass, float(share), float(slo_ms)
        self.prompt, self.output, self.max_tokens, self.rho = float(prompt), float(output), int(max_tokens), float(rho)

    def mu(self, mean: float, sigma: float) -> float:
        return math.log(mean) - sigma ** 2 / 2

    @property
    def mean_output(self) -> float:
        """The mean output after the cut at max_tokens: E[min(L, max_tokens)] of the lognormal."""
        return lognormal_capped_mean(self.mu(self.output, OUTPUT_SIGMA), OUTPUT_SIGMA, self.max_tokens)

    def cost_ms(self, engine: Engine) -> float:
        return engine.prefill_ms_per_token * self.prompt + decode_price_ms(engine) * self.mean_output


#: chapter 5's tiers for the pool's classes (the estimator's safety factor S per tier)
CLASS_TIER = {"guaranteed": "premium", "elastic": "standard", "spot": "batch"}
RESERVES = ("estimate", "drift", "max_tokens")


def drift_estimate(tl: "TenantLoad", prompt_tokens: np.ndarray, output_tokens: np.ndarray) -> np.ndarray:
    """Chapter 5's estimate (``fairlib.drift``) at its fixed point for one tenant's requests:
    ``T = int(T_base B* S[tier] F_input(P))`` with ``T_base`` = the tenant's ``max_tokens``, the
    tier of its class (:data:`CLASS_TIER`) and ``B* = mean(clamp(O / T_base, 0.25, 3))`` over its
    answers: the value the moving average settles at once it has seen them."""
    b = float(np.clip(np.asarray(output_tokens, float) / tl.max_tokens, *CLAMP).mean()) if len(output_tokens) else 1.0
    s = S_TENANT[CLASS_TIER[tl.klass]]
    f = np.array([f_input(p) for p in prompt_tokens], float)
    return np.maximum(1, (tl.max_tokens * b * s * f).astype(np.int64))


def workload(tenants: Sequence[TenantLoad], engine: Engine, duration_s: float, seed: int,
             reserve: str = "estimate", rho_scale: Optional[dict] = None) -> pd.DataFrame:
    """The request table (arrival order): tenant, prompt, output, ``est_output_tokens`` (the
    tenant's mean output; with ``reserve="drift"`` chapter 5's estimate at its fixed point,
    :func:`drift_estimate`; with ``reserve="max_tokens"`` its max_tokens)."""
    if reserve not in RESERVES:
        raise ValueError(f"reserve must be one of {', '.join(RESERVES)}, got {reserve!r}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 6]))
    parts = []
    for j, tl in enumerate(tenants):
        rate = tl.rho / tl.cost_ms(engine) * 1000.0 * (rho_scale or {}).get(tl.name, 1.0)    # requests/s
        n = rng.poisson(rate * duration_s)
        t = np.sort(rng.uniform(0, duration_s * 1000.0, n))
        p = np.maximum(1, np.round(rng.lognormal(tl.mu(tl.prompt, PROMPT_SIGMA), PROMPT_SIGMA, n))).astype(np.int64)
        o = np.clip(np.round(rng.lognormal(tl.mu(tl.output, OUTPUT_SIGMA), OUTPUT_SIGMA, n)), 1,
                    tl.max_tokens).astype(np.int64)
        est: "np.ndarray | np.int64"
        if reserve == "estimate":
            est = np.int64(round(tl.mean_output))
        elif reserve == "drift":
            est = drift_estimate(tl, p, o)
        else:
            est = np.int64(tl.max_tokens)
        parts.append(pd.DataFrame({"arrival_ms": t, "tenant": j, "prompt_tokens": p, "output_tokens": o,
                                   "est_output_tokens": est}))
    df = pd.concat(parts, ignore_index=True).sort_values(["arrival_ms", "tenant"], kind="stable")
    return df.reset_index(drop=True)


# --- experiment 1: spot flood ----------------------------------------------------------------
#: guaranteed and elastic at their entitlements (rho = share), a spot tenant flooding: 2x overload
SPOT_FLOOD = (
    TenantLoad("interactive", "guaranteed", 0.3, 1000.0, 400, 120, 512, 0.3),
    TenantLoad("team", "elastic", 0.5, 5000.0, 800, 250, 1024, 0.5),
    TenantLoad("flood", "spot", 0.0, 60000.0, 300, 300, 1024, 1.2),
)
FLOOD_DURATION_S = 300.0
FLOOD_POLICIES = ("no admission (FCFS)", "pool, mean answer (oracle)", "pool, chapter 5's estimate",
                  "pool, max_tokens")


def _pool(tenants, engine, replicas=1, **kw) -> dict:
    return pool_params(engine, [t.klass for t in tenants], [t.share for t in tenants], [t.slo_ms for t in tenants],
                       replicas=replicas, **kw)


def flood_run(seed: int, variant: str, engine: Engine = SEED000_ENGINE, tenants=SPOT_FLOOD,
              duration_s: float = FLOOD_DURATION_S, **pool_kw) -> dict:
    """One run of experiment 1 on one replica (``simulate``): the requests to the end (latency) and
    the work served within the duration (the prompts admitted and the output tokens emitted by then,
    :func:`served_work_ms`)."""
    if variant not in FLOOD_POLICIES:
        raise ValueError(f"variant must be one of {', '.join(FLOOD_POLICIES)}, got {variant!r}")
    reserve = ("max_tokens" if variant.endswith("max_tokens") else "drift" if "chapter 5" in variant
               else "estimate")
    df = workload(tenants, engine, duration_s, seed, reserve)
    names = [t.name for t in tenants]
    if variant.startswith("no admission"):
        policy, params = "fcfs", {}
    else:
        policy, params = "token_pool", _pool(tenants, engine, **pool_kw)
    full = fairlib.simulate(df, engine, policy, None, n_tenants=len(tenants), tenant_names=names, **params)
    window = fairlib.simulate(df, engine, policy, duration_s * 1000.0, n_tenants=len(tenants), tenant_names=names,
                              **params)
    w = window.requests
    prompt = int(w.loc[w["admitted_ms"].notna(), "prompt_tokens"].sum())
    decode = int(window.run["decode_tokens"])
    return {"seed": seed, "variant": variant, "requests": full.requests, "tenants": names,
            "served_tokens": decode, "served_prompt_tokens": prompt,
            "served_work_ms": served_work_ms(engine, prompt, decode), "params": params}


def served_work_ms(engine: Engine, prompt_tokens: float, output_tokens: float) -> float:
    """What was served, priced at the replica's full-batch rates: p P + u(max_batch) O machine-ms
    (the machine time those tokens take when the batch is full; a mix of more prompt per answer
    is not less work)."""
    return engine.prefill_ms_per_token * prompt_tokens + decode_price_ms(engine) * output_tokens


def flood_runs(seeds: Sequence[int] = SEEDS, **kw) -> list:
    return [flood_run(s, v, **kw) for v in FLOOD_POLICIES for s in seeds]


def _ttft_s(req: pd.DataFrame) -> np.ndarray:
    return ((req["first_token_ms"] - req["arrival_ms"]) / 1000.0).to_numpy()


def flood_table(runs: Sequence[dict], tenants=SPOT_FLOOD) -> pd.DataFrame:
    """Per variant (mean over seeds, and the spread): each class's P99 TTFT and its requests
    answered 429, the work served in the duration relative to FCFS (:func:`served_work_ms`)."""
    g = next(i for i, t in enumerate(tenants) if t.klass == "guaranteed")
    e = next(i for i, t in enumerate(tenants) if t.klass == "elastic")
    s = next(i for i, t in enumerate(tenants) if t.klass == "spot")
    base = {r["seed"]: r["served_work_ms"] for r in runs if r["variant"].startswith("no admission")}
    rows = []
    for r in runs:
        req = r["requests"]
        tt = _ttft_s(req)
        ten = req["tenant"].to_numpy()
        rej = req["rejected"].to_numpy()
        row = {"variant": r["variant"], "seed": r["seed"]}
        for label, j in (("guaranteed", g), ("elastic", e), ("spot", s)):
            ok = (ten == j) & ~rej
            row[f"{label} p99 TTFT (s)"] = float(np.percentile(tt[ok], 99)) if ok.any() else np.nan
            row[f"{label} 429 (%)"] = 100.0 * float(rej[ten == j].mean()) if (ten == j).any() else np.nan
        row["work served vs FCFS (%)"] = 100.0 * r["served_work_ms"] / base[r["seed"]]
        rows.append(row)
    per = pd.DataFrame(rows)
    cols = [c for c in per.columns if c not in ("variant", "seed")]
    mean = per.groupby("variant", sort=False)[cols].mean()
    sd = per.groupby("variant", sort=False)[cols].std(ddof=1)
    mean.attrs["sd"] = sd
    mean.attrs["per_seed"] = per
    return mean


def by_class(table: pd.DataFrame) -> pd.DataFrame:
    """A flood table (:func:`flood_table`, or the live one) with one column group per class:
    ``guaranteed p99 TTFT (s)`` -> (``guaranteed``, ``p99 TTFT (s)``); other columns under ``all``."""
    classes = ("guaranteed", "elastic", "spot")
    cols = [tuple(c.split(" ", 1)) if c.split(" ", 1)[0] in classes else ("all", c) for c in table.columns]
    out = table.copy()
    out.columns = pd.MultiIndex.from_tuples(cols)
    return out


# --- experiment 2: capacity loss ---------------------------------------------------------------
#: three elastic workloads (the paper's: coding assistant 500 ms, reports 5 s, batch data 30 s),
#: each offering 0.3 of a replica's machine time x 2 replicas: 90% of the pool, 180% of one replica
CAPACITY_LOSS = (
    TenantLoad("coding", "elastic", 1 / 3, 500.0, 600, 80, 512, 0.6),
    TenantLoad("reports", "elastic", 1 / 3, 5000.0, 1000, 300, 1024, 0.6),
    TenantLoad("batch", "elastic", 1 / 3, 30000.0, 400, 400, 1024, 0.6),
)
LOSS_DOWN_S, LOSS_UP_S, LOSS_END_S = 120.0, 240.0, 420.0
#: the pool's debt weight beta in experiment 2 (1: the debt's clipped term weighs as much as the
#: SLO urgency; 0: no debt); the chapter shows the range
DEBT_WEIGHTS = {"pool": 0.25, "pool, debt weight 1": 1.0, "pool without debt": 0.0}
LOSS_VARIANTS = ("no admission (FCFS)",) + tuple(DEBT_WEIGHTS)
PHASES = (("before", 0.0, LOSS_DOWN_S), ("one replica", LOSS_DOWN_S, LOSS_UP_S), ("after", LOSS_UP_S, LOSS_END_S))


def loss_run(seed: int, variant: str, engine: Engine = SEED000_ENGINE, tenants=CAPACITY_LOSS, **pool_kw):
    """One run of experiment 2: the gateway in front of two replicas, replica 1 down from
    LOSS_DOWN_S to LOSS_UP_S; sampled every second."""
    if variant not in LOSS_VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(LOSS_VARIANTS)}, got {variant!r}")
    df = workload(tenants, engine, LOSS_END_S, seed)
    if variant.startswith("no admission"):
        policy, params = "fcfs", {}
    else:
        kw = {"debt_weight": DEBT_WEIGHTS[variant], **pool_kw}
        policy, params = "token_pool", _pool(tenants, engine, replicas=2, **kw)
    events = [(LOSS_DOWN_S * 1000.0, 1, "down"), (LOSS_UP_S * 1000.0, 1, "up")]
    run = simulate_gateway(df, engine, 2, policy, params, events, horizon_ms=LOSS_END_S * 1000.0,
                           n_tenants=len(tenants), sample_ms=1000.0)
    return {"seed": seed, "variant": variant, "run": run, "tenants": [t.name for t in tenants], "params": params}


def loss_runs(seeds: Sequence[int] = SEEDS, **kw) -> list:
    return [loss_run(s, v, **kw) for v in LOSS_VARIANTS for s in seeds]


def loss_phase_table(runs: Sequence[dict], tenants=CAPACITY_LOSS) -> pd.DataFrame:
    """Per variant, phase and tenant (mean over seeds): service (machine-ms per ms: the replicas'
    time it got), requests answered 429 (%), TTFT p50 and the share of its answered requests
    within its SLO (%), by arrival in the phase."""
    rows = []
    for r in runs:
        req, smp = r["run"].requests, r["run"].samples
        for ph, a, b in PHASES:
            in_ph = (req["arrival_ms"] >= a * 1000) & (req["arrival_ms"] < b * 1000)
            for j, tl in enumerate(tenants):
                m = smp[smp["tenant"] == j].set_index("t_ms")["machine_ms"]
                served = (m.loc[b * 1000] - m.loc[a * 1000]) / ((b - a) * 1000)
                mine = req[in_ph & (req["tenant"] == j)]
                ans = mine[~mine["rejected"]]
                tt = (ans["first_token_ms"] - ans["arrival_ms"]).to_numpy()
                got = np.isfinite(tt)
                rows.append({"variant": r["variant"], "seed": r["seed"], "phase": ph, "tenant": tl.name,
                             "service": served, "429 (%)": 100.0 * float(mine["rejected"].mean()),
                             "TTFT p50 (s)": float(np.median(tt[got])) / 1000 if got.any() else np.nan,
                             "within SLO (%)": 100.0 * float((tt[got] <= tl.slo_ms).sum() / max(1, len(tt)))})
    per = pd.DataFrame(rows)
    out = per.groupby(["variant", "phase", "tenant"], sort=False)[["service", "429 (%)", "TTFT p50 (s)",
                                                                   "within SLO (%)"]].mean()
    out.attrs["per_seed"] = per
    return out


def loss_series(run: dict) -> pd.DataFrame:
    """One run's samples with tenant names and each tenant's service rate over the last 5 s."""
    smp = run["run"].samples.copy()
    smp["tenant"] = [run["tenants"][j] for j in smp["tenant"]]
    smp["t_s"] = smp["t_ms"] / 1000.0
    smp = smp.sort_values(["tenant", "t_ms"])
    smp["service"] = smp.groupby("tenant")["machine_ms"].diff(5) / 5000.0
    return smp


# --- counting after the response ------------------------------------------------------------------
#: two elastic tenants with half a replica each: one sends bursts of K identical requests at once,
#: offering twice its share, the other arrives steadily (Poisson) at 1.2 times its share
BURSTY = TenantLoad("bursty", "elastic", 0.5, 5000.0, 400, 120, 512, 1.0)
STEADY = TenantLoad("steady", "elastic", 0.5, 5000.0, 400, 120, 512, 0.6)
OVERSHOOT_K = (1, 4, 16, 64)
OVERSHOOT_WINDOW_MS = 60000.0
OVERSHOOT_DURATION_S = 300.0
OVERSHOOT_VARIANTS = ("counted after the response", "pool, reserved at admission")


def overshoot_workload(K: int, engine: Engine, seed: int, duration_s: float = OVERSHOOT_DURATION_S) -> pd.DataFrame:
    """The bursty tenant's bursts (``K`` requests of exactly its mean prompt and answer every
    ``K c / rho`` ms, the first at a seeded offset) and the steady tenant's Poisson arrivals; the
    reservations are the true answers (no estimate error: what is compared is when each gateway
    counts)."""
    if isinstance(K, bool) or not float(K).is_integer() or K < 1:
        raise ValueError(f"K (the burst size) must be an integer >= 1, got {K!r}")
    K = int(K)
    c = engine.prefill_ms_per_token * BURSTY.prompt + decode_price_ms(engine) * BURSTY.output
    period = K * c / BURSTY.rho
    rng = np.random.default_rng(np.random.SeedSequence([seed, 7, K]))
    starts = np.arange(rng.uniform(0, period), duration_s * 1000.0, period)
    t = np.repeat(starts, K)
    bursts = pd.DataFrame({"arrival_ms": t, "tenant": 0, "prompt_tokens": np.int64(BURSTY.prompt),
                           "output_tokens": np.int64(BURSTY.output), "est_output_tokens": np.int64(BURSTY.output)})
    steady = workload([STEADY], engine, duration_s, seed).assign(tenant=1)
    steady["est_output_tokens"] = steady["output_tokens"]
    df = pd.concat([bursts, steady], ignore_index=True).sort_values(["arrival_ms", "tenant"], kind="stable")
    return df.reset_index(drop=True)


def overshoot_run(K: int, variant: str, engine: Engine = SEED000_ENGINE, seed: int = 0) -> dict:
    """One replica behind a gateway: either a limit of each tenant's share of the window's machine
    time counted after the response (``fairlib.sim.limiters.CountAfterResponse``, in front of an
    FCFS gate), or the pool; sampled every second."""
    if variant not in OVERSHOOT_VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(OVERSHOOT_VARIANTS)}, got {variant!r}")
    df = overshoot_workload(K, engine, seed)
    tenants = (BURSTY, STEADY)
    horizon = OVERSHOOT_DURATION_S * 1000.0
    if variant.startswith("counted"):
        lim = CountAfterResponse([t.share * OVERSHOOT_WINDOW_MS for t in tenants], OVERSHOOT_WINDOW_MS,
                                 engine.prefill_ms_per_token, decode_price_ms(engine))
        run = simulate_gateway(df, engine, 1, "fcfs", {}, horizon_ms=horizon, n_tenants=2, sample_ms=1000.0,
                               limiter=lim)
    else:
        run = simulate_gateway(df, engine, 1, "token_pool", _pool(tenants, engine), horizon_ms=horizon,
                               n_tenants=2, sample_ms=1000.0)
    c = engine.prefill_ms_per_token * BURSTY.prompt + decode_price_ms(engine) * BURSTY.output
    return {"K": int(K), "variant": variant, "seed": seed, "run": run, "request_ms": c}


def overshoot_table(runs: Sequence[dict]) -> pd.DataFrame:
    """Per burst size and variant (mean over the runs' seeds; ``attrs["sd"]``, ``attrs["per_seed"]``):
    the machine time the bursty tenant got in its largest minute against its entitlement
    (``e W``, %), that excess in requests' cost (``c``), and the steady tenant's smallest minute
    against its own entitlement (%); minutes ``[kW, (k+1)W)``."""
    rows = []
    for r in runs:
        smp = r["run"].samples
        edges = np.arange(0.0, OVERSHOOT_DURATION_S * 1000.0 + 1, OVERSHOOT_WINDOW_MS)
        got = {}
        for j, tl in enumerate((BURSTY, STEADY)):
            m = smp[smp["tenant"] == j].set_index("t_ms")["machine_ms"]
            per = np.diff(m.reindex(edges).to_numpy(float))
            got[tl.name] = per / (tl.share * OVERSHOOT_WINDOW_MS)
        ent = BURSTY.share * OVERSHOOT_WINDOW_MS
        rows.append({"burst size K": r["K"], "variant": r["variant"], "seed": r["seed"],
                     "bursty: largest minute (% of entitlement)": 100.0 * got["bursty"].max(),
                     "bursty: excess (requests)": max(0.0, got["bursty"].max() - 1.0) * ent / r["request_ms"],
                     "steady: smallest minute (% of entitlement)": 100.0 * got["steady"].min()})
    per = pd.DataFrame(rows)
    out = per.groupby(["burst size K", "variant"], sort=False).mean(numeric_only=True).drop(columns="seed")
    out.attrs["sd"] = per.groupby(["burst size K", "variant"], sort=False).std(ddof=1, numeric_only=True)
    out.attrs["per_seed"] = per
    return out
