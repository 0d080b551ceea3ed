"""One upstream's decode steps, rebuilt from the token events on its streams as they arrive.

Under continuous batching every running sequence emits one token per iteration, all at its end;
over HTTP they arrive spread over a fraction of the iteration (the server writes the chunks one by
one: on vLLM's CPU build 0.3 ms at the median, 3 ms at the 99th percentile, against 13 ms
between a stream's tokens). ``StepTracker`` groups the token events of one upstream into steps and
hands each closed step to ``on_step(ids, tokens, finished, dt_ms, t_ms)`` (``PolicyGate.observe``):

- an event at ``t`` joins the open step unless its stream already emitted in it (a new iteration
  has begun) or ``t`` lies more than ``tol_ms`` after the step's first event: then the open step
  closes and a new one opens;
- the open step also closes as soon as every stream in flight on the upstream has emitted in it
  (nothing more can come; a stream sent after the step's first event cannot be in it), else
  ``tol_ms`` after its first event (``poll``: the gateway's timer);
- a step's time ``t_k`` is its first event's; its duration ``dt = t_k - start`` with ``start`` the
  previous step's time, or, when every emitter brings its first token, the later of that and the
  earliest dispatch among them (an upstream that was idle: its first step starts when the request
  was sent, as the analysis' first-token interval does, fairlib/analysis/service.py).

``tol_ms`` (``"auto"``): ``0.3 x`` the median gap between consecutive tokens of one stream (the
iteration time) over the last 256 gaps, within ``[1, 50]`` ms, 5 ms until 32 gaps are known;
the ``0.2 x`` of the analysis' reconstruction with room for a server that spreads its chunks
further. A stream's end (``finish``) joins its entry in the open step; an end that comes after its
last step closed (a separate final chunk that arrived late, a failure) is reported to
``on_late(rid)`` instead: the request leaves the batch without a finish for the policy
(``PolicyGate.withdraw``). Times are milliseconds on the gateway's clock.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Optional

__all__ = ["StepTracker"]

TOL_START_MS, TOL_MIN_MS, TOL_MAX_MS, TOL_FACTOR = 5.0, 1.0, 50.0, 0.3


class StepTracker:
    def __init__(self, on_step: Callable, on_late: Optional[Callable] = None, tol_ms="auto"):
        self.on_step, self.on_late = on_step, on_late
        if tol_ms != "auto" and (isinstance(tol_ms, bool) or not isinstance(tol_ms, (int, float)) or tol_ms <= 0):
            raise ValueError(f"tol_ms must be 'auto' or a number of ms > 0, got {tol_ms!r}")
        self.fixed_tol = None if tol_ms == "auto" else float(tol_ms)
        self.streams: dict = {}          # rid -> [dispatch_ms, tokens so far, time of its last token]
        self.open_t: Optional[float] = None
        self.entries: dict = {}          # rid -> [tokens, finished] in the open step
        self.prev_t: Optional[float] = None
        self.gaps: deque = deque(maxlen=256)
        self.steps = 0
        self._new_gaps = 0
        self._late = 0                   # streams dispatched after the open step's first event
        self.tol_ms = self.fixed_tol if self.fixed_tol is not None else TOL_START_MS

    # --- the tolerance -----------------------------------------------------------------------
    def _retune(self) -> None:
        """``tol_ms`` from the recent per-stream token gaps (fixed when given)."""
        if self.fixed_tol is None and len(self.gaps) >= 32:
            g = sorted(self.gaps)
            self.tol_ms = min(TOL_MAX_MS, max(TOL_MIN_MS, TOL_FACTOR * g[len(g) // 2]))

    # --- events ------------------------------------------------------------------------------
    def dispatched(self, rid: int, t_ms: float) -> None:
        """A request was sent to this upstream at ``t_ms``."""
        self.streams[rid] = [float(t_ms), 0, None]
        if self.open_t is not None:
            self._late += 1          # sent after the open step began: it cannot emit in it

    def tokens(self, rid: int, t_ms: float, k: int = 1, finished: bool = False) -> bool:
        """A chunk of ``k`` tokens of ``rid`` arrived at ``t_ms`` (``finished``: its stream's last).
        Returns True when this made the stream's entry in the open step finished (it was not)."""
        s = self.streams.get(rid)
        if s is None:
            raise KeyError(f"StepTracker: request {rid} was not dispatched here")
        if self.open_t is not None and (rid in self.entries or t_ms - self.open_t > self.tol_ms):
            self.close()
        if self.open_t is None:
            self.open_t = float(t_ms)
            self._late = 0
        if s[2] is not None:
            self.gaps.append(t_ms - s[2])
            self._new_gaps += 1
            if self._new_gaps >= 64:
                self._new_gaps = 0
                self._retune()
        s[1] += int(k)
        s[2] = t_ms
        self.entries[rid] = [int(k), bool(finished)]
        if len(self.entries) >= len(self.streams) - self._late:
            self.close()
        return bool(finished)

    def add_tokens(self, rid: int, k: int) -> bool:
        """``k`` more tokens of ``rid`` than its chunks were counted as (the answer's ``usage``):
        added to its entry in the open step. False when it has none (nothing added)."""
        e = self.entries.get(rid)
        if e is None or k <= 0:
            return False
        e[0] += int(k)
        self.streams[rid][1] += int(k)
        return True

    def finish(self, rid: int, t_ms: float) -> Optional[bool]:
        """The stream of ``rid`` ended (finish_reason, or the end of the body, or a failure).
        True: its entry in the open step is now finished; False: it was already; None: it had
        no entry (a late end: ``on_late``, or nothing if the stream had already left)."""
        e = self.entries.get(rid)
        if e is not None:
            was, e[1] = e[1], True
            return not was
        if self.streams.pop(rid, None) is not None and self.on_late is not None:
            self.on_late(rid)
        return None

    def forget(self, rid: int) -> bool:
        """``rid`` never reached this upstream (its connection failed before any byte): it leaves
        without a step. False when it had already emitted here (then it must :meth:`finish`)."""
        s = self.streams.get(rid)
        if s is None or s[1] or rid in self.entries:
            return False
        del self.streams[rid]
        return True

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
