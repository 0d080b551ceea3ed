"""Shared test harness for the engine model: the compiled simulator behind the reference's
calling convention, element-wise comparison of two runs, and seeded random workloads.

``compiled_simulate`` has exactly the signature and return shape of
``reference_sim.reference_simulate`` (keyword engine parameters, ``(req, ten, run)`` dicts of
lists), so every test written against one runs unchanged against the other.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from hypothesis import strategies as st

import fairlib
from fairlib.sim.policies import POLICIES
from reference_sim import reference_simulate

#: Every registered policy, in registry order (a policy's seeds in ``random_case`` follow its place).
#: Each needs a parameter generator below (``RANDOM_PARAMS``, ``HYPOTHESIS_PARAMS``).
POLICY_NAMES = tuple(POLICIES)

REQ_FIELDS = ("rejected", "admitted_ms", "first_token_ms", "finish_ms", "generated", "charged_ms", "preemptions")
TEN_FIELDS = ("machine_ms", "prefill_ms", "decode_ms", "decode_tokens", "requests_admitted", "requests_finished",
              "requests_rejected", "share")
RUN_FIELDS = ("busy_ms", "iterations", "decode_tokens")
ENGINE_FIELDS = ("iter_base_ms", "iter_slope_ms", "prefill_ms_per_token", "max_batch", "max_prefill_tokens",
                 "kv_capacity_tokens", "batching", "fill_wait_ms")


def compiled_result(requests, *, n_tenants, iter_base_ms, iter_slope_ms, prefill_ms_per_token, max_batch,
                    max_prefill_tokens=None, kv_capacity_tokens=None, policy="fcfs", horizon_ms=math.inf,
                    batching="continuous", fill_wait_ms=10.0, **params) -> fairlib.SimResult:
    """``fairlib.simulate`` called with the reference's keyword convention."""
    engine = fairlib.Engine(iter_base_ms=iter_base_ms, iter_slope_ms=iter_slope_ms,
                            prefill_ms_per_token=prefill_ms_per_token, max_batch=max_batch,
                            max_prefill_tokens=max_prefill_tokens, kv_capacity_tokens=kv_capacity_tokens,
                            batching=batching, fill_wait_ms=fill_wait_ms)
    df = requests if isinstance(requests, pd.DataFrame) else pd.DataFrame(requests)
    return fairlib.simulate(df, engine=engine, policy=policy, horizon_ms=horizon_ms, n_tenants=n_tenants, **params)


def to_reference_shape(res: fairlib.SimResult):
    """A SimResult as the reference's (req, ten, run) dicts of plain Python lists."""
    req = {f: res.requests[f].to_numpy().tolist() for f in REQ_FIELDS}
    ten = {f: res.tenants[f].to_numpy().tolist() for f in TEN_FIELDS}
    run = {f: res.run[f] for f in RUN_FIELDS}
    return req, ten, run


def compiled_simulate(requests, **kw):
    """Drop-in replacement for ``reference_simulate`` backed by ``fairlib.simulate``."""
    return to_reference_shape(compiled_result(requests, **kw))


SIMULATORS = {"reference": reference_simulate, "compiled": compiled_simulate}


# --------------------------------------------------------------------------------------------
# comparison
# --------------------------------------------------------------------------------------------
def _close(a, b, rtol):
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.shape != b.shape:
        return np.zeros(max(a.size, b.size), bool)
    both_nan = np.isnan(a) & np.isnan(b)
    with np.errstate(invalid="ignore"):
        ok = (a == b) | (np.abs(a - b) <= rtol * np.maximum(np.abs(a), np.abs(b)))
    return ok | both_nan


def disagreements(x, y, rtol=1e-9):
    """Field-by-field differences of two (req, ten, run) results: a list of readable lines."""
    out = []
    for part, fields, a, b in (("request", REQ_FIELDS, x[0], y[0]), ("tenant", TEN_FIELDS, x[1], y[1])):
        for f in fields:
            ok = _close(a[f], b[f], rtol)
            if not ok.all():
                idx = np.flatnonzero(~ok)
                first = int(idx[0])
                out.append(f"{part} {f}: {len(idx)} differ, first at {part} {first}: "
                           f"{a[f][first] if first < len(a[f]) else '-'} vs {b[f][first] if first < len(b[f]) else '-'}")
    for f in RUN_FIELDS:
        if not _close([x[2][f]], [y[2][f]], rtol).all():
            out.append(f"run {f}: {x[2][f]} vs {y[2][f]}")
    return out


