"""``ServeConfig``: everything ``fairlib serve`` is started with, validated, and how to read the
engine's parameters from a file (JSON or TOML: an ``Engine``'s fields, or a probe result with an
``"engine"`` table)."""
from __future__ import annotations

import json
import math
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Optional

from fairlib.sim.engine import Engine
from fairlib.sim.policies import POLICIES, make_policy

__all__ = ["ServeConfig", "load_engine_params", "ENGINE_FIELDS"]

ENGINE_FIELDS = ("iter_base_ms", "iter_slope_ms", "prefill_ms_per_token", "max_batch", "max_prefill_tokens",
                 "kv_capacity_tokens")


def load_engine_params(spec) -> dict:
    """Engine fields from a JSON string, a ``.json``/``.toml`` file, or a mapping.

    A mapping with an ``"engine"`` key (a probe result, ``fairlib.calibrate.probe``) uses that sub-table.
    Unknown keys are an error (a misspelt parameter must not be silently ignored)."""
    if isinstance(spec, dict):
        d = dict(spec)
    else:
        s = str(spec).strip()
        p = Path(s)
        if s.startswith("{"):
            d = json.loads(s)
        elif p.suffix == ".toml":
            d = tomllib.loads(p.read_text(encoding="utf-8"))
        elif p.exists():
            d = json.loads(p.read_text(encoding="utf-8"))
        else:
            raise ValueError(f"engine params: {s!r} is neither a JSON object nor an existing .json/.toml file")
    if isinstance(d.get("engine"), dict):
        d = d["engine"]
    unknown = sorted(set(d) - set(ENGINE_FIELDS))
    if unknown:
        raise ValueError(f"engine params: unknown field(s) {unknown}; allowed: {', '.join(ENGINE_FIELDS)}")
    return d


@dataclass(frozen=True)
class ServeConfig:
    """Settings of one ``fairlib serve`` instance.

    ``n_tenants`` is the most tenants the server tells apart: ``X-Tenant`` names get indices
    ``0, 1, ...`` in order of first appearance (``tenant_names`` are assigned first, in order), and
    a new name beyond ``n_tenants`` is an HTTP 400. ``mean_output_tokens``: when a request does
    not force its length (``ignore_eos`` or ``min_tokens == max_tokens``), its output length is a
    geometric draw with this mean (support 1, 2, ...), seeded by ``seed`` in arrival order, then
    clipped to ``[min_tokens, max_tokens]``. ``max_waiting``: HTTP 429 when this many requests
    already wait (``None``: no cap). ``spin_ms``: the driver sleeps until this long before an
    iteration's end and then yields in a tight loop, to beat asyncio's ~1 ms timer granularity.
    """

    engine: Engine = field(default_factory=Engine)
    policy: str = "fcfs"
    policy_params: dict = field(default_factory=dict)
    model: str = "fairlib-sim"
    n_tenants: int = 8
    tenant_names: tuple = ()
    n_classes: int = 4
    priority_min: int = -32
    priority_max: int = 32
    max_waiting: Optional[int] = None
    mean_output_tokens: float = 128.0
    seed: int = 0
    max_model_len: int = 8192
    host: str = "127.0.0.1"
    port: int = 8000
    spin_ms: float = 1.0
    tenant_header: str = "X-Tenant"
    api_key: Optional[str] = field(default=None, repr=False)

    def __post_init__(self):
        if not isinstance(self.engine, Engine):
            raise ValueError(f"ServeConfig.engine must be a fairlib.Engine, got {self.engine!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"ServeConfig.policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        pol = make_policy(self.policy, **self.policy_params)  # validate the parameters now
        if isinstance(self.n_tenants, int) and not isinstance(self.n_tenants, bool) and self.n_tenants >= 1:
            pol.state(self.n_tenants)  # e.g. vtc's weights: one per tenant
        for name, low in (("n_tenants", 1), ("n_classes", 1), ("max_model_len", 2), ("port", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"ServeConfig.{name} must be an integer >= {low}, got {v!r}")
        if self.max_waiting is not None and (isinstance(self.max_waiting, bool) or not isinstance(self.max_waiting, int)
                                             or self.max_waiting < 0):
            raise ValueError(f"ServeConfig.max_waiting must be None or an integer >= 0, got {self.max_waiting!r}")
        names = tuple(str(s) for s in self.tenant_names)
        if len(set(names)) != len(names) or len(names) > self.n_tenants:
            raise ValueError(f"ServeConfig.tenant_names must be distinct and at most n_tenants ({self.n_tenants}), "
                             f"got {names}")
        object.__setattr__(self, "tenant_names", names)
        if not (isinstance(self.mean_output_tokens, (int, float)) and math.isfinite(self.mean_output_tokens)
                and self.mean_output_tokens >= 1):
            raise ValueError(f"ServeConfig.mean_output_tokens must be a number >= 1, got {self.mean_output_tokens!r}")
        if not (isinstance(self.spin_ms, (int, float)) and 0 <= self.spin_ms <= 50):
            raise ValueError(f"ServeConfig.spin_ms must lie in [0, 50], got {self.spin_ms!r}")
        if self.priority_min > self.priority_max:
            raise ValueError("ServeConfig.priority_min must be <= priority_max")
        if self.host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"fairlib serve binds to the loopback interface only (127.0.0.1), got {self.host!r}")

    def with_engine(self, **fields) -> "ServeConfig":
        return replace(self, engine=replace(self.engine, **fields))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["engine"] = self.engine.to_dict()
        d["tenant_names"] = list(self.tenant_names)
        d["api_key"] = "<set>" if self.api_key else None     # never written or served
        return d
