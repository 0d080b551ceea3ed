"""``summary.json``: outcome counts and the run's own validity (completeness, schedule lag, rate).

A run is ``valid`` only when all four hold (``valid_reason`` names each that fails):

- complete: every planned request was sent and recorded (``n_sent == n_records == n_planned``)
  and the run was not interrupted (a signal, an exception, a killed client);
- at least one request succeeded (``n_ok >= 1``: an unreachable endpoint measures nothing);
- every record was written as measured (no ``record_error``);
- p99 schedule lag <= ``lag_threshold_ms``, where lag = actual - intended send time over the sent
  requests: above it the client fell behind, and its latencies would partly be the client's.

Validity is about the measurement, not the server: a run in which the server answered most
requests with errors measured that faithfully (errors are a result). So the server's failures are
reported beside validity, and loudly:

- ``n_errors``: the answered requests that failed (every class but ``none`` and ``interrupted``:
  HTTP errors, timeouts, disconnects, short streams, ...); ``error_rate`` = ``n_errors / (n_ok +
  n_errors)`` (``None`` when nothing was answered);
- ``error_rate_exceeded``: ``error_rate > max_error_rate`` (default :data:`MAX_ERROR_RATE`, 0.5:
  most answered requests failed); then ``warnings`` says so (also for a valid run) and
  :func:`exit_status` gives 3, not 0, so a script never takes it for a clean success.

``exit_status(summary)`` is ``fairlib run``'s exit status: 0 complete, valid and the error rate
within ``max_error_rate``; 1 invalid or incomplete; 3 valid but ``error_rate_exceeded``;
128 + the signal's number when a signal stopped the run (``stopped_by``: 129 SIGHUP, 130 SIGINT
or a KeyboardInterrupt, 131 SIGQUIT, 143 SIGTERM).

Requested rate = (n - 1) / span of the planned send offsets; achieved rate = (n_sent - 1) / span
of the actual send times.
"""
from __future__ import annotations

from typing import Iterable, Optional

import signal

import numpy as np

from fairlib.records.schema import ERROR_CLASSES

__all__ = ["summarize", "lag_stats", "exit_status", "MAX_ERROR_RATE", "EXIT_ERROR_RATE"]

MAX_ERROR_RATE = 0.5   # above it (most answered requests failed) a valid run still exits non-zero
EXIT_ERROR_RATE = 3    # fairlib run's exit status for a valid run whose error rate is above it


def lag_stats(lags_ms) -> dict:
    a = np.asarray([x for x in lags_ms if x is not None], dtype=float)
    if a.size == 0:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "max": None, "mean": None}
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"n": int(a.size), "p50": float(p50), "p90": float(p90), "p99": float(p99),
            "max": float(a.max()), "mean": float(a.mean())}


def _rate(times) -> Optional[float]:
    if len(times) < 2:
        return None
    span = max(times) - min(times)
    return (len(times) - 1) / span if span > 0 else None


