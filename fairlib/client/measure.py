"""One whole measured run: the schedule sent to an endpoint, its run directory written as it goes.

``run`` opens the run directory (``config.json``, ``env.json`` first), sends the schedule in this
process (``fairlib.client.runner``) or sharded over worker processes (``fairlib.client.workers``),
appends ``records.jsonl`` as requests complete, samples ``/metrics`` and writes ``summary.json``
last, also when the run ends early: on every catchable signal that would end the process
(``workers.SIGNALS``: SIGINT, SIGTERM, SIGHUP, SIGQUIT; ``RunStop``: in-flight requests are
recorded as ``interrupted``, the summary names the signal in ``stopped_by``) and on an exception
(written, then re-raised). SIGKILL cannot be caught: the workers die with the client
(``fairlib.client.workers``) and ``analyze`` reads a run without summary.json as incomplete.
``exit_status(summary)`` is ``fairlib run``'s exit status (``fairlib.records.summary``).
"""
from __future__ import annotations

import gc
import os
import signal
import threading
import time
from typing import Optional

from fairlib.client.endpoint import EndpointConfig, redact
from fairlib.client.env import collect_env as collect_env_json
from fairlib.client.prom import MetricsScraper
from fairlib.client.runner import READ_BUFSIZE, run_inprocess
from fairlib.client.schedule import Schedule
from fairlib.client.workers import SIGNALS, run_sharded
from fairlib.records.rundir import RunDir
from fairlib.records.summary import MAX_ERROR_RATE, exit_status, summarize

__all__ = ["run", "RunStop", "max_workers", "exit_status", "MAX_ERROR_RATE"]


def max_workers() -> int:
    """The most client processes a run may use: the CPU count (more only compete for the cores)."""
    return os.cpu_count() or 1


class RunStop:
    """The first stop signal of a run (``workers.SIGNALS``: SIGINT, SIGTERM, SIGHUP, SIGQUIT):
    ``signal`` is its name (``None`` until one arrives).

    ``install()`` puts the handler on each of them (from the main thread; elsewhere Python allows
    no handler and it does nothing), ``restore()`` puts the previous handlers back. The handler
    only records the name, so it is safe whatever the process is doing; the senders poll
    :meth:`is_set` (``runner.run_inprocess``, ``workers.run_sharded``)."""

    def __init__(self):
        self.signal: Optional[str] = None
        self._old: dict = {}

    def _handler(self, signum, frame) -> None:
        if self.signal is None:
            self.signal = signal.Signals(signum).name

    def is_set(self) -> bool:
        return self.signal is not None

    def install(self) -> "RunStop":
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._old[s] = signal.signal(s, self._handler)
        return self

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, signal.SIG_DFL if h is None else h)
        self._old.clear()



def _check(schedule, cfg: EndpointConfig) -> None:
    for r in schedule:
        if cfg.api is not None and r.api != cfg.api:
            raise ValueError(f"request {r.request_id} is a {r.api} request but the endpoint is set to {cfg.api}")
        if r.api == "chat" and not isinstance(r.prompt, str):
            raise ValueError(f"request {r.request_id}: chat needs a text prompt")


def run(schedule, endpoint: EndpointConfig, run_dir, *, workers: int = 1, lag_threshold_ms: float = 10.0,
        max_error_rate: float = MAX_ERROR_RATE, scrape_metrics: bool = True, metrics_interval_s: float = 1.0, start_delay_s: float = 0.2,
        spin_s: float = 1e-3, collect_env: bool = True, handle_sigint: bool = True,
        config_extra: Optional[dict] = None, overwrite: bool = False) -> dict:
    """Send ``schedule`` open-loop to ``endpoint``; write ``run_dir``; return the summary.

    Writes ``config.json`` and ``env.json`` first, appends ``records.jsonl`` as requests complete,
    samples ``/metrics`` at ``1/metrics_interval_s`` Hz in a child process (``fairlib.client.prom``:
    the raw text goes to ``server_metrics.raw.jsonl`` as it comes, its parse to
    ``server_metrics.jsonl`` after the run), and writes ``summary.json`` last. ``workers > 1`` shards the schedule round-robin over that many
    processes (spawn; the calling script needs an ``if __name__ == "__main__":`` guard), at most
    :func:`max_workers`.

    ``handle_sigint``: the first SIGINT, SIGTERM, SIGHUP or SIGQUIT, however early (also while
    the workers start), stops the run cleanly: unsent requests are dropped, in-flight ones
    recorded as ``interrupted``, the summary says ``"interrupted": true`` and ``"stopped_by"``
    names the signal, and ``run`` returns it; the caller decides what to do next (``fairlib run``
    exits 128 + the signal's number: 129, 130, 131, 143; :func:`exit_status`). Without it, a
    KeyboardInterrupt (or any exception) still leaves a summary (``stopped_by`` its name) and is
    re-raised. The summary is ``valid`` only for a complete run with at least one success and the
    schedule kept; ``max_error_rate`` (0 to 1, recorded in config.json): above this share of
    failed answers the summary warns and ``exit_status`` is 3 (``fairlib.records.summary``).
    """
    if not 1 <= workers <= max_workers():
        raise ValueError(f"workers must be between 1 and {max_workers()} (the CPU count), got {workers}")
    if not isinstance(schedule, Schedule):
        schedule = Schedule(schedule)
    _check(schedule, endpoint)
    if not 0.0 <= float(max_error_rate) <= 1.0:
        raise ValueError(f"max_error_rate must be between 0 and 1, got {max_error_rate}")
    stop = RunStop()
    if handle_sigint:
        stop.install()
    try:
        return _run(schedule, endpoint, run_dir, stop, workers=workers, lag_threshold_ms=lag_threshold_ms,
                    max_error_rate=float(max_error_rate),
                    scrape_metrics=scrape_metrics, metrics_interval_s=metrics_interval_s,
                    start_delay_s=start_delay_s, spin_s=spin_s, collect_env=collect_env,
                    config_extra=config_extra, overwrite=overwrite)
    finally:
        stop.restore()


