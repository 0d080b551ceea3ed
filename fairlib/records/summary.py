"""``summary.json``: outcome counts and the run's own validity (completeness, schedule lag, errors).

A run is ``valid`` only when all five hold (``valid_reason`` names each that fails):

- complete: every planned request was sent and recorded (``n_sent == n_records == n_planned``)
  and the run was not interrupted (a signal, an exception, a killed client);
- at least one request succeeded (``n_ok >= 1``: an unreachable endpoint measures nothing);
- every record was written as measured (no ``record_error``);
- p99 schedule lag <= ``lag_threshold_ms``, where lag = actual - intended send time over the sent
  requests: above it the client fell behind, and its latencies would partly be the client's;
- the failed requests are at most ``max_error_rate`` (default :data:`MAX_ERROR_RATE`, 1%) of the
  answered ones: a run whose server failed more of them measured a broken setup (a wrong model,
  a full tenant table, an overloaded proxy), not the policy it was meant to measure.

Outcomes: ``n_ok`` (class ``none``); ``n_refused``: HTTP 429, a rate limit or an admission
control saying no (a policy's decision, measured faithfully: it is reported, never a failure);
``n_errors``: every other class but ``interrupted`` (HTTP 4xx/5xx, timeouts, disconnects, short
streams, ...); ``error_rate`` = ``n_errors / (n_ok + n_refused + n_errors)`` (``None`` when
nothing was answered), ``error_rate_exceeded`` = ``error_rate > max_error_rate``.
``error_messages`` (:func:`error_messages`): the first distinct messages of the failed and
refused requests with their counts, in order of first appearance (what the console prints).

``exit_status(summary)`` is ``fairlib run``'s exit status: 0 complete and valid; 1 invalid or
incomplete (the error rate included); 128 + the signal's number when a signal stopped the run
(``stopped_by``: 129 SIGHUP, 130 SIGINT or a KeyboardInterrupt, 131 SIGQUIT, 143 SIGTERM).

Requested rate = (n - 1) / span of the planned send offsets; achieved rate = (n_sent - 1) / span
of the actual send times.
"""
from __future__ import annotations

from typing import Iterable, Optional

import signal

import numpy as np

from fairlib.records.schema import ERROR_CLASSES

__all__ = ["summarize", "lag_stats", "exit_status", "error_messages", "MAX_ERROR_RATE", "REFUSED_CLASSES",
           "N_MESSAGES"]

MAX_ERROR_RATE = 0.01   # more failed requests than this share of the answered ones: the run is invalid
#: Error classes of a deliberate refusal (a rate limit, an admission control): not failures.
REFUSED_CLASSES = ("http_429",)
N_MESSAGES = 5          # distinct error messages kept in the summary


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


def error_messages(records: Iterable[tuple], limit: int = N_MESSAGES) -> list:
    """The first ``limit`` distinct messages of the failed and refused requests, in order of first
    appearance, with their counts: ``[{"error_class", "message", "count"}]``. ``records``:
    ``(error_class, error_message)`` pairs (every record; successes and ``interrupted`` ones are
    skipped). Messages are compared whole (up to 300 characters)."""
    seen: dict = {}
    for cls, msg in records:
        if cls in ("none", "interrupted"):
            continue
        key = (str(cls), " ".join(str(msg or "(no message)").split())[:300])
        seen[key] = seen.get(key, 0) + 1
    return [{"error_class": c, "message": m, "count": n} for (c, m), n in list(seen.items())[:limit]]


def summarize(rows: Iterable[tuple], *, n_planned: int, requested_rate_rps: Optional[float],
              lag_threshold_ms: float = 10.0, interrupted: bool = False, stopped_by: Optional[str] = None,
              t0_wall: Optional[float] = None, t_end_wall: Optional[float] = None,
              max_error_rate: float = MAX_ERROR_RATE, messages: Optional[list] = None) -> dict:
    """``rows``: ``(intended_send_s, actual_send_s, error_class)`` per record; ``stopped_by``: what
    ended the run early (``"SIGINT"``, ``"SIGTERM"``, ``"SIGHUP"``, an exception's name), named in
    the reason; ``max_error_rate`` (0 to 1): the share of failed answers above which the run is
    invalid; ``messages``: :func:`error_messages` of the records (kept as ``error_messages``)."""
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
    n_refused = sum(counts.get(k, 0) for k in REFUSED_CLASSES)
    n_errors = sum(v for k, v in counts.items() if k not in ("none", "interrupted") and k not in REFUSED_CLASSES)
    answered = counts["none"] + n_refused + n_errors
    error_rate = n_errors / answered if answered else None
    exceeded = error_rate is not None and error_rate > max_error_rate
    failed = []
    if not complete:
        how = f"interrupted by {stopped_by}" if stopped_by else ("interrupted" if interrupted else "incomplete")
        failed.append(f"{how}: {len(sent)} of {n_planned} planned requests sent, {len(rows)} recorded")
    if counts["none"] == 0:
        errs = ", ".join(f"{k} {v}" for k, v in counts.items() if v)
        failed.append("no request succeeded" + (f" ({errs})" if errs else ""))
    elif exceeded:
        errs = ", ".join(f"{k} {v}" for k, v in counts.items()
                         if v and k not in ("none", "interrupted") and k not in REFUSED_CLASSES)
        failed.append(f"{n_errors} of {answered} answered requests failed ({100 * (error_rate or 0.0):.1f}% > "
                      f"--max-error-rate {100 * max_error_rate:g}%: {errs})")
    if unwritten:
        failed.append(f"{unwritten} record(s) could not be written as measured (record_error)")
    if lag["p99"] is not None and not lag_ok:
        failed.append(f"p99 schedule lag {lag['p99']:.3f} ms > {lag_threshold_ms} ms: the client fell behind")
    valid = not failed
    warnings = []
    if n_refused and answered and n_refused / answered > max_error_rate:
        warnings.append(f"{n_refused} of {answered} answered requests were refused (HTTP 429: a rate limit or "
                        f"an admission control); a policy's decision, not a failure")
    if valid:
        reason = (f"complete ({n_planned} requests), {counts['none']} ok, {n_refused} refused, {n_errors} failed, "
                  f"p99 schedule lag {lag['p99']:.3f} ms <= {lag_threshold_ms} ms")
    else:
        reason = "; ".join(failed)
    return {
        "n_planned": n_planned,
        "n_records": len(rows),
        "n_sent": len(sent),
        "n_not_sent": n_planned - len(sent),
        "n_ok": counts["none"],
        "n_refused": n_refused,
        "n_errors": n_errors,
        "error_rate": error_rate,
        "max_error_rate": float(max_error_rate),
        "error_rate_exceeded": bool(exceeded),
        "error_messages": list(messages or []),
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
    number when one stopped the run, 130 for a KeyboardInterrupt, 1 when invalid (also by its
    error rate), else 0."""
    stopped = summary.get("stopped_by")
    if stopped == "KeyboardInterrupt":
        return 128 + signal.SIGINT
    if isinstance(stopped, str) and stopped.startswith("SIG") and stopped in signal.Signals.__members__:
        return 128 + int(signal.Signals[stopped])
    return 0 if summary.get("valid") else 1
