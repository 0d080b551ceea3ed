"""``GatewayConfig``: what ``fairlib gateway`` is started with, and the tenants file.

Tenants (``--tenants FILE``, TOML)::

    default_tenant = "anonymous"      # optional: requests of no known tenant go here; without it: 401
    [[tenant]]
    name = "classify"                 # the fairness id clients send (x-llm-d-inference-fairness-id)
    weight = 1.0                      # vtc / lcf / residency / vtc_predict weight (default 1)
    klass = 0                         # service class for weighted / aging (default 0)
    priority = 0                      # for the priority policy: lower is served first (default 0)
    api_key = "sk-classify"           # optional: 'Authorization: Bearer <key>' names this tenant
    trusted = false                   # optional: this key is a front proxy's: its fairness header names the tenant
    max_queue = 1000                  # optional: requests waiting at most (more: 429)
    tier = "premium"                  # optional: premium / standard / batch, for --estimator
    pool_class = "guaranteed"         # token_pool: guaranteed / elastic / spot
    share = 0.3                       # token_pool: its entitlement, a fraction of the pool (spot: 0)
    ttft_slo_ms = 1000                # token_pool: its TTFT SLO (the priority's urgency), default none

When any tenant has an ``api_key`` (or ``--api-key`` is given) the key alone names the tenant
(fairlib/gateway/identity.py: 401 without a known key, 403 for a header naming another tenant);
only a ``trusted`` key's fairness header names one. Without a file the gateway is open: each
fairness id gets the next tenant index as it first appears, up to ``max_tenants``; ids beyond
share the last one, ``other`` (a caller-controlled label is a cardinality risk: llm-d caps its
``fairness_id`` label the same way); a request with no id is the tenant ``default``.
"""
from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

from fairlib.drift import TIERS
from fairlib.sim.credit import DEFAULT_START as DEFAULT_CREDIT_START
from fairlib.sim.credit import CreditOptions
from fairlib.sim.policies import POLICIES, make_policy

#: the Python data plane's event loops (``--event-loop``): the standard library's, libuv's
EVENT_LOOPS = ("asyncio", "uvloop")

__all__ = ["EVENT_LOOPS", "TenantConfig", "TenantTable", "GatewayConfig", "load_tenants", "with_tenant_weights", "FAIRNESS_HEADERS", "OVERFLOW_TENANT",
           "DEFAULT_TENANT", "MAX_TENANT_ID_CHARS"]

#: the tenant headers, llm-d's first, then the Gateway API Inference Extension's older name, then
#: ``X-Tenant`` (what fairlib's client sends by default and ``fairlib serve`` reads)
FAIRNESS_HEADERS = ("x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id", "x-tenant")
OVERFLOW_TENANT = "other"
DEFAULT_TENANT = "default"
#: the longest tenant id (a name in the tenants file, a fairness header's value in open mode)
MAX_TENANT_ID_CHARS = 200
_TENANT_KEYS = {"name", "weight", "klass", "priority", "api_key", "trusted", "max_queue", "tier", "pool_class",
                "share", "ttft_slo_ms"}
POOL_CLASSES = ("guaranteed", "elastic", "spot")


@dataclass(frozen=True)
class TenantConfig:
    """One ``[[tenant]]`` table of the tenants file: what the gateway applies to that tenant (its
    weight, class, priority, key, queue limit, tier, token-pool class, share and SLO); not to be
    confused with :class:`fairlib.workload.TenantSpec`, the traffic a tenant sends."""

    name: str
    weight: float = 1.0
    klass: int = 0
    priority: int = 0
    api_key: Optional[str] = field(default=None, repr=False)
    max_queue: Optional[int] = None
    tier: Optional[str] = None
    pool_class: Optional[str] = None
    share: Optional[float] = None
    ttft_slo_ms: Optional[float] = None
    trusted: bool = False

    def to_dict(self) -> dict:
        return {"name": self.name, "weight": self.weight, "klass": self.klass, "priority": self.priority,
                "api_key": "<set>" if self.api_key else None, "trusted": self.trusted, "max_queue": self.max_queue,
                "tier": self.tier,
                "pool_class": self.pool_class, "share": self.share, "ttft_slo_ms": self.ttft_slo_ms}


