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
from dataclasses import dataclass
from typing import Optional

from fairlib.client.endpoint import EndpointConfig, redact
from fairlib.client.env import collect_env as collect_env_json
from fairlib.client.preflight import preflight as send_preflight
from fairlib.client.progress import RunProgress
from fairlib.client.prom import MetricsScraper
from fairlib.client.runner import READ_BUFSIZE, run_inprocess
from fairlib.client.schedule import Schedule
from fairlib.client.workers import SIGNALS, run_sharded
from fairlib.records.rundir import RunDir
from fairlib.records.summary import MAX_ERROR_RATE, error_messages, exit_status, summarize

__all__ = ["run", "RunOptions", "RunStop", "max_workers", "exit_status", "MAX_ERROR_RATE"]


@dataclass(frozen=True)
class RunOptions:
    """How a run checks and shows itself, beside what it measures.

    ``preflight``: before the clock starts, send the schedule's first request of each API with
    ``max_tokens`` 1 and stop with ``fairlib.client.preflight.PreflightError`` (the server's
    message and a hint) when it fails; nothing is written then (``fairlib run`` turns it on).
    ``progress``: a ``fairlib.client.progress.RunProgress`` told of every send and record (a live
    bar on a terminal)."""

    preflight: bool = False
    progress: Optional[RunProgress] = None


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
        config_extra: Optional[dict] = None, overwrite: bool = False, options: RunOptions = RunOptions()) -> dict:
    """Send ``schedule`` open-loop to ``endpoint``; write ``run_dir``; return the summary.

    Request ``k`` is sent at ``t0 + schedule[k].send_offset_s`` whatever the answers before it
    (open loop); its schedule lag is ``actual - intended`` send time.

    Writes ``config.json`` and ``env.json`` first, appends ``records.jsonl`` as requests
    complete, samples ``/metrics`` at ``1/metrics_interval_s`` Hz in a child process
    (``fairlib.client.prom``: the raw text goes to ``server_metrics.raw.jsonl`` as it comes, its
    parse to ``server_metrics.jsonl`` after the run), and writes ``summary.json`` last.
    ``workers > 1`` shards the schedule round-robin over that many processes (spawn; the calling
    script needs an ``if __name__ == "__main__":`` guard), at most :func:`max_workers`.

    ``handle_sigint``: the first SIGINT, SIGTERM, SIGHUP or SIGQUIT, however early (also while
    the workers start), stops the run cleanly: unsent requests are dropped, in-flight ones
    recorded as ``interrupted``, the summary says ``"interrupted": true`` and ``"stopped_by"``
    names the signal, and ``run`` returns it; the caller decides what to do next (``fairlib run``
    exits 128 + the signal's number: 129, 130, 131, 143; :func:`exit_status`). Without it, a
    KeyboardInterrupt (or any exception) still leaves a summary (``stopped_by`` its name) and is
    re-raised. The summary is ``valid`` only for a complete run with at least one success and the
    schedule kept and at most ``max_error_rate`` (0 to 1, default 1%, recorded in config.json)
    of the answered requests failed (``fairlib.records.summary``). ``options``: :class:`RunOptions`
    (the preflight request, a progress bar); the preflight's outcome is ``config.json``'s
    ``preflight``.

    Parameters
    ----------
    schedule : Schedule or iterable of PlannedRequest
        What to send and when (``build_schedule``).
    endpoint : EndpointConfig
        Where to send it and how each request is shaped.
    run_dir : str or pathlib.Path
        The run directory to write (created; one that already holds records is refused unless
        ``overwrite``).
    workers : int, default 1
        Sender processes, 1 to :func:`max_workers` (the CPU count).
    lag_threshold_ms : float, default 10.0
        The run is valid only if its p99 schedule lag (ms) is at most this.
    max_error_rate : float, default MAX_ERROR_RATE
        Largest fraction (0 to 1; default 0.01) of the answered requests that may fail in a
        valid run.
    scrape_metrics : bool, default True
        Sample the server's ``/metrics`` during the run (``endpoint.resolved_metrics_url``).
    metrics_interval_s : float, default 1.0
        Seconds between two ``/metrics`` samples.
    start_delay_s : float, default 0.2
        Seconds from the start call to the run's time 0 (the workers' common start).
    spin_s : float, default 1e-3
        Each send sleeps until ``spin_s`` seconds before its time, then yield-spins to it.
    collect_env : bool, default True
        Write ``env.json`` (this machine, the packages, the endpoint's model list and version).
    handle_sigint : bool, default True
        Stop cleanly on the first SIGINT, SIGTERM, SIGHUP or SIGQUIT (above).
    config_extra : dict, optional
        Stored as ``config.json``'s ``extra`` (the scenario, seed, backend, label, ...).
    overwrite : bool, default False
        Replace the records of a run directory that has some.
    options : RunOptions, default RunOptions()
        The preflight request and the progress display.

    Returns
    -------
    dict
        The summary (also ``summary.json``): outcome counts, ``schedule_lag_ms`` (p50/p99/max),
        ``requested_rate_rps``/``achieved_rate_rps``, ``valid`` and ``valid_reason``,
        ``interrupted``, ``stopped_by``, ``workers``, ``worker_failures``, ``server_metrics``,
        ``schedule_sha256``.

    Raises
    ------
    ValueError
        ``workers`` or ``max_error_rate`` out of range, or a request whose ``api`` differs from
        ``endpoint.api`` (or a chat request without a text prompt), before anything is sent.
    FileExistsError
        ``run_dir`` already holds records and ``overwrite`` is false.
    fairlib.client.preflight.PreflightError
        With ``options.preflight``: the endpoint cannot serve the first request (nothing written).
    KeyboardInterrupt
        Without ``handle_sigint``, a Ctrl-C (as any exception while sending) is re-raised once
        ``summary.json`` is written.
    """
    if not 1 <= workers <= max_workers():
        raise ValueError(f"workers must be between 1 and {max_workers()} (the CPU count), got {workers}")
    if not isinstance(schedule, Schedule):
        schedule = Schedule(schedule)
    _check(schedule, endpoint)
    if not 0.0 <= float(max_error_rate) <= 1.0:
        raise ValueError(f"max_error_rate must be between 0 and 1, got {max_error_rate}")
    checked = send_preflight(schedule, endpoint) if options.preflight and len(schedule) else None
    if checked and options.progress is not None:
        options.progress.on_preflight(checked)
    stop = RunStop()
    if handle_sigint:
        stop.install()
    try:
        return _run(schedule, endpoint, run_dir, stop, workers=workers, lag_threshold_ms=lag_threshold_ms,
                    max_error_rate=float(max_error_rate),
                    scrape_metrics=scrape_metrics, metrics_interval_s=metrics_interval_s,
                    start_delay_s=start_delay_s, spin_s=spin_s, collect_env=collect_env,
                    config_extra=config_extra, overwrite=overwrite, preflight=checked, progress=options.progress)
    finally:
        stop.restore()
        if options.progress is not None:
            options.progress.close()


