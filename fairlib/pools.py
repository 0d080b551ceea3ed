"""Token pools (chapter 6): a replica's capacity as three resources, and the pool's parameters.

The paper (Cunningham 2026, ../shared/reference/token-pools.md) names the resources, the classes
and the debt; it publishes no formula. The book's rules, implemented once in the compiled policy
``token_pool`` (fairlib/sim/policies/token_pool.py, which the simulator and the gateway both run):

Capacity of one replica with the cost model ``dt = a + b B + p P`` (fairlib/sim/engine.py), at most
``r`` sequences (concurrency) and ``X`` KV tokens, for a mix of mean prompt ``P̄`` and output ``Ō``:

    batch it can hold   B* = min(r, X / (P̄ + Ō / 2))      (a sequence holds P̄ + Ō/2 tokens on average)
    binds               concurrency if r <= X / (P̄ + Ō/2), else KV
    machine time        c̄ = p P̄ + u(B*) Ō ms per request,  u(B) = (a + b B) / B
    token throughput    λ = 1000 Ō / c̄ output tokens/s (and 1000 P̄ / c̄ prompt tokens/s)

A pool of R replicas supplies R machine-ms per ms (chapter 1: the charges add up to the busy
time). Reservations and entitlements are in machine-ms; ``/ u(B*)`` turns them into output tokens.

Reservation of a request at admission: ``c = p P + u Ê`` machine-ms (Ê: the estimated output,
chapter 5's estimator, or ``max_tokens``), 1 slot, ``P + Ê`` KV tokens. Admission (429 or not),
dispatch priority, settlement and debt: the rules in the policy's docstring.
"""
from __future__ import annotations

import math
import re
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from fairlib.sim.engine import Engine
from fairlib.sim.policies.token_pool import CLASS_WEIGHT, CLASSES

__all__ = ["replica_capacity", "capacity_table", "decode_price_ms", "pool_params", "priority", "realised_overshoot",
           "kv_capacity_from_metrics", "CLASSES"]


def decode_price_ms(engine: Engine, batch: Optional[float] = None) -> float:
    """u(B) = (a + b B) / B: the machine-ms one output token costs at batch B (default max_batch)."""
    b = float(engine.max_batch if batch is None else batch)
    if not b > 0:
        raise ValueError(f"batch must be > 0, got {batch!r}")
    return (engine.iter_base_ms + engine.iter_slope_ms * b) / b


def replica_capacity(engine: Engine, prompt_tokens: float, output_tokens: float,
                     kv_tokens: Optional[float] = None) -> dict:
    """The three resources of one replica for a mix of mean ``prompt_tokens`` and ``output_tokens``
    (the module's formulas): the batch it can hold and which resource caps it, the machine time
    per request, the token throughput and the request rate."""
    P, O = float(prompt_tokens), float(output_tokens)  # noqa: E741 - the module formulas' P and O
    if not (P >= 0 and O >= 1):
        raise ValueError(f"prompt_tokens must be >= 0 and output_tokens >= 1, got {prompt_tokens!r}, {output_tokens!r}")
    r = float(engine.max_batch)
    X = math.inf if kv_tokens is None else float(kv_tokens)
    if not X > 0:
        raise ValueError(f"kv_tokens must be > 0, got {kv_tokens!r}")
    kv_batch = X / (P + O / 2.0)
    B = min(r, kv_batch)
    u = decode_price_ms(engine, B)
    c = engine.prefill_ms_per_token * P + u * O
    return {"prompt_tokens": P, "output_tokens": O, "slots": r, "kv_tokens": X, "kv_batch": kv_batch,
            "batch": B, "binds": "concurrency" if r <= kv_batch else "kv", "decode_ms_per_token": u,
            "machine_ms_per_request": c, "requests_per_s": 1000.0 / c, "output_tokens_per_s": 1000.0 * O / c,
            "prompt_tokens_per_s": 1000.0 * P / c}


def capacity_table(engine: Engine, mixes: dict, kv_tokens: Optional[float] = None):
    """``replica_capacity`` for each named mix ``{name: (prompt, output)}``, as a DataFrame."""
    rows = {name: replica_capacity(engine, p, o, kv_tokens) for name, (p, o) in mixes.items()}
    return pd.DataFrame.from_dict(rows, orient="index")


