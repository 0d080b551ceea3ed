"""Reading a scenario file's fields: each value checked as it is read, each error naming the file
and the field (``tenants[0] (interactive).share``) and what is allowed."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Mapping, NoReturn, Optional

from fairlib.sim.engine import SEED000_ENGINE, Engine
from fairlib.workload import (Constant, Empirical, Gamma, Geometric, LogNormal, OnOff, Periodic, Poisson,
                              Uniform)

__all__ = ["TOP_KEYS", "TENANT_KEYS", "DISTS", "PROCESSES", "FieldReader", "length", "arrival", "engine_table",
           "capacity_input"]

TOP_KEYS = {"name", "description", "question", "duration_s", "rho", "seeds", "policy", "policy_params",
             "victim", "baseline", "engine", "tenants", "reference", "baseline_of", "keep_tenants"}
TENANT_KEYS = {"name", "share", "prompt", "output", "arrival", "ttft_slo_ms", "tpot_slo_ms", "priority",
                "klass", "weight"}
DISTS = {"constant": ("value",), "lognormal": ("mean", "sigma"), "geometric": ("mean",),
          "uniform": ("low", "high"), "empirical": ("values",)}
PROCESSES = {"poisson": (), "gamma": ("burstiness",), "onoff": ("on_s", "off_s"), "periodic": ("offset_ms",)}


class FieldReader:
    """The checked reads of one file's fields (``where`` names the file in each error)."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, key: str, msg: str) -> NoReturn:
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


def length(ctx: FieldReader, spec, label: str):
    if isinstance(spec, int) and not isinstance(spec, bool):
        if spec < 1:
            ctx.fail(label, f"must be an integer >= 1 (a constant length), got {spec!r}")
        return Constant(spec)
    if not isinstance(spec, dict):
        ctx.fail(label, f"must be an integer or a table with 'dist', got {spec!r}")
    kind = spec.get("dist")
    if kind not in DISTS:
        ctx.fail(f"{label}.dist", f"must be one of {', '.join(DISTS)}, got {kind!r}")
    ctx.unknown(spec, {"dist", *DISTS[kind]}, f"{label}.")
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


def arrival(ctx: FieldReader, spec, label: str):
    if spec is None:
        return Poisson()
    if not isinstance(spec, dict):
        ctx.fail(label, f"must be a table with 'process', got {spec!r}")
    kind = spec.get("process", "poisson")
    if kind not in PROCESSES:
        ctx.fail(f"{label}.process", f"must be one of {', '.join(PROCESSES)}, got {kind!r}")
    ctx.unknown(spec, {"process", *PROCESSES[kind]}, f"{label}.")
    if kind == "poisson":
        return Poisson()
    if kind == "gamma":
        return Gamma(None, ctx.number(spec, "burstiness", required=True, label=f"{label}.burstiness"))
    if kind == "onoff":
        return OnOff(None, ctx.number(spec, "on_s", required=True, label=f"{label}.on_s"),
                     ctx.number(spec, "off_s", required=True, strict=False, label=f"{label}.off_s"))
    return Periodic(None, ctx.number(spec, "offset_ms", default=0.0, strict=False, label=f"{label}.offset_ms"))


def engine_table(ctx: FieldReader, spec) -> Engine:
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


def capacity_input(capacity):
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
    stated = capacity.get("engine")
    if stated is not None:
        if not isinstance(stated, Mapping):
            raise ValueError(f"capacity: 'engine' must be a table of fairlib.Engine fields, got {stated!r}")
        fields = {k: v for k, v in stated.items() if k in Engine.__dataclass_fields__}
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