def _config(schedule, endpoint, *, workers, lag_threshold_ms, max_error_rate, scrape_metrics, metrics_interval_s,
            start_delay_s, spin_s, config_extra, preflight) -> dict:
    """What ``config.json`` records: the endpoint, the run's settings, the schedule's identity
    (sha256, size, rate, length), the caller's ``extra`` and the preflight's answer."""
    return {
        "endpoint": endpoint.to_dict(), "workers": workers, "lag_threshold_ms": lag_threshold_ms,
        "max_error_rate": max_error_rate,
        "scrape_metrics": scrape_metrics, "metrics_interval_s": metrics_interval_s,
        "start_delay_s": start_delay_s, "spin_s": spin_s, "read_bufsize": READ_BUFSIZE,
        "schedule": {"sha256": schedule.sha256(), "n_requests": len(schedule), "meta": schedule.meta,
                     "requested_rate_rps": schedule.rate_rps, "duration_s": schedule.duration_s},
        "extra": config_extra or {},
        "preflight": preflight,
    }


def _run(schedule, endpoint, run_dir, stop: RunStop, *, workers, lag_threshold_ms, max_error_rate, scrape_metrics,
         metrics_interval_s, start_delay_s, spin_s, collect_env, config_extra, overwrite, preflight,
         progress) -> dict:
    rd = RunDir(run_dir, overwrite=overwrite)
    rows, messages = [], []
    writer = rd.records_writer()

    def on_record(rec):
        writer.write(rec)
        rows.append((rec["intended_send_s"], rec["actual_send_s"], rec["error_class"]))
        if rec["error_class"] != "none":
            messages.append((rec["error_class"], rec["error_message"]))
        if progress is not None:
            progress.on_record(rec)

    config = _config(schedule, endpoint, workers=workers, lag_threshold_ms=lag_threshold_ms,
                     max_error_rate=max_error_rate, scrape_metrics=scrape_metrics,
                     metrics_interval_s=metrics_interval_s, start_delay_s=start_delay_s, spin_s=spin_s,
                     config_extra=config_extra, preflight=preflight)
    rd.write_json("config.json", redact(config, endpoint.secrets))   # no credential on disk
    if collect_env:
        rd.write_json("env.json", redact(collect_env_json(endpoint), endpoint.secrets))

    scraper = None
    t0_box = {}

    def on_start(t0_wall):
        nonlocal scraper
        t0_box["t0"] = t0_wall
        if progress is not None:
            progress.start(t0_wall)
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
            interrupted = run_inprocess(schedule, endpoint, on_record, t0, spin_s=spin_s, stop=stop,
                                        on_send=progress.on_send if progress is not None else None)["interrupted"]
        else:
            interrupted, failures = run_sharded(schedule, endpoint, workers, on_record, on_start,
                                                start_delay_s=start_delay_s, spin_s=spin_s, stop=stop,
                                                sent_count=progress.set_sent if progress is not None else None)
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
                        messages=error_messages(messages),
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