def _run(schedule, endpoint, run_dir, stop: RunStop, *, workers, lag_threshold_ms, max_error_rate, scrape_metrics,
         metrics_interval_s, start_delay_s, spin_s, collect_env, config_extra, overwrite) -> dict:
    rd = RunDir(run_dir, overwrite=overwrite)
    rows = []
    writer = rd.records_writer()

    def on_record(rec):
        writer.write(rec)
        rows.append((rec["intended_send_s"], rec["actual_send_s"], rec["error_class"]))

    config = {
        "endpoint": endpoint.to_dict(), "workers": workers, "lag_threshold_ms": lag_threshold_ms,
        "max_error_rate": max_error_rate,
        "scrape_metrics": scrape_metrics, "metrics_interval_s": metrics_interval_s,
        "start_delay_s": start_delay_s, "spin_s": spin_s, "read_bufsize": READ_BUFSIZE,
        "schedule": {"sha256": schedule.sha256(), "n_requests": len(schedule), "meta": schedule.meta,
                     "requested_rate_rps": schedule.rate_rps, "duration_s": schedule.duration_s},
        "extra": config_extra or {},
    }
    rd.write_json("config.json", redact(config, endpoint.secrets))   # no credential on disk
    if collect_env:
        rd.write_json("env.json", redact(collect_env_json(endpoint), endpoint.secrets))

    scraper = None
    t0_box = {}

    def on_start(t0_wall):
        nonlocal scraper
        t0_box["t0"] = t0_wall
        if scrape_metrics:
            scraper = MetricsScraper(endpoint.resolved_metrics_url, rd.path / "server_metrics.jsonl",
                                     t0_wall, interval_s=metrics_interval_s, headers=endpoint.metrics_headers)
            scraper.start()

    gc.collect()
    gc.freeze()  # full collections skip everything allocated so far: shorter pauses mid-run
    interrupted, failures, error = False, [], None
    try:
        if stop.is_set():   # a signal before the start: nothing is sent
            interrupted = True
        elif workers == 1:
            t0 = time.time() + start_delay_s
            on_start(t0)
            interrupted = run_inprocess(schedule, endpoint, on_record, t0, spin_s=spin_s, stop=stop)["interrupted"]
        else:
            interrupted, failures = run_sharded(schedule, endpoint, workers, on_record, on_start,
                                                start_delay_s=start_delay_s, spin_s=spin_s, stop=stop)
    except BaseException as e:   # KeyboardInterrupt (no handler of ours), a bug: the summary still says so
        interrupted, error = True, e
    finally:
        gc.unfreeze()
        try:
            writer.close()
        finally:   # the sampler process ends on every way out (and with this process: prom.py)
            scrape_stats = scraper.stop() if scraper is not None else None
    t0 = t0_box.get("t0", time.time())
    summary = summarize(rows, n_planned=len(schedule), requested_rate_rps=schedule.rate_rps,
                        lag_threshold_ms=lag_threshold_ms, max_error_rate=max_error_rate, interrupted=interrupted,
                        stopped_by=stop.signal or (type(error).__name__ if error is not None else None),
                        t0_wall=t0, t_end_wall=time.time())
    if failures:
        why = f"{len(failures)} worker failure(s) (worker_failures)"
        summary["valid_reason"] = why if summary["valid"] else f"{summary['valid_reason']}; {why}"
        summary["valid"] = False
    summary.update(workers=workers, worker_failures=failures, server_metrics=scrape_stats,
                   schedule_sha256=config["schedule"]["sha256"])
    rd.write_json("summary.json", redact(summary, endpoint.secrets))
    if error is not None:
        raise error
    return summary