def _tenant(d: dict, where: str) -> TenantConfig:
    unknown = sorted(set(d) - _TENANT_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; allowed: {', '.join(sorted(_TENANT_KEYS))}")
    name = d.get("name")
    if not isinstance(name, str) or not name.strip() or len(name.strip()) > MAX_TENANT_ID_CHARS \
            or not name.strip().isprintable():
        raise ValueError(f"{where}: 'name' must be a non-empty printable string of at most {MAX_TENANT_ID_CHARS} "
                         f"characters, got {name!r}")
    w = d.get("weight", 1.0)
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
        raise ValueError(f"{where}: 'weight' must be a finite number > 0, got {w!r}")
    for k in ("klass", "priority"):
        v = d.get(k, 0)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{where}: {k!r} must be an integer, got {v!r}")
    if d.get("klass", 0) < 0:
        raise ValueError(f"{where}: 'klass' must be >= 0, got {d['klass']!r}")
    key = d.get("api_key")
    if key is not None and (not isinstance(key, str) or not key):
        raise ValueError(f"{where}: 'api_key' must be a non-empty string")
    trusted = d.get("trusted", False)
    if not isinstance(trusted, bool):
        raise ValueError(f"{where}: 'trusted' must be true or false, got {trusted!r}")
    if trusted and key is None:
        raise ValueError(f"{where}: 'trusted = true' needs an 'api_key' (trusted is a property of a key)")
    mq = d.get("max_queue")
    if mq is not None and (isinstance(mq, bool) or not isinstance(mq, int) or mq < 0):
        raise ValueError(f"{where}: 'max_queue' must be an integer >= 0, got {mq!r}")
    tier = d.get("tier")
    if tier is not None and tier not in TIERS:
        raise ValueError(f"{where}: 'tier' must be one of {', '.join(TIERS)}, got {tier!r}")
    pc = d.get("pool_class")
    if pc is not None and pc not in POOL_CLASSES:
        raise ValueError(f"{where}: 'pool_class' must be one of {', '.join(POOL_CLASSES)}, got {pc!r}")
    share = d.get("share")
    if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1):
        raise ValueError(f"{where}: 'share' must be a number in 0..1, got {share!r}")
    slo = d.get("ttft_slo_ms")
    if slo is not None and (isinstance(slo, bool) or not isinstance(slo, (int, float)) or not math.isfinite(slo)
                            or slo <= 0):
        raise ValueError(f"{where}: 'ttft_slo_ms' must be a finite number > 0, got {slo!r}")
    return TenantConfig(name.strip(), float(w), int(d.get("klass", 0)), int(d.get("priority", 0)), key, mq, tier,
                  pc, None if share is None else float(share), None if slo is None else float(slo), trusted)


@dataclass(frozen=True)
class TenantTable:
    """The configured tenants (index = position) and the default tenant's name, or none (open)."""

    tenants: tuple = ()
    default_tenant: Optional[str] = None

    @property
    def is_open(self) -> bool:
        return not self.tenants

    def to_dict(self) -> dict:
        return {"tenants": [t.to_dict() for t in self.tenants], "default_tenant": self.default_tenant}


def load_tenants(spec) -> TenantTable:
    """A ``TenantTable`` from a TOML file path, a mapping (the file's content) or None (open)."""
    if spec is None:
        return TenantTable()
    if isinstance(spec, TenantTable):
        return spec
    if isinstance(spec, dict):
        d, where = spec, "tenants"
    else:
        p = Path(spec)
        try:
            d = tomllib.loads(p.read_text(encoding="utf-8"))
        except OSError as e:
            raise ValueError(f"--tenants {p}: cannot read it ({e.strerror or e})") from None
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"--tenants {p}: not TOML ({e})") from None
        where = f"--tenants {p}"
    unknown = sorted(set(d) - {"tenant", "default_tenant"})
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: tenant (a [[tenant]] table), default_tenant")
    rows = d.get("tenant", [])
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{where}: needs at least one [[tenant]] table")
    tenants = tuple(_tenant(r, f"{where}: tenant {i}") for i, r in enumerate(rows))
    names = [t.name for t in tenants]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: tenant names must be distinct, got {names}")
    keys = [t.api_key for t in tenants if t.api_key]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{where}: two tenants share an api_key")
    default = d.get("default_tenant")
    if default is not None:
        if not isinstance(default, str) or not default.strip():
            raise ValueError(f"{where}: 'default_tenant' must be a tenant name")
        if default not in names:
            tenants = tenants + (TenantConfig(default.strip()),)
    return TenantTable(tenants, default)