def priority(klass: str, wait_ms: float, slo_ms: float, debt_ms: float, share: float, half_life_ms: float,
             debt_weight: float = 1.0) -> float:
    """w = K[class] + min(1, wait / SLO) + beta clip(debt / (share x half-life), -1, 1), beta the
    debt weight; spot (and a share of 0) has no debt term. K = (10, 3, 0) for guaranteed, elastic,
    spot: the ranges never overlap."""
    if klass not in CLASSES:
        raise ValueError(f"klass must be one of {', '.join(CLASSES)}, got {klass!r}")
    if not slo_ms > 0 or not half_life_ms > 0:
        raise ValueError(f"slo_ms and half_life_ms must be > 0, got {slo_ms!r}, {half_life_ms!r}")
    w = CLASS_WEIGHT[CLASSES.index(klass)] + min(1.0, max(0.0, wait_ms / slo_ms))
    if klass != "spot" and share > 0:
        w += debt_weight * min(1.0, max(-1.0, debt_ms / (share * half_life_ms)))
    return w


def pool_params(engine: Engine, classes: Sequence[str], shares: Sequence[float], slo_ms: Sequence[float],
                horizon_ms: float = 5000.0, half_life_ms: float = 10000.0, replicas: int = 1,
                kv_tokens: Optional[int] = None, batch: Optional[float] = None, debt_weight: float = 1.0,
                guaranteed_headroom: Optional[int] = None) -> dict:
    """The ``token_pool`` policy's parameters for replicas like ``engine``: the reservation prices
    from its cost model (``u(batch)``, default at max_batch; ``p``), its slots, and the tenants'
    classes, shares and SLOs."""
    return {"classes": list(classes), "shares": [float(s) for s in shares], "slo_ms": [float(s) for s in slo_ms],
            "decode_price_ms": decode_price_ms(engine, batch), "prefill_price_ms": engine.prefill_ms_per_token,
            "replica_slots": engine.max_batch, "pool_horizon_ms": float(horizon_ms), "half_life_ms": float(half_life_ms),
            "replicas": int(replicas), "kv_tokens": None if kv_tokens is None else int(kv_tokens),
            "debt_weight": float(debt_weight), "guaranteed_headroom": guaranteed_headroom}


def realised_overshoot(reserved_ms: np.ndarray, charged_ms: np.ndarray) -> float:
    """The largest amount one request used beyond what it reserved (ms): the most a reservation
    gateway's entitlement can be exceeded by one request."""
    d = np.asarray(charged_ms, float) - np.asarray(reserved_ms, float)
    return float(max(0.0, d.max())) if d.size else 0.0


_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def kv_capacity_from_metrics(text: str) -> dict:
    """A vLLM replica's KV capacity from its ``/metrics`` text: ``tokens = num_gpu_blocks x
    block_size`` from the ``vllm:cache_config_info`` sample's labels (vLLM states its cache
    configuration there; on its CPU build the blocks are in host memory, the label keeps its
    name). Returns ``{"num_gpu_blocks", "block_size", "tokens"}``; ``ValueError`` naming what is
    missing."""
    for line in str(text).splitlines():
        line = line.strip()
        if not line.startswith("vllm:cache_config_info{"):
            continue
        labels = dict(_LABEL.findall(line[line.index("{") + 1:line.rindex("}")]))
        missing = [k for k in ("num_gpu_blocks", "block_size") if k not in labels]
        if missing:
            raise ValueError(f"vllm:cache_config_info has no label(s) {missing}; its labels: {sorted(labels)}")
        try:
            blocks, size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
        except ValueError:
            raise ValueError(f"vllm:cache_config_info: num_gpu_blocks and block_size must be integers, got "
                             f"{labels['num_gpu_blocks']!r} and {labels['block_size']!r}") from None
        if blocks < 1 or size < 1:
            raise ValueError(f"vllm:cache_config_info: num_gpu_blocks {blocks} and block_size {size} must be >= 1")
        return {"num_gpu_blocks": blocks, "block_size": size, "tokens": blocks * size}
    raise ValueError("no vllm:cache_config_info sample in the metrics text (is it vLLM's /metrics?)")
