"""The checks every workload field goes through: a finite number (``>`` or ``>=`` a bound), an
integer, a sample size; each error names the owner, the field and the rule."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

__all__ = ["number", "integer", "count"]


def number(owner: str, name: str, v, *, low: float = -math.inf, strict: bool = False,
            allow_none: bool = False) -> Optional[float]:
    """``float(v)`` when it is a finite number ``> low`` (``strict``) or ``>= low``; None passes
    when ``allow_none``."""
    if v is None and allow_none:
        return None
    ok = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
    if not ok or not math.isfinite(v) or (v <= low if strict else v < low):
        rel = ">" if strict else ">="
        raise ValueError(f"{owner}.{name} must be a finite number {rel} {low:g}, got {v!r}")
    return float(v)


def integer(owner: str, name: str, v, *, low: Optional[int] = None) -> int:
    """``int(v)`` when it is a whole number (an integral float too), ``>= low`` when given."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer, float, np.floating)) \
            or not math.isfinite(v) or not float(v).is_integer() or (low is not None and v < low):
        rel = f" >= {low}" if low is not None else ""
        raise ValueError(f"{owner}.{name} must be an integer{rel}, got {v!r}")
    return int(v)


def count(n) -> int:
    """A sample size: an integer >= 0."""
    return integer("sample", "n", n, low=0)