def with_tenant_weights(policy: str, params: Optional[dict], tenants: TenantTable, pool: Optional[dict] = None) -> dict:
    """``params`` with the tenants file's weights for a policy that takes ``weights`` (vtc, lcf,
    residency, vtc_predict), unless given; for ``token_pool`` the tenants' ``pool_class``,
    ``share`` and ``ttft_slo_ms`` and ``pool``'s defaults (replicas, replica_slots, the prices:
    :meth:`GatewayConfig.pool_defaults`); ``ValueError`` for a policy that does not exist."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    p = dict(params or {})
    if "weights" in POLICIES[policy].params and "weights" not in p and not tenants.is_open:
        p["weights"] = [t.weight for t in tenants.tenants]
    if policy == "token_pool":
        if tenants.is_open and not {"classes", "shares"} <= set(p):
            raise ValueError("--policy token_pool needs a --tenants file giving each tenant its pool_class and share")
        if not tenants.is_open:
            missing = [t.name for t in tenants.tenants if t.pool_class is None and t.name != tenants.default_tenant]
            if missing and "classes" not in p:
                raise ValueError(f"--policy token_pool: tenant(s) {missing} have no pool_class in the tenants file "
                                 f"(guaranteed, elastic or spot)")
            unshared = [t.name for t in tenants.tenants if t.pool_class in ("guaranteed", "elastic") and t.share is None]
            if unshared and "shares" not in p:
                raise ValueError(f"--policy token_pool: tenant(s) {unshared} have a guaranteed or elastic pool_class "
                                 f"but no share in the tenants file (a fraction of the pool, 0..1)")
            spot = [t.name for t in tenants.tenants if t.pool_class == "spot" and t.share]
            if spot and "shares" not in p:
                raise ValueError(f"--policy token_pool: spot tenant(s) {spot} have a share in the tenants file; a spot "
                                 f"tenant has no entitlement (share 0 or none)")
            total = sum(t.share or 0.0 for t in tenants.tenants)
            if total > 1 + 1e-9 and "shares" not in p:
                raise ValueError(f"--policy token_pool: the tenants' shares add up to {total:g}, more than the pool "
                                 f"(1): " + ", ".join(f"{t.name} {t.share:g}" for t in tenants.tenants if t.share))
            # a tenant with no class (the default tenant the file did not describe) is spot
            p.setdefault("classes", [t.pool_class or "spot" for t in tenants.tenants])
            p.setdefault("shares", [t.share if t.share is not None else 0.0 for t in tenants.tenants])
            p.setdefault("slo_ms", [t.ttft_slo_ms for t in tenants.tenants])     # None: no objective
        pool = dict(pool) if pool is not None else None
        cost = pool.pop("cost_model", None) if pool is not None else None
        for k, v in (pool or {}).items():
            if v is not None:
                p.setdefault(k, v)
        if pool is not None and "replica_slots" not in p:
            raise ValueError("--policy token_pool: the upstreams' --max-inflight differ; give the slots of one "
                             "replica with --policy-param replica_slots=N")
        if pool is not None and "decode_price_ms" not in p:
            cm = cost or {}
            if cm.get("iter_base_ms") is not None and cm.get("iter_slope_ms") is not None:
                b = float(p["replica_slots"])         # the price of an output token at a full replica
                p["decode_price_ms"] = (float(cm["iter_base_ms"]) + float(cm["iter_slope_ms"]) * b) / b
            elif cost:
                raise ValueError("--policy token_pool: the --cost-model has no iter_base_ms and iter_slope_ms (a fit "
                                 "has them), so the price of an output token is unknown; or give --policy-param "
                                 "decode_price_ms=MS")
            else:
                raise ValueError("--policy token_pool needs the price of an output token: --cost-model FILE (a fit) "
                                 "or --policy-param decode_price_ms=MS")
    return p


def _check_url(u: str, what: str) -> str:
    parts = urlsplit(str(u))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{what} must be an http:// or https:// URL (the OpenAI base, e.g. "
                         f"http://127.0.0.1:8000/v1), got {u!r}")
    if parts.username or parts.password:
        raise ValueError(f"{what}: the URL holds credentials; pass them with --upstream-api-key-file")
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        fixed = f"{parts.scheme}://{parts.netloc}{path}/v1"
        raise ValueError(f"{what} {u}: the path is not an OpenAI base (it ends in /v1); use {fixed}")
    return str(u).rstrip("/")


def resolve_auto(cfg) -> None:
    """``max_inflight="auto"`` (or ``("auto",)``): a credit (default constants) starting at
    ``credit_start`` in each upstream; an integer cap keeps ``credit`` None (a fixed cap)."""
    mi = cfg.max_inflight
    auto = mi == "auto" or (isinstance(mi, (tuple, list)) and "auto" in mi)
    if isinstance(mi, (tuple, list)) and auto and any(v != "auto" for v in mi):
        raise ValueError(f"--max-inflight: 'auto' for every upstream or integers, not a mix, got {list(mi)}")
    cs = cfg.credit_start
    if isinstance(cs, bool) or not isinstance(cs, int) or cs < 1:
        raise ValueError(f"--credit-start must be an integer >= 1, got {cs!r}")
    if cfg.credit is not None and not isinstance(cfg.credit, CreditOptions):
        raise ValueError(f"credit must be a CreditOptions or None, got {cfg.credit!r}")
    if auto:
        credit = cfg.credit or CreditOptions()
        object.__setattr__(cfg, "credit", credit)
        object.__setattr__(cfg, "max_inflight", (min(max(cs, credit.lo), credit.hi),))


@dataclass(frozen=True)
class GatewayConfig:
    """Settings of one gateway (validated).

    ``upstreams``: OpenAI base URLs (``.../v1``); ``max_inflight``: requests in each upstream at
    most (its ``max_num_seqs``: the gateway keeps the engine's own queue empty), one number for
    all or one per upstream, or ``"auto"``: a credit per upstream learned from the engine's metrics
    (``credit``, its control law's constants; ``credit_start``: where it starts when the engine
    does not state its limit; fairlib/gateway/credit.py). ``prefill_ms_per_token``: the engines' fitted prefill price (the
    residency charge's prefill part; 0: prefill time is split over the step like decode time).
    ``queue_timeout_s``: a request waiting longer gets 503 with Retry-After. ``step_tol_ms``:
    the clustering tolerance of the step reconstruction (``"auto"``, fairlib/gateway/steps.py).
    ``estimator``: ``"tokens"`` or ``"words"`` (chapter 5: fairlib/gateway/estimate.py) gives every
    request an estimated budget from DriftSched's estimator, corrected by the answers, for ``sjf``;
    ``estimator_key`` as ``fairlib.drift.DriftEstimator``'s ``key``.
    ``cost_model``: the engines' fitted parameters (iter_base_ms, iter_slope_ms, max_batch, ...;
    ``--cost-model``): ``token_pool`` prices an output token at ``(iter_base + iter_slope B) / B``
    with B the upstream's slots, unless ``decode_price_ms`` is given.
    ``health_interval_s``: how often each upstream's ``/health`` is asked; ``health_failures``
    misses in a row take it out, one answer puts it back; a failed connection takes it out at once
    (passive health). ``record_events``: keep the policy's event log (``/admin/events``; the
    replay test and the chapters read it; it grows with every token: off by default).
    ``drain_timeout_s``: after a stop signal, how long those waiting and in flight may still take
    (no new request). ``upstream_idle_timeout_s``: an upstream read that brings no byte for this
    long ends the request with an error (502, or an error event) and frees its slot.
    ``access_log``: where the JSON access-log lines go ("-": stderr, None: nowhere, else a file).
    ``trust_api_key``: the ``api_key`` is a front proxy's (its fairness header names the tenant).
    ``tenant_max_share``: one tenant holds at most ``max(1, min(slots - 1, floor(share x slots)))``
    slots, under any policy (fairlib/gateway/share.py; 1: no cap). ``event_loop``: the Python data
    plane's event loop, ``asyncio`` (the standard library's) or ``uvloop`` (libuv's; measured side
    by side on this project's 2-core machine it took 1.5-7% less CPU per relayed stream, within the
    runs' spread: benchmarks/gateway_versions.py, book/gateway.md).
    """

    upstreams: tuple = ()
    policy: str = "fcfs"
    policy_params: dict = field(default_factory=dict)
    max_inflight: tuple = (16,)
    tenants: TenantTable = field(default_factory=TenantTable)
    max_tenants: int = 64
    host: str = "127.0.0.1"
    port: int = 8080
    prefill_ms_per_token: float = 0.0
    max_queue: Optional[int] = None
    queue_timeout_s: Optional[float] = None
    step_tol_ms: object = "auto"
    health_interval_s: float = 1.0
    health_failures: int = 2
    upstream_api_key: Optional[str] = field(default=None, repr=False)
    api_key: Optional[str] = field(default=None, repr=False)
    request_timeout_s: float = 600.0
    record_events: bool = False
    n_classes: int = 4
    estimator: Optional[str] = None
    estimator_key: str = "category"
    cost_model: Optional[dict] = None
    drain_timeout_s: float = 30.0
    credit: Optional[CreditOptions] = None
    credit_start: int = DEFAULT_CREDIT_START
    trust_api_key: bool = False
    upstream_idle_timeout_s: float = 60.0
    access_log: Optional[str] = "-"
    tenant_max_share: float = 0.9
    event_loop: str = "asyncio"

    def __post_init__(self):
        resolve_auto(self)
        ups = self.upstreams
        if isinstance(ups, str):
            ups = (ups,)
        ups = tuple(_check_url(u, "--upstream") for u in ups)
        if not ups:
            raise ValueError("the gateway needs at least one --upstream URL")
        if len(set(ups)) != len(ups):
            raise ValueError(f"--upstream: each URL once, got {list(ups)}")
        object.__setattr__(self, "upstreams", ups)
        mi = self.max_inflight
        mi = (mi,) if isinstance(mi, int) and not isinstance(mi, bool) else tuple(mi)
        if len(mi) == 1:
            mi = mi * len(ups)
        if len(mi) != len(ups) or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in mi):
            raise ValueError(f"--max-inflight: an integer >= 1, or one per upstream ({len(ups)}), got {list(mi)}")
        object.__setattr__(self, "max_inflight", mi)
        if self.policy not in POLICIES:
            raise ValueError(f"--policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        object.__setattr__(self, "tenants", load_tenants(self.tenants))
        for name, low in (("max_tenants", 1), ("port", 0), ("health_failures", 1), ("n_classes", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= {low}, got {v!r}")
        if self.port > 65535:
            raise ValueError(f"--port must be an integer in 0..65535, got {self.port!r}")
        if self.max_queue is not None and (isinstance(self.max_queue, bool) or not isinstance(self.max_queue, int)
                                           or self.max_queue < 0):
            raise ValueError(f"--max-queue must be an integer >= 0, got {self.max_queue!r}")
        for name in ("queue_timeout_s", "health_interval_s", "request_timeout_s", "prefill_ms_per_token",
                     "drain_timeout_s", "upstream_idle_timeout_s"):
            v = getattr(self, name)
            if v is None and name == "queue_timeout_s":
                continue
            positive = name not in ("prefill_ms_per_token", "drain_timeout_s")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                    or (positive and v == 0):
                rel = "> 0" if positive else ">= 0"
                raise ValueError(f"--{name.replace('_', '-')} must be a finite number {rel}, got {v!r}")
        if self.event_loop not in EVENT_LOOPS:
            raise ValueError(f"--event-loop must be one of {', '.join(EVENT_LOOPS)}, got {self.event_loop!r}")
        ts = self.tenant_max_share
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not 0 < ts <= 1:
            raise ValueError(f"--tenant-max-share must be a number in (0, 1] (1: no cap), got {ts!r}")
        st = self.step_tol_ms
        if st != "auto" and (isinstance(st, bool) or not isinstance(st, (int, float)) or not st > 0):
            raise ValueError(f"--step-tol-ms must be 'auto' or a number of ms > 0, got {st!r}")
        make_policy(self.policy, **self.effective_policy_params()).state(self.n_tenants)   # the parameters, now
        if self.estimator is not None and self.estimator not in ("tokens", "words"):
            raise ValueError(f"--estimator must be tokens or words (or absent), got {self.estimator!r}")
        if self.estimator_key not in ("category", "tier"):
            raise ValueError(f"--estimator-key must be category or tier, got {self.estimator_key!r}")
        if self.api_key and not self.trust_api_key and not self.tenants.is_open and self.tenants.default_tenant is None:
            raise ValueError("--api-key names the tenants file's default_tenant, and the file has none: add "
                             "default_tenant, give each tenant its own api_key, or --trust-api-key (a front proxy "
                             "whose fairness header names the tenant)")
        if self.api_key and self.api_key in {t.api_key for t in self.tenants.tenants}:
            raise ValueError("--api-key is also a tenant's api_key in the tenants file: give each key once")

    def effective_policy_params(self) -> dict:
        """The policy's parameters, the tenants' weights filled in (:func:`with_tenant_weights`)."""
        return with_tenant_weights(self.policy, self.policy_params, self.tenants, self.pool_defaults())

    def pool_defaults(self) -> dict:
        """``token_pool``'s parameters from the gateway: one replica per upstream, each with its
        ``max_inflight`` slots (they must be equal), the prefill price, and the cost model from
        which :func:`with_tenant_weights` prices an output token at that batch."""
        slots = self.max_inflight[0] if len(set(self.max_inflight)) == 1 else None
        return {"replicas": len(self.upstreams), "replica_slots": slots,
                "prefill_price_ms": self.prefill_ms_per_token, "cost_model": self.cost_model}

    @property
    def n_tenants(self) -> int:
        """How many tenant indices the policy keeps: the configured ones, or ``max_tenants``."""
        return len(self.tenants.tenants) if not self.tenants.is_open else self.max_tenants

    @property
    def slots(self) -> int:
        """The most requests in flight at once: the upstreams' caps, or with a credit its ceiling each."""
        return int(sum(self.max_inflight)) if self.credit is None else self.credit.hi * len(self.upstreams)

    def to_dict(self) -> dict:
        return {"upstreams": list(self.upstreams), "policy": self.policy, "policy_params": dict(self.policy_params),
                "max_inflight": list(self.max_inflight), "tenants": self.tenants.to_dict(),
                "max_tenants": self.max_tenants, "host": self.host, "port": self.port,
                "prefill_ms_per_token": self.prefill_ms_per_token, "max_queue": self.max_queue,
                "queue_timeout_s": self.queue_timeout_s, "step_tol_ms": self.step_tol_ms,
                "health_interval_s": self.health_interval_s, "health_failures": self.health_failures,
                "upstream_api_key": "<set>" if self.upstream_api_key else None,
                "api_key": "<set>" if self.api_key else None, "request_timeout_s": self.request_timeout_s,
                "record_events": self.record_events, "n_classes": self.n_classes, "estimator": self.estimator,
                "estimator_key": self.estimator_key, "cost_model": self.cost_model,
                "drain_timeout_s": self.drain_timeout_s,
                "credit": None if self.credit is None else asdict(self.credit), "credit_start": self.credit_start,
                "trust_api_key": self.trust_api_key,
                "upstream_idle_timeout_s": self.upstream_idle_timeout_s, "access_log": self.access_log,
                "tenant_max_share": self.tenant_max_share, "event_loop": self.event_loop}
