"""``ServeConfig``: everything ``fairlib serve`` is started with, validated (the engine's
parameters from a file: ``fairlib.sim.engine.load_engine_params``)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Optional

from fairlib.sim.engine import Engine
from fairlib.sim.policies import POLICIES, make_policy

__all__ = ["ServeConfig", "DEFAULT_TENANTS"]

#: The most tenants a server started without ``--tenants`` tells apart: 16 times the most any
#: scenario of fairlib/scenarios has (4), so that several runs of different scenarios against one
#: server never fill it (each tenant costs a waiting line of the engine model's capacity).
DEFAULT_TENANTS = 64


@dataclass(frozen=True)
class ServeConfig:
    """Settings of one ``fairlib serve`` instance.

    ``n_tenants`` is the most tenants the server tells apart: ``X-Tenant`` names get indices
    ``0, 1, ...`` in order of first appearance (``tenant_names`` are assigned first, in order), and
    a new name beyond ``n_tenants`` is an HTTP 503 naming ``--tenants`` (the server's limit, not
    the client's fault). ``None`` (the default): the number of weights a weighted policy is given
    (``weights``: one per tenant), else :data:`DEFAULT_TENANTS`. ``mean_output_tokens``: when a request does
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
    n_tenants: Optional[int] = None
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
    #: serve /metrics (False: 404 there, as an OpenAI-compatible server without Prometheus metrics)
    metrics: bool = True

    def __post_init__(self):
        if not isinstance(self.engine, Engine):
            raise ValueError(f"ServeConfig.engine must be a fairlib.Engine, got {self.engine!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"ServeConfig.policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        pol = make_policy(self.policy, **self.policy_params)  # validate the parameters now
        if self.n_tenants is None:
            w = self.policy_params.get("weights")
            object.__setattr__(self, "n_tenants", len(w) if isinstance(w, (list, tuple)) and w else DEFAULT_TENANTS)
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
