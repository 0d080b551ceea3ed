"""The per-request record of a measured run: its fields, error classes, and derived timings.

Times ending in ``_s`` are seconds on the run clock (0 = the run's start, shared by all worker
processes) unless said otherwise; ``*_wall`` are Unix times. Definitions (serving-metrics.md):
TTFT = first token-bearing chunk - actual send; E2E = last token-bearing chunk - actual send (the
usage chunk does not extend it); TPOT = (E2E - TTFT) / (completion_tokens - 1) with
completion_tokens from ``usage`` (or token ids), never from the chunk count. TPOT is unknown
(``None``), not 0, when the tokens did not arrive in at least two chunks: a non-streamed JSON
answer (``streamed: false``) or one chunk carrying them all (``n_token_chunks`` 1).

``chunk_tokens`` are the tokens of each token chunk and ``chunk_tokens_source`` says where they
come from (``usage`` deltas, ``token_ids``, or ``text``: the rule in ``fairlib.client.stream``).
``nonfinite`` lists where the server's JSON held ``NaN``/``Infinity`` (read as ``null``).
``error_message`` is ``None`` for a success (``error_class`` ``"none"``); ``retry_reason`` says
why a request was sent a second time (a keep-alive connection the server had closed as it left),
whatever its outcome, and is ``None`` when it was sent once.
"""
from __future__ import annotations

from typing import Optional

__all__ = ["ERROR_CLASSES", "RECORD_FIELDS", "new_record", "finish_record", "classify_status"]

ERROR_CLASSES = (
    "none",           # complete stream, at least max_tokens tokens
    "connect_error",  # could not connect (refused, DNS, ...)
    "http_4xx",       # non-200 answer below 500, except 429
    "http_429",       # rate limited / queue full
    "http_5xx",       # server error (also an error object inside a 200 stream, by its code)
    "timeout",        # EndpointConfig.timeout_s elapsed
    "disconnect",     # connection lost, or the stream ended without [DONE] / finish_reason
    "malformed_sse",  # bytes that are not SSE, or data that is not a JSON chunk
    "bad_content_type",  # a 200 answer neither SSE nor JSON (an HTML page, ...): type and first bytes
    "nonfinite_number",  # NaN/Infinity in the server's JSON (not JSON): read as null, listed in nonfinite
    "short_stream",   # complete, but completion_tokens < max_tokens
    "over_max_tokens",  # the server claims more completion tokens than max_tokens: not trusted
    "interrupted",    # in flight when the run was stopped (Ctrl-C)
    "client_error",   # an unexpected exception in the client itself (a bug: never expected)
    "record_error",   # the record could not be written as it was (a client bug, a full disk): run invalid
)

RECORD_FIELDS = (
    "request_id", "worker", "tenant", "tenant_name", "priority", "api",
    "prompt_tokens", "max_tokens",
    "intended_send_s", "actual_send_s", "send_lag_ms", "intended_send_wall", "actual_send_wall",
    "http_status", "error_class", "error_message", "retry_reason",
    "first_token_s", "last_token_s", "end_s",
    "ttft_s", "tpot_s", "e2e_s",
    "completion_tokens", "tokens_source", "n_token_chunks", "chunk_times_s", "chunk_tokens",
    "chunk_tokens_source", "finish_reason", "done", "streamed", "usage", "server_timings", "nonfinite",
)


def new_record(req, worker: int = 0) -> dict:
    """A record for a planned request, every field present (``None`` until known)."""
    rec = dict.fromkeys(RECORD_FIELDS)
    rec.update(request_id=req.request_id, worker=worker, tenant=req.tenant, tenant_name=req.tenant_name,
               priority=req.priority, api=req.api, prompt_tokens=req.prompt_tokens,
               max_tokens=req.max_tokens, intended_send_s=req.send_offset_s,
               error_class="none", error_message=None, chunk_times_s=[], chunk_tokens=[],
               n_token_chunks=0, done=False)
    return rec


def classify_status(status: int) -> str:
    if status == 429:
        return "http_429"
    return "http_5xx" if status >= 500 else "http_4xx"


def finish_record(rec: dict, acc, end_s: Optional[float], t0_wall: float) -> dict:
    """Fill the derived fields from a ``StreamAccumulator`` (``acc`` may be ``None``)."""
    send = rec["actual_send_s"]
    rec["end_s"] = end_s
    rec["intended_send_wall"] = t0_wall + rec["intended_send_s"]
    if send is not None:
        rec["actual_send_wall"] = t0_wall + send
        rec["send_lag_ms"] = (send - rec["intended_send_s"]) * 1e3
    if acc is None:
        return rec
    tokens, source = acc.resolve_chunk_tokens()
    rec.update(chunk_times_s=list(acc.chunk_times), chunk_tokens=tokens, chunk_tokens_source=source,
               n_token_chunks=len(acc.chunk_times), finish_reason=acc.finish_reason, done=acc.done,
               streamed=acc.streamed, usage=acc.usage, server_timings=acc.server_timings,
               nonfinite=list(acc.nonfinite) or None,
               completion_tokens=acc.completion_tokens, tokens_source=acc.tokens_source,
               first_token_s=acc.first_token_t, last_token_s=acc.last_token_t)
    if send is not None and acc.first_token_t is not None:
        rec["ttft_s"] = acc.first_token_t - send
        if rec["error_class"] in ("none", "short_stream"):
            rec["e2e_s"] = acc.last_token_t - send
            n = rec["completion_tokens"]
            if n is not None and n > 1 and len(acc.chunk_times) > 1:  # one chunk: TPOT unknown
                rec["tpot_s"] = (rec["e2e_s"] - rec["ttft_s"]) / (n - 1)
    return rec