def assert_agree(x, y, rtol=1e-9, context=""):
    diff = disagreements(x, y, rtol)
    assert not diff, (context + "\n" if context else "") + "\n".join(diff)


# --------------------------------------------------------------------------------------------
# seeded random workloads
# --------------------------------------------------------------------------------------------
def random_arrivals(rng, n, span_mode):
    """Integer-ms arrivals (exact ties), with bursts and idle gaps; "long" spans minutes (so rpm
    windows expire); "float" uses non-integer times."""
    if span_mode == "float":
        gaps = rng.exponential(rng.uniform(2, 40), n)
        gaps[rng.random(n) < 0.2] = 0.0
    else:
        scale = 2500.0 if span_mode == "long" else 15.0
        gaps = np.floor(rng.exponential(scale, n))
        gaps[rng.random(n) < 0.3] = 0.0                              # exact ties
        idle = rng.random(n) < 0.06
        gaps[idle] += rng.integers(200, 3000, idle.sum())            # idle gaps
    return np.cumsum(gaps)


def random_engine(rng):
    if rng.random() < 0.4:       # round values: many exact ties in times and counters
        base, slope, pre = (float(rng.choice([0.0, 1.0, 5.0, 10.0])), float(rng.choice([0.0, 0.5, 1.0, 2.0])),
                            float(rng.choice([0.0, 0.05, 0.1, 0.25])))
        if base + slope == 0:
            base = 10.0
    else:
        base, slope, pre = rng.uniform(0.5, 12.0), rng.uniform(0.0, 2.0), rng.uniform(0.0, 0.3)
    return dict(iter_base_ms=base, iter_slope_ms=slope, prefill_ms_per_token=pre)


