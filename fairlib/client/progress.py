"""A measured run's live counts on a terminal: answered of planned (the bar), sent, in flight,
failed, the p99 schedule lag so far and the run's clock.

``RunProgress`` is handed to ``fairlib.client.measure.run`` (``RunOptions.progress``); the run
calls ``start`` when its clock starts, ``on_send`` as each request leaves (workers count in shared
memory instead: ``set_sent``), ``on_record`` as each completes and ``close`` at its end. A helper
thread redraws at 2 Hz, only while the bar is live (``fairlib.progress``): it reads counters and
the latest lags, so it takes the sender's interpreter lock for microseconds.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable, Optional

import numpy as np

from fairlib.progress import Progress

__all__ = ["RunProgress"]

REFRESH_S = 0.5
LAG_WINDOW = 2000    # the p99 lag shown is over the latest answered requests


class RunProgress:
    """Counts of one run, drawn on ``progress``'s bar while it is live (nothing otherwise)."""

    def __init__(self, progress: Progress, n_planned: int, duration_s: float):
        self.progress, self.n_planned, self.duration_s = progress, int(n_planned), float(duration_s)
        self.sent = 0
        self.answered = 0
        self.failed = 0
        self.lags: deque = deque(maxlen=LAG_WINDOW)
        self._sent_fn: Optional[Callable[[], int]] = None
        self._t0: Optional[float] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._cm: Any = None      # the bar's context manager while it is open
        self._bar: Any = None

    # --- what the run calls ---------------------------------------------------------------------
    def on_preflight(self, results: list) -> None:
        """One stage line: each API's test request answered (``fairlib.client.preflight``)."""
        def ms(v):
            return "-" if v is None else f"{v:.0f} ms"
        self.progress.stage("preflight ok: " + "; ".join(
            f"{r['api']} HTTP {r['http_status']}, TTFT {ms(r['ttft_ms'])} (tenant {r['tenant']})" for r in results))

    def start(self, t0_wall: float) -> None:
        self._t0 = t0_wall
        self.progress.stage(f"sending {self.n_planned} requests over {self.duration_s:g} s "
                            f"(Ctrl-C stops the run and keeps what was measured)")
        if not self.progress.live or self._thread is not None:
            return
        self._cm = self.progress.bar(self.n_planned, "answered", "req")
        self._bar = self._cm.__enter__()
        self._thread = threading.Thread(target=self._loop, name="fairlib-progress", daemon=True)
        self._thread.start()

    def on_send(self) -> None:
        self.sent += 1

    def set_sent(self, fn: Callable[[], int]) -> None:
        """Read the sent count from ``fn`` (the workers' shared counters) instead of ``on_send``."""
        self._sent_fn = fn

    def on_record(self, rec: dict) -> None:
        self.answered += 1
        if rec["error_class"] not in ("none", "interrupted"):
            self.failed += 1
        if rec.get("send_lag_ms") is not None:
            self.lags.append(rec["send_lag_ms"])

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        if self._cm is not None:
            self._cm.__exit__(None, None, None)
            self._cm = self._bar = None

    # --- the drawing ----------------------------------------------------------------------------
    def text(self) -> str:
        """The counts as one line: sent, in flight, failed, p99 lag (ms), run time of the window."""
        sent = self._sent_fn() if self._sent_fn is not None else self.sent
        lags = np.fromiter(self.lags, float) if self.lags else None
        lag = f"{np.percentile(lags, 99):.1f} ms" if lags is not None and lags.size else "-"
        now = 0.0 if self._t0 is None else max(0.0, time.time() - self._t0)
        return (f"sent {sent}/{self.n_planned}, in flight {max(0, sent - self.answered)}, failed {self.failed}, "
                f"lag p99 {lag}, {now:.0f}/{self.duration_s:.0f} s")

    def _loop(self) -> None:
        while not self._stop.wait(REFRESH_S):
            self._draw()
        self._draw()

    def _draw(self) -> None:
        bar = self._bar
        if bar is None:
            return
        bar.n = self.answered
        bar.set_postfix_str(self.text(), refresh=False)
        bar.refresh()
