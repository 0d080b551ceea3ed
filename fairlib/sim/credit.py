"""In-flight credit learned from the engine: how many requests a gateway keeps in one upstream.

Every ``interval_s`` the gateway (or the simulator) reads the engine's own waiting queue ``q``
(``vllm:num_requests_waiting``, llama.cpp's ``llamacpp:requests_deferred``) and running batch
``r`` (``vllm:num_requests_running``, ``llamacpp:requests_processing``) and moves the credit
``C`` (the most requests it keeps in flight there) by one rule per observation:

* **cut**: ``q > h`` at ``confirm`` observations in a row: ``C <- max(r over the last window
  observations) + h``. An engine queues only once its batch is full, so the running batch it
  reports under a queue is its capacity (``max_num_seqs``, or fewer when its KV cache binds);
* **grow**: the credit is held (the gateway had ``C`` requests in flight there), ``q <= h`` and
  the engine ran ``C`` at once within the window (``max r >= C``): it may take more: ``C <- C + 1``.
  Not ``q == 0`` and the last ``r``: a request just sent reads as waiting until the engine's next
  iteration, and a finished stream's slot reads empty until its successor's first step, so a
  busy engine below its batch shows ``q > 0`` or ``r < C`` at most scrapes (seen on fairlib
  serve: the credit climbed 1.4 per second instead of 4);
* otherwise ``C`` stays; always ``lo <= C <= hi``.

Fixed point under a backlog: ``C* = M + h`` with ``M`` the batch the engine runs: there ``r <= M <
C*`` (no growth) and ``q = C* - M = h`` (no cut), i.e. at most ``h`` requests wait inside the
engine, enough that a finishing request's slot refills at the engine's next iteration without a
round trip through the gateway. From below the credit climbs by one per observation; from above
one cut lands on ``C*`` (``r`` cannot exceed ``M``), and afterwards neither rule fires: there is no
limit cycle (book/gateway.md has the argument and what the interval bounds).

This is Envoy's adaptive concurrency and Netflix's gradient limit with the queue measured instead
of inferred: they estimate the queue from latency (``limit x (1 - minRTT / RTT)``) because an
arbitrary upstream does not report one; an LLM engine does, exactly, in its metrics.

    c = CreditController(start=16)
    c.observe(waiting=0, running=16, in_flight=16)    # -> 17 (grew: held, nothing queued, all running)
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Optional

__all__ = ["CreditOptions", "CreditController", "CREDIT_MIN", "CREDIT_MAX", "DEFAULT_START", "DEFAULT_INTERVAL_S"]

CREDIT_MIN, CREDIT_MAX = 1, 256
DEFAULT_START = 16
DEFAULT_INTERVAL_S = 0.25


def _int(name: str, v, low: int, high: Optional[int] = None) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not float(v).is_integer() or v < low \
            or (high is not None and v > high):
        rng = f">= {low}" if high is None else f"in {low}..{high}"
        raise ValueError(f"{name} must be an integer {rng}, got {v!r}")
    return int(v)


@dataclass(frozen=True)
class CreditOptions:
    """The control law's constants: ``headroom`` (h >= 1, requests allowed to wait inside the engine),
    ``window`` (observations whose largest running batch a cut keeps), ``confirm`` (observations
    in a row with ``q > h`` before a cut), ``lo``/``hi`` (the credit's clamp), ``interval_s``
    (seconds between observations)."""

    headroom: int = 1
    window: int = 8
    confirm: int = 2
    lo: int = CREDIT_MIN
    hi: int = CREDIT_MAX
    interval_s: float = DEFAULT_INTERVAL_S

    def __post_init__(self):
        _int("credit headroom", self.headroom, 1)     # h >= 1: book/gateway.md, why h = 0 cycles
        _int("credit window", self.window, 1)
        _int("credit confirm", self.confirm, 1)
        _int("credit lo", self.lo, 1)
        _int("credit hi", self.hi, self.lo)
        v = self.interval_s
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"--credit-interval-s must be a finite number of seconds > 0, got {v!r}")


class CreditController:
    """One upstream's credit (see the module docstring). ``credit``: the current value (an int);
    ``history``: ``(waiting, running, in_flight, credit after)`` per observation when ``keep``."""

    def __init__(self, start: int = DEFAULT_START, options: Optional[CreditOptions] = None, keep: bool = False):
        self.opt = options or CreditOptions()
        s = _int("--credit-start", start, 1)
        self.start = min(max(s, self.opt.lo), self.opt.hi)
        self.credit = self.start
        self.recent: collections.deque[float] = collections.deque(maxlen=self.opt.window)   # running batch, last observations
        self.over = 0          # observations in a row with q > h
        self.cuts = self.grows = self.observations = 0
        self.keep = bool(keep)
        self.history: list = []

    def observe(self, waiting: float, running: float, in_flight: int) -> int:
        """One observation of the engine (``waiting``, ``running``) and of the gateway's own
        ``in_flight`` there; returns the new credit."""
        q, r = float(waiting), float(running)
        if not (math.isfinite(q) and math.isfinite(r)) or q < 0 or r < 0:
            raise ValueError(f"waiting and running must be finite counts >= 0, got {waiting!r}, {running!r}")
        o = self.opt
        self.observations += 1
        self.recent.append(r)
        self.over = self.over + 1 if q > o.headroom else 0
        c = self.credit
        if self.over >= o.confirm:
            c = int(max(self.recent)) + o.headroom
            self.over = 0
            self.cuts += 1
        elif in_flight >= self.credit and q <= o.headroom and max(self.recent) >= self.credit:
            c = self.credit + 1
            self.grows += 1
        self.credit = min(max(c, o.lo), o.hi)
        if self.keep:
            self.history.append((q, r, int(in_flight), self.credit))
        return self.credit

    def state(self) -> dict:
        return {"credit": self.credit, "start": self.start, "observations": self.observations, "cuts": self.cuts,
                "grows": self.grows, "headroom": self.opt.headroom, "interval_s": self.opt.interval_s}