def random_case(seed, policy, n_max=80):
    """One random (requests, simulate keyword arguments) for ``policy``, seeded."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), POLICY_NAMES.index(policy), 17]))
    n = int(rng.integers(0, n_max + 1)) if rng.random() < 0.9 else int(rng.integers(0, 6))
    n_tenants = int(rng.integers(1, 6))
    n_classes = int(rng.integers(1, 4))
    span_mode = rng.choice(["int", "int", "long", "float"])
    arrival = random_arrivals(rng, n, span_mode)
    prompt = rng.integers(1, int(rng.choice([8, 40, 120])) + 1, n)
    output = 1 + np.minimum(rng.geometric(1.0 / rng.uniform(1.5, 15.0), n) - 1, 60)
    est = np.maximum(1, output + rng.integers(-3, 4, n)) if rng.random() < 0.5 else rng.integers(1, 30, n)
    df = pd.DataFrame({
        "arrival_ms": arrival.astype(float),
        "tenant": rng.integers(0, n_tenants, n),
        "prompt_tokens": prompt, "output_tokens": output, "est_output_tokens": est,
        "klass": rng.integers(0, n_classes, n), "priority": rng.integers(-2, 4, n),
    })
    kw = dict(n_tenants=n_tenants, policy=policy, **random_engine(rng))
    kw["max_batch"] = int(rng.integers(1, 7)) if rng.random() < 0.85 else int(rng.choice([12, 24]))
    # every third seed a small KV cache (preemptions, some rejections), every fourth a prefill
    # budget (prompts too long for it are rejected), every fifth a horizon that cuts the run;
    # the other seeds draw each of these at random
    if n and (seed % 4 == 1 or rng.random() < 0.25):
        kw["max_prefill_tokens"] = int(rng.integers(max(1, int(prompt.max()) // 2), 2 * int(prompt.max()) + 1))
    if n and (seed % 3 == 0 or rng.random() < 0.3):
        need = prompt + output
        kw["kv_capacity_tokens"] = int(rng.integers(max(2, int(np.median(need))), int(need.max()) * 2 + 2))
        if rng.random() < 0.5:  # a busier batch contends for the small cache
            kw["max_batch"] = int(rng.integers(3, 7))
    if seed % 5 == 2 or rng.random() < 0.25:
        end = float(arrival[-1]) if n else 1.0
        kw["horizon_ms"] = float(rng.uniform(0.05, 1.2) * (end + 50.0)) + 1e-3
    kw.update(random_params(rng, policy, n_tenants, n_classes))
    if policy == "priority" and rng.random() < 0.3:
        df = df.drop(columns="priority")   # falls back to klass
    # every fourth case (from its own generator, so the draws above are unchanged): static batches
    side = np.random.default_rng(np.random.SeedSequence([int(seed), POLICY_NAMES.index(policy), 29]))
    if side.random() < 0.25:
        kw["batching"] = "static"
        kw["fill_wait_ms"] = float(side.choice([0.0, 5.0, 10.0, 60.0]))
    return df, kw


def _weights(rng, n_tenants):
    return [float(x) for x in rng.choice([0.5, 1.0, 2.0, 3.0], n_tenants)] if rng.random() < 0.5 \
        else [float(x) for x in rng.uniform(0.2, 5.0, n_tenants)]


def _vtc_params(rng, n_tenants, n_classes):
    p = {}
    if rng.random() < 0.7:
        p["wp"] = float(rng.choice([0.0, 0.5, 1.0, 2.0])) if rng.random() < 0.5 else float(rng.uniform(0, 3))
        p["wq"] = float(rng.choice([0.0, 1.0, 2.0, 4.0])) if rng.random() < 0.5 else float(rng.uniform(0, 3))
    if rng.random() < 0.6:
        p["weights"] = _weights(rng, n_tenants)
    return p


def _weighted_params(rng, n_tenants, n_classes):
    w = [int(x) for x in rng.integers(0, 6, n_classes + int(rng.integers(0, 2)))]
    if sum(w) == 0:
        w[0] = 1
    return {"w": w}


def _vtc_predict_params(rng, n_tenants, n_classes):
    p = _vtc_params(rng, n_tenants, n_classes)
    if rng.random() < 0.6:
        p["window"] = int(rng.choice([1, 2, 5, 8]))
    if rng.random() < 0.5:
        p["init"] = float(rng.choice([0.0, 1.0, 4.0])) if rng.random() < 0.5 else float(rng.uniform(0, 20))
    return p


def _none(rng, n_tenants, n_classes):
    return {}


def _token_pool_params(rng, n_tenants, n_classes):
    classes = [str(c) for c in rng.choice(["guaranteed", "elastic", "spot"], n_tenants)]
    raw = rng.uniform(0.05, 1.0, n_tenants) * np.array([c != "spot" for c in classes])
    scale = float(rng.choice([0.3, 0.7, 1.0]))
    shares = [float(x / raw.sum() * scale) if raw.sum() > 0 else 0.0 for x in raw]
    p = {"classes": classes, "shares": shares, "decode_price_ms": float(rng.choice([0.5, 2.0, 10.0])),
         "replica_slots": int(rng.integers(1, 7))}
    if rng.random() < 0.7:
        p["slo_ms"] = [float(x) for x in rng.choice([20.0, 200.0, 5000.0], n_tenants)]
    if rng.random() < 0.7:
        p["pool_horizon_ms"] = float(rng.choice([20.0, 100.0, 1000.0, 1e5]))
    if rng.random() < 0.5:
        p["half_life_ms"] = float(rng.choice([10.0, 500.0, 1e4]))
    if rng.random() < 0.4:
        p["kv_tokens"] = int(rng.integers(20, 200))
    if rng.random() < 0.5:
        p["prefill_price_ms"] = float(rng.choice([0.0, 0.05, 0.5]))
    if rng.random() < 0.2:
        p["replicas"] = int(rng.choice([0, 2]))
    if rng.random() < 0.3:
        p["guaranteed_headroom"] = int(rng.integers(0, 3))
    return p


#: policy -> f(rng, n_tenants, n_classes) -> random simulate() keyword parameters
RANDOM_PARAMS = {
    "fcfs": _none,
    "rpm_quota": lambda rng, n_t, n_c: {"limit": int(rng.integers(1, 21))},
    "vtc": _vtc_params,
    "lcf": _vtc_params,
    "residency": lambda rng, n_t, n_c: {"weights": _weights(rng, n_t)} if rng.random() < 0.6 else {},
    "slot_cap": lambda rng, n_t, n_c: {"cap": int(rng.integers(1, 5))},
    "priority": _none,
    "weighted": _weighted_params,
    "sjf": _none,
    "aging": lambda rng, n_t, n_c: {"rate": float(rng.choice([0.0, 0.01, 5.0]))},
    "rr": _none,
    "vtc_predict": _vtc_predict_params,
    "token_pool": _token_pool_params,
}


def generator(table, policy):
    """``table[policy]``, or an error naming the policy the harness does not know."""
    if policy not in table:
        raise ValueError(f"tests/sim_harness.py has no parameter generator for policy {policy!r}: "
                       f"add it to RANDOM_PARAMS and HYPOTHESIS_PARAMS")
    return table[policy]


def random_params(rng, policy, n_tenants, n_classes):
    return generator(RANDOM_PARAMS, policy)(rng, n_tenants, n_classes)


# --------------------------------------------------------------------------------------------
# hypothesis: the same kind of workload, drawn (and shrunk) by hypothesis
# --------------------------------------------------------------------------------------------
@st.composite
def workloads(draw, policy, max_requests=40):
    """(requests DataFrame, simulate keyword arguments) for ``policy``: integer-ms arrivals with
    exact ties and idle gaps (optionally scaled to non-integer times), several tenants and
    classes, priorities and output estimates, a small max_batch, and optionally a prefill budget,
    a small KV cache and a horizon that cuts the run."""
    n_tenants = draw(st.integers(1, 4), label="n_tenants")
    n_classes = draw(st.integers(1, 3), label="n_classes")
    gap = st.one_of(st.just(0), st.integers(0, 25), st.integers(200, 5000))
    row = st.tuples(gap, st.integers(0, n_tenants - 1), st.integers(1, 50), st.integers(1, 20),
                    st.integers(1, 25), st.integers(0, n_classes - 1), st.integers(-2, 3))
    n = draw(st.integers(0, max_requests), label="n_requests")
    rows = draw(st.lists(row, min_size=n, max_size=n), label="rows")
    scale = draw(st.sampled_from([1.0, 1.0, 0.37, 13.0]), label="time scale")
    n = len(rows)
    arrival = np.cumsum([r[0] for r in rows]).astype(float) * scale
    df = pd.DataFrame({
        "arrival_ms": arrival,
        "tenant": np.array([r[1] for r in rows], np.int64),
        "prompt_tokens": np.array([r[2] for r in rows], np.int64),
        "output_tokens": np.array([r[3] for r in rows], np.int64),
        "est_output_tokens": np.array([r[4] for r in rows], np.int64),
        "klass": np.array([r[5] for r in rows], np.int64),
        "priority": np.array([r[6] for r in rows], np.int64),
    })
    cost = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0, 10.0]), st.floats(0.05, 12.0))
    base, slope = draw(cost, label="iter_base_ms"), draw(cost, label="iter_slope_ms")
    if base + slope <= 0:
        base = 10.0
    pre = draw(st.one_of(st.sampled_from([0.0, 0.1, 0.25]), st.floats(0.001, 0.5)),
               label="prefill_ms_per_token")
    kw = dict(n_tenants=n_tenants, policy=policy, iter_base_ms=base, iter_slope_ms=slope,
              prefill_ms_per_token=pre, max_batch=draw(st.integers(1, 6), label="max_batch"))
    if n:
        max_prompt = int(df["prompt_tokens"].max())
        mpt = draw(st.none() | st.integers(1, 2 * max_prompt), label="max_prefill_tokens")
        if mpt is not None:
            kw["max_prefill_tokens"] = mpt
        max_need = int((df["prompt_tokens"] + df["output_tokens"]).max())
        # about two thirds of the cases get a KV cache barely larger than the largest request
        # (or smaller: those requests are rejected), so that running sequences outgrow it
        kv = draw(st.none() | st.integers(max(2, max_need // 2), max_need + 10) | st.integers(max_need, max_need + 30),
                  label="kv_capacity_tokens")
        if kv is not None:
            kw["kv_capacity_tokens"] = kv
    horizon = draw(st.none() | st.floats(0.01, 1.5), label="horizon (fraction of the last arrival + 100 ms)")
    if horizon is not None:
        kw["horizon_ms"] = horizon * (float(arrival[-1]) if n else 0.0) + horizon * 100.0
    kw.update(draw(policy_params(policy, n_tenants, n_classes), label="policy params"))
    if policy == "priority" and draw(st.booleans(), label="drop priority column"):
        df = df.drop(columns="priority")
    return df, kw


def _st_weights(n_tenants):
    weight = st.one_of(st.sampled_from([0.5, 1.0, 2.0, 3.0]), st.floats(0.1, 8.0))
    return st.lists(weight, min_size=n_tenants, max_size=n_tenants)


def _st_rate():
    return st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.floats(0.0, 4.0))


def _st_vtc(n_tenants, n_classes):
    return st.fixed_dictionaries({}, optional={"wp": _st_rate(), "wq": _st_rate(), "weights": _st_weights(n_tenants)})


def _st_none(n_tenants, n_classes):
    return st.just({})


@st.composite
def _st_token_pool(draw, n_tenants, n_classes):
    classes = draw(st.lists(st.sampled_from(["guaranteed", "elastic", "spot"]), min_size=n_tenants,
                            max_size=n_tenants), label="classes")
    raw = draw(st.lists(st.floats(0.05, 1.0), min_size=n_tenants, max_size=n_tenants), label="raw shares")
    raw = [x if c != "spot" else 0.0 for x, c in zip(raw, classes)]
    scale = draw(st.sampled_from([0.3, 1.0]), label="shares sum")
    total = sum(raw)
    p = {"classes": classes, "shares": [x / total * scale if total > 0 else 0.0 for x in raw],
         "decode_price_ms": draw(st.sampled_from([0.5, 2.0, 10.0]), label="u"),
         "replica_slots": draw(st.integers(1, 6), label="slots")}
    optional = {
        "slo_ms": st.lists(st.sampled_from([5.0, 50.0, 1000.0]), min_size=n_tenants, max_size=n_tenants),
        "pool_horizon_ms": st.sampled_from([10.0, 100.0, 1000.0, 1e5]),
        "half_life_ms": st.sampled_from([10.0, 500.0, 1e4]),
        "kv_tokens": st.integers(10, 150),
        "prefill_price_ms": st.sampled_from([0.0, 0.05, 0.5]),
        "replicas": st.sampled_from([0, 1, 2]),
        "debt_weight": st.sampled_from([0.0, 1.0]),
        "guaranteed_headroom": st.integers(0, 3),
    }
    p.update(draw(st.fixed_dictionaries({}, optional=optional), label="optional"))
    return p


#: policy -> f(n_tenants, n_classes) -> hypothesis strategy of simulate() keyword parameters
HYPOTHESIS_PARAMS = {
    "fcfs": _st_none,
    "rpm_quota": lambda n_t, n_c: st.fixed_dictionaries({"limit": st.integers(1, 20)}),
    "vtc": _st_vtc,
    "lcf": _st_vtc,
    "residency": lambda n_t, n_c: st.fixed_dictionaries({}, optional={"weights": _st_weights(n_t)}),
    "slot_cap": lambda n_t, n_c: st.fixed_dictionaries({"cap": st.integers(1, 4)}),
    "priority": _st_none,
    "weighted": lambda n_t, n_c: st.fixed_dictionaries(
        {"w": st.lists(st.integers(0, 5), min_size=n_c, max_size=n_c + 1).filter(lambda v: sum(v) > 0)}),
    "sjf": _st_none,
    "aging": lambda n_t, n_c: st.fixed_dictionaries({"rate": st.sampled_from([0.0, 0.01, 5.0])}),
    "rr": _st_none,
    "vtc_predict": lambda n_t, n_c: st.fixed_dictionaries({}, optional={
        "wp": _st_rate(), "wq": _st_rate(), "weights": _st_weights(n_t), "window": st.integers(1, 8),
        "init": st.one_of(st.sampled_from([0.0, 1.0, 4.0]), st.floats(0.0, 20.0))}),
    "token_pool": _st_token_pool,
}


def policy_params(policy, n_tenants, n_classes):
    return generator(HYPOTHESIS_PARAMS, policy)(n_tenants, n_classes)
