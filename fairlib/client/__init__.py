"""fairlib's measurement client: an open-loop, multi-tenant load generator for OpenAI-compatible
streaming endpoints (vLLM, llama.cpp's server, ``fairlib serve``).

    from fairlib.client import EndpointConfig, build_schedule, run, load_records
    sched = build_schedule(workload_df, seed=0)            # arrival_ms, tenant, prompt_tokens, ...
    summary = run(sched, EndpointConfig(base_url="http://127.0.0.1:8000/v1", model="m"), "runs/x")
    df = load_records("runs/x")

Modules: ``stream`` (one response's chunks folded into a record's facts), ``schedule`` (the
precomputed schedule), ``endpoint`` (per-engine request shape), ``runner`` (the open-loop sender:
one request, one shard), ``workers`` (multi-process sharding), ``measure`` (``run``: a whole run
and its run directory), ``prom`` (``/metrics`` sampling), ``env`` (``env.json``). The SSE parser
and chunk interpreter it reads streams with are the wire format's, ``fairlib.protocol.sse``. The
record schema, the run directory and the summary are the seam both backends write:
``fairlib.records``.
"""
from fairlib.client.endpoint import EndpointConfig, build_request
from fairlib.client.measure import run
from fairlib.client.runner import RunClock, send_request, send_shard
from fairlib.client.schedule import PlannedRequest, Schedule, build_schedule, make_prompt
from fairlib.client.stream import StreamAccumulator
from fairlib.records.rundir import load_records, load_server_metrics, load_summary
from fairlib.records.schema import ERROR_CLASSES, RECORD_FIELDS

__all__ = [
    "EndpointConfig", "build_request", "ERROR_CLASSES", "RECORD_FIELDS", "load_records",
    "load_server_metrics", "load_summary", "RunClock", "run", "send_request", "send_shard",
    "PlannedRequest", "Schedule", "build_schedule", "make_prompt", "StreamAccumulator",
]
