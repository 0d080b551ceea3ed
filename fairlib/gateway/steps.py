"""One upstream's decode steps, rebuilt from the token events on its streams as they arrive.

Under continuous batching every running sequence emits one token per iteration, all at its end;
over HTTP they arrive within a fraction of a millisecond of each other. ``StepTracker`` groups the
token events of one upstream into steps and hands each closed step to ``on_step(ids, tokens,
finished, dt_ms, t_ms)`` (``PolicyGate.observe``):

- an event at ``t`` joins the open step unless ``t`` lies more than ``tol_ms`` after the step's
  first event, or its stream already emitted in it: then the open step closes and a new one opens;
- the open step also closes as soon as every stream in flight on the upstream has emitted in it
  (nothing more can come), else ``tol_ms`` after its first event (``poll`` / the gateway's timer);
- a step's time ``t_k`` is its first event's; its duration ``dt = t_k - start`` with ``start`` the
  previous step's time, or, when every emitter brings its first token, the later of that and the
  earliest dispatch among them (an upstream that was idle: its first step starts when the request
  was sent, as the analysis' first-token interval does, fairlib/analysis/service.py).

``tol_ms`` (``"auto"``): ``min(5, max(0.5, 0.2 x the median of the last 64 step gaps))`` ms,
2 ms until 8 gaps are known: the clustering tolerance of the analysis' residency reconstruction.
A stream's end (``finish``) joins its entry in the open step; an end that comes after its last
step closed (a separate final chunk that arrived late, a failure) is reported to ``on_late(rid)``
instead: the request leaves the batch without a finish for the policy (``PolicyGate.withdraw``).
Times are milliseconds on the gateway's clock.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Optional

__all__ = ["StepTracker"]


class StepTracker:
    def __init__(self, on_step: Callable, on_late: Optional[Callable] = None, tol_ms="auto"):
        self.on_step, self.on_late = on_step, on_late
        if tol_ms != "auto" and (isinstance(tol_ms, bool) or not isinstance(tol_ms, (int, float)) or tol_ms <= 0):
            raise ValueError(f"tol_ms must be 'auto' or a number of ms > 0, got {tol_ms!r}")
        self.fixed_tol = None if tol_ms == "auto" else float(tol_ms)
        self.streams: dict = {}          # rid -> [dispatch_ms, tokens so far]
        self.open_t: Optional[float] = None
        self.entries: dict = {}          # rid -> [tokens, finished] in the open step
        self.prev_t: Optional[float] = None
        self.gaps: deque = deque(maxlen=64)
        self.steps = 0

    # --- the tolerance -----------------------------------------------------------------------
    @property
    def tol_ms(self) -> float:
        if self.fixed_tol is not None:
            return self.fixed_tol
        if len(self.gaps) < 8:
            return 2.0
        g = sorted(self.gaps)
        med = g[len(g) // 2]
        return min(5.0, max(0.5, 0.2 * med))

    # --- events ------------------------------------------------------------------------------
    def dispatched(self, rid: int, t_ms: float) -> None:
        """A request was sent to this upstream at ``t_ms``."""
        self.streams[rid] = [float(t_ms), 0]

    def tokens(self, rid: int, t_ms: float, k: int = 1, finished: bool = False) -> None:
        """A chunk of ``k`` tokens of ``rid`` arrived at ``t_ms`` (``finished``: its stream's last)."""
        if rid not in self.streams:
            raise KeyError(f"StepTracker: request {rid} was not dispatched here")
        if self.open_t is not None and (t_ms - self.open_t > self.tol_ms or rid in self.entries):
            self.close()
        if self.open_t is None:
            self.open_t = float(t_ms)
        e = self.entries.get(rid)
        if e is None:
            self.entries[rid] = [int(k), bool(finished)]
        else:
            e[0] += int(k)
            e[1] = e[1] or bool(finished)
        self.streams[rid][1] += int(k)
        if len(self.entries) >= len(self.streams):
            self.close()

    def add_tokens(self, rid: int, k: int) -> bool:
        """``k`` more tokens of ``rid`` than its chunks were counted as (the answer's ``usage``):
        added to its entry in the open step. False when it has none (nothing added)."""
        e = self.entries.get(rid)
        if e is None or k <= 0:
            return False
        e[0] += int(k)
        self.streams[rid][1] += int(k)
        return True

    def finish(self, rid: int, t_ms: float) -> None:
        """The stream of ``rid`` ended (finish_reason, or the end of the body, or a failure)."""
        e = self.entries.get(rid)
        if e is not None:
            e[1] = True
            return
        if self.streams.pop(rid, None) is not None and self.on_late is not None:
            self.on_late(rid)

    def poll(self, t_ms: float) -> None:
        """Close the open step if its tolerance has passed at ``t_ms``."""
        if self.open_t is not None and t_ms - self.open_t > self.tol_ms:
            self.close()

    def deadline(self) -> Optional[float]:
        """When the open step closes at the latest (ms), None if none is open."""
        return None if self.open_t is None else self.open_t + self.tol_ms

    def close(self) -> None:
        """Close the open step: ``on_step`` with its emitters, then the finished streams leave."""
        if self.open_t is None:
            return
        t = self.open_t
        ids = list(self.entries)
        toks = [self.entries[r][0] for r in ids]
        fin = [self.entries[r][1] for r in ids]
        firsts = [r for r, k in zip(ids, toks) if self.streams[r][1] == k]     # no token before this step
        if len(firsts) == len(ids):
            d0 = min(self.streams[r][0] for r in ids)
            start = d0 if self.prev_t is None else max(self.prev_t, d0)
        else:
            start = self.prev_t
        dt = max(0.0, t - start)
        if self.prev_t is not None and len(firsts) < len(ids):
            self.gaps.append(t - self.prev_t)
        self.prev_t = t
        self.open_t = None
        self.entries = {}
        for r, f in zip(ids, fin):
            if f:
                del self.streams[r]
        self.steps += 1
        self.on_step(ids, toks, fin, dt, t)

    @property
    def in_flight(self) -> int:
        return len(self.streams)