def summarize(rows: Iterable[tuple], *, n_planned: int, requested_rate_rps: Optional[float],
              lag_threshold_ms: float = 10.0, interrupted: bool = False, stopped_by: Optional[str] = None,
              t0_wall: Optional[float] = None, t_end_wall: Optional[float] = None,
              max_error_rate: float = MAX_ERROR_RATE) -> dict:
    """``rows``: ``(intended_send_s, actual_send_s, error_class)`` per record; ``stopped_by``: what
    ended the run early (``"SIGINT"``, ``"SIGTERM"``, ``"SIGHUP"``, an exception's name), named in
    the reason; ``max_error_rate`` (0 to 1): the error rate above which the summary warns."""
    if not 0.0 <= float(max_error_rate) <= 1.0:
        raise ValueError(f"max_error_rate must be between 0 and 1, got {max_error_rate}")
    rows = list(rows)
    n_planned = int(n_planned)
    counts = dict.fromkeys(ERROR_CLASSES, 0)
    for _, _, cls in rows:
        counts[cls] = counts.get(cls, 0) + 1
    sent = [(i, a) for i, a, _ in rows if a is not None]
    lag = lag_stats([(a - i) * 1e3 for i, a in sent])
    complete = not interrupted and len(sent) == len(rows) == n_planned
    lag_ok = lag["p99"] is not None and lag["p99"] <= lag_threshold_ms
    unwritten = counts.get("record_error", 0)  # records the writer could not keep as measured
    valid = complete and counts["none"] > 0 and lag_ok and not unwritten
    failed = []
    if not complete:
        how = f"interrupted by {stopped_by}" if stopped_by else ("interrupted" if interrupted else "incomplete")
        failed.append(f"{how}: {len(sent)} of {n_planned} planned requests sent, {len(rows)} recorded")
    if counts["none"] == 0:
        errs = ", ".join(f"{k} {v}" for k, v in counts.items() if v)
        failed.append("no request succeeded" + (f" ({errs})" if errs else ""))
    if unwritten:
        failed.append(f"{unwritten} record(s) could not be written as measured (record_error)")
    if lag["p99"] is not None and not lag_ok:
        failed.append(f"p99 schedule lag {lag['p99']:.3f} ms > {lag_threshold_ms} ms: the client fell behind")
    n_errors = sum(v for k, v in counts.items() if k not in ("none", "interrupted"))
    answered = counts["none"] + n_errors
    error_rate = n_errors / answered if answered else None
    exceeded = error_rate is not None and error_rate > max_error_rate
    warnings = []
    if exceeded:
        errs = ", ".join(f"{k} {v}" for k, v in counts.items() if v and k not in ("none", "interrupted"))
        warnings.append(f"error rate {error_rate:.3f} > max_error_rate {max_error_rate:g}: {n_errors} of "
                        f"{answered} answered requests failed ({errs})"
                        + ("; the measurement itself is valid" if valid else ""))
    if valid:
        reason = (f"complete ({n_planned} requests), {counts['none']} ok, {n_errors} errors, "
                  f"p99 schedule lag {lag['p99']:.3f} ms <= {lag_threshold_ms} ms")
    else:
        reason = "; ".join(failed)
    return {
        "n_planned": n_planned,
        "n_records": len(rows),
        "n_sent": len(sent),
        "n_not_sent": n_planned - len(sent),
        "n_ok": counts["none"],
        "n_errors": n_errors,
        "error_rate": error_rate,
        "max_error_rate": float(max_error_rate),
        "error_rate_exceeded": bool(exceeded),
        "warnings": warnings,
        "error_counts": counts,
        "schedule_lag_ms": lag,
        "lag_threshold_ms": float(lag_threshold_ms),
        "complete": bool(complete),
        "valid": bool(valid),
        "valid_reason": reason,
        "requested_rate_rps": requested_rate_rps,
        "achieved_rate_rps": _rate([a for _, a in sent]),
        "interrupted": bool(interrupted),
        "stopped_by": stopped_by,
        "start_wall": t0_wall,
        "end_wall": t_end_wall,
        "duration_s": (t_end_wall - t0_wall) if t0_wall is not None and t_end_wall is not None else None,
    }


def exit_status(summary: dict) -> int:
    """``fairlib run``'s exit status for a summary (the module docstring): 128 + the signal's
    number when one stopped the run, 130 for a KeyboardInterrupt, 1 when invalid, 3
    (``EXIT_ERROR_RATE``) when valid but ``error_rate_exceeded``, else 0."""
    stopped = summary.get("stopped_by")
    if stopped == "KeyboardInterrupt":
        return 128 + signal.SIGINT
    if isinstance(stopped, str) and stopped.startswith("SIG") and stopped in signal.Signals.__members__:
        return 128 + int(signal.Signals[stopped])
    if not summary.get("valid"):
        return 1
    return EXIT_ERROR_RATE if summary.get("error_rate_exceeded") else 0
