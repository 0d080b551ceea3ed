"""One whole measured run: the schedule sent to an endpoint, its run directory written as it goes.

``run`` opens the run directory (``config.json``, ``env.json`` first), sends the schedule in this
process (``fairlib.client.runner``) or sharded over worker processes (``fairlib.client.workers``),
appends ``records.jsonl`` as requests complete, samples ``/metrics`` and writes ``summary.json``
last.
"""
from __future__ import annotations

import gc
import time
from typing import Optional

from fairlib.client.endpoint import EndpointConfig
from fairlib.client.env import collect_env as collect_env_json
from fairlib.client.prom import MetricsScraper
from fairlib.client.runner import READ_BUFSIZE, run_inprocess
from fairlib.client.schedule import Schedule
from fairlib.client.workers import run_sharded
from fairlib.records.rundir import RunDir
from fairlib.records.summary import summarize

__all__ = ["run"]



def _check(schedule, cfg: EndpointConfig) -> None:
    for r in schedule:
        if cfg.api is not None and r.api != cfg.api:
            raise ValueError(f"request {r.request_id} is a {r.api} request but the endpoint is set to {cfg.api}")
        if r.api == "chat" and not isinstance(r.prompt, str):
            raise ValueError(f"request {r.request_id}: chat needs a text prompt")


def run(schedule, endpoint: EndpointConfig, run_dir, *, workers: int = 1, lag_threshold_ms: float = 10.0,
        scrape_metrics: bool = True, metrics_interval_s: float = 1.0, start_delay_s: float = 0.2,
        spin_s: float = 1e-3, collect_env: bool = True, handle_sigint: bool = True,
        config_extra: Optional[dict] = None, overwrite: bool = False) -> dict:
    """Send ``schedule`` open-loop to ``endpoint``; write ``run_dir``; return the summary.

    Writes ``config.json`` and ``env.json`` first, appends ``records.jsonl`` as requests complete,
    samples ``/metrics`` into ``server_metrics.jsonl`` at ``1/metrics_interval_s`` Hz, and writes
    ``summary.json`` last. ``workers > 1`` shards the schedule round-robin over that many
    processes (spawn; the calling script needs an ``if __name__ == "__main__":`` guard). Ctrl-C
    (SIGINT) stops cleanly: unsent requests are dropped, in-flight ones recorded as ``interrupted``,
    and the summary says ``"interrupted": true``.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if not isinstance(schedule, Schedule):
        schedule = Schedule(schedule)
    _check(schedule, endpoint)
    rd = RunDir(run_dir, overwrite=overwrite)
    rows = []
    writer = rd.records_writer()

    def on_record(rec):
        writer.write(rec)
        rows.append((rec["intended_send_s"], rec["actual_send_s"], rec["error_class"]))

    config = {
        "endpoint": endpoint.to_dict(), "workers": workers, "lag_threshold_ms": lag_threshold_ms,
        "scrape_metrics": scrape_metrics, "metrics_interval_s": metrics_interval_s,
        "start_delay_s": start_delay_s, "spin_s": spin_s, "read_bufsize": READ_BUFSIZE,
        "schedule": {"sha256": schedule.sha256(), "n_requests": len(schedule), "meta": schedule.meta,
                     "requested_rate_rps": schedule.rate_rps, "duration_s": schedule.duration_s},
        "extra": config_extra or {},
    }
    rd.write_json("config.json", config)
    if collect_env:
        rd.write_json("env.json", collect_env_json(endpoint))

    scraper = None
    t0_box = {}

    def on_start(t0_wall):
        nonlocal scraper
        t0_box["t0"] = t0_wall
        if scrape_metrics:
            scraper = MetricsScraper(endpoint.resolved_metrics_url, rd.path / "server_metrics.jsonl",
                                     t0_wall, interval_s=metrics_interval_s)
            scraper.start()

    gc.collect()
    gc.freeze()  # full collections skip everything allocated so far: shorter pauses mid-run
    try:
        if workers == 1:
            t0 = time.time() + start_delay_s
            on_start(t0)
            res = run_inprocess(schedule, endpoint, on_record, t0, spin_s=spin_s, handle_sigint=handle_sigint)
            interrupted, failures = res["interrupted"], []
        else:
            interrupted, failures = run_sharded(schedule, endpoint, workers, on_record, on_start,
                                                start_delay_s=start_delay_s, spin_s=spin_s,
                                                handle_sigint=handle_sigint)
    finally:
        gc.unfreeze()
        writer.close()
        scrape_stats = scraper.stop() if scraper is not None else None
    t0 = t0_box.get("t0", time.time())
    summary = summarize(rows, n_planned=len(schedule), requested_rate_rps=schedule.rate_rps,
                        lag_threshold_ms=lag_threshold_ms, interrupted=interrupted,
                        t0_wall=t0, t_end_wall=time.time())
    summary.update(workers=workers, worker_failures=failures, server_metrics=scrape_stats,
                   schedule_sha256=config["schedule"]["sha256"])
    rd.write_json("summary.json", summary)
    return summary
