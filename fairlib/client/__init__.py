"""fairlib's measurement client: an open-loop, multi-tenant load generator for OpenAI-compatible
streaming endpoints (vLLM, llama.cpp's server, ``fairlib serve``).

    from fairlib.client import EndpointConfig, build_schedule, run, load_records
    sched = build_schedule(workload_df, seed=0)            # arrival_ms, tenant, prompt_tokens, ...
    summary = run(sched, EndpointConfig(base_url="http://127.0.0.1:8000/v1", model="m"), "runs/x")
    df = load_records("runs/x")

Modules: ``sse`` (SSE parser, chunk interpreter), ``schedule`` (the precomputed schedule),
``endpoint`` (per-engine request shape), ``records`` (the record schema and error classes),
``runner`` (the open-loop sender, ``run``), ``workers`` (multi-process sharding), ``rundir`` (run
directory writer and loader), ``summary`` (lag and validity), ``prom`` (``/metrics`` sampling),
``env`` (``env.json``), ``replay`` (a tiny test double server).
"""
from .endpoint import EndpointConfig, build_request
from .records import ERROR_CLASSES, RECORD_FIELDS
from .rundir import load_records, load_server_metrics, load_summary
from .runner import RunClock, run, send_request, send_shard
from .schedule import PlannedRequest, Schedule, build_schedule, make_prompt
from .sse import SSEParser, StreamAccumulator, decode_payload, interpret_chunk

__all__ = [
    "EndpointConfig", "build_request", "ERROR_CLASSES", "RECORD_FIELDS", "load_records",
    "load_server_metrics", "load_summary", "RunClock", "run", "send_request", "send_shard",
    "PlannedRequest", "Schedule", "build_schedule", "make_prompt", "SSEParser",
    "StreamAccumulator", "decode_payload", "interpret_chunk",
]
