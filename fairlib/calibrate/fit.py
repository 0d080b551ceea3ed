"""Fit the engine model to a real engine (vLLM, llama.cpp's server), with its fit quality and a
cross-check against the engine's own figures; save it as data (``data/engines/<engine>.json``).

Builds on :mod:`fairlib.calibrate.probe` (its steady-window estimate of one iteration, ``decode_point``, and
its least squares, ``linear_fit``) and adds what a real engine needs:

- **repeats**: every batch size ``B`` and every prompt length ``P`` is measured ``repeats`` times,
  interleaved (a slow spell of the shared machine hits every point alike); the fits use medians.
- **the decode context**: on a real engine one iteration costs more when the running sequences
  have longer contexts (attention reads every cached token; with this tiny model, hidden 512, it
  is a large part of the step). The decode sweep runs at several prompt lengths, and the fit is
  ``dt = iter_base + (slope_0 + slope_ctx * ctx) * B`` with ``ctx`` the mean context of the
  running sequences (prompt plus half the generated tokens). The engine model has one
  ``iter_slope``: :func:`engine_at` evaluates it at a context, and :func:`mean_decode_context`
  gives a scenario's (the token-weighted mean context of its decode steps), so each scenario is
  simulated with the slope of its own context.
- **a small-batch regime**: when ``dt(1)`` misses the ``B >= 2`` line by more than
  :data:`SMALL_BATCH_OFF` (llama.cpp: one sequence takes a matrix-vector path, much faster than
  the batched one), ``B = 1`` is a regime of its own, reported beside the fit, and the line is
  fitted over ``B >= 2``, where a loaded engine runs. A two-piece fit (best breakpoint) over the
  same range says whether one line is enough (*demanded* when the line explains less than
  :data:`PIECEWISE_R2_BELOW` of the variance and two pieces cut the residual sum of squares by
  more than :data:`PIECEWISE_SSE_CUT`).
- **prefill**: ``TTFT = c + prefill * P`` over the medians of single requests on the idle engine
  (linear), with a quadratic beside it to show how superlinear it is over the range. One untimed
  request per length comes first (``points.prefill_warmup``): vLLM-CPU runs the first prompt of a
  new length 3-13 ms slower.
- **server-side figures** beside the client's: llama.cpp's per-request ``timings``
  (``predicted_per_token_ms``: the iteration time its slots saw; ``prompt_ms``: pure prefill),
  vLLM's per-request metrics (``--enable-per-request-metrics``: ``mean_itl_ms``,
  ``time_to_first_token_ms``, ``queue_time_ms``) and its ``/metrics`` histograms
  (``vllm:inter_token_latency_seconds``, ``vllm:iteration_tokens_total``: sum and count before
  and after each batch).

The result is JSON that :func:`fairlib.calibrate.probe.load_probed_engine` (and :func:`load_fitted_engine`
here) reads into a :class:`fairlib.Engine` (its ``engine`` table: the model at :data:`REFERENCE_CONTEXT`),
and that ``fairlib.scenarios.load(..., capacity=path)`` accepts, with the engine, its version, the model's
shape, the machine, the date, the fit quality and every raw point.

    from fairlib.calibrate.lifecycle import start_engine
    from fairlib.calibrate import fit
    with start_engine("llamacpp", **fit.ENGINE_FLAGS["llamacpp"]) as eng:
        result = fit.fit_engine(eng, out="data/engines/llamacpp.json")
    engine = fit.load_fitted_engine("data/engines/llamacpp.json")     # at the reference context
    engine = fit.engine_at("data/engines/llamacpp.json", context=600)  # at another one

**An endpoint started elsewhere** (a GPU server, any machine): :func:`fit_endpoint` (on the command
line ``fairlib fit --endpoint URL [--model M] [--kind vllm|llamacpp|openai] [--max-batch N] --out
FILE``) measures it through :class:`EndpointEngine`, an adapter with what :func:`fit_engine` reads
of a started engine, and writes the same format, with the endpoint's identity in ``engine_info``
(:func:`server_identity`: base URL, the model and its ``root`` from ``GET /v1/models``, the server
kind and version from llama.cpp's ``GET /props`` or vLLM's ``GET /version``, the batch limit and
context window where the server tells them) and the client host in ``machine``. Prompts are words
unless a tokenizer is given; the decode context is then the server's own prompt count
(``usage.prompt_tokens``). With ``backend="http"`` a chapter calls :func:`fit_for_endpoint`, which
returns the fit only when it was made for the engine behind the endpoint (kind, model, server
version; and for the committed default, the same endpoint or machine) and otherwise refuses with
the command that fits it.

    fit.fit_endpoint("http://gpu:8000/v1", max_batch=16, out="runs/fits/vllm.json")
    d = fit.fit_for_endpoint("runs/fits/vllm.json", "http://gpu:8000/v1", engine_kind="vllm")
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Optional

import numpy as np

from fairlib.kinds import REAL_ENGINES, EngineKind
from fairlib.calibrate.lifecycle import start_engine
from fairlib.calibrate.probe import json_default
# the jobs of a fit, each a module of its own, re-exported here (the names the book and tests use)
from fairlib.calibrate.fit_math import (fit_decode,
                                       fit_decode_one, fit_prefill, piecewise_fit)
from fairlib.calibrate.identity import (EndpointEngine, engine_info, endpoint_engine,
                                       fit_command, fit_for_endpoint, machine_info, normalise_url, server_identity)
from fairlib.calibrate.measurement import FitSettings, measure
from fairlib.calibrate.saved_fits import (REFERENCE_CONTEXT, engine_at, fit_data_path, load_fit,
                                         load_fitted_engine, summary_table)

__all__ = ["FIT_VERSION", "DEFAULTS", "ENGINE_FLAGS", "REFERENCE_CONTEXT", "start", "fit_engine", "measure",
           "fit_decode", "fit_decode_one", "fit_prefill", "piecewise_fit", "engine_at", "mean_decode_context",
           "load_fitted_engine", "load_fit", "machine_info", "fit_data_path", "summary_table", "FitSettings",
           "server_identity", "EndpointEngine", "endpoint_engine", "fit_endpoint", "fit_for_endpoint", "fit_command",
           "batches_for", "normalise_url"]

FIT_VERSION = 1

#: Measurement settings per engine kind (what the committed fits used). ``prompt_tokens``: the
#: prompt lengths of the decode sweep (its contexts); the first prompt length of each is also the warm-up.
DEFAULTS = {
    "vllm": FitSettings(),
    "llamacpp": FitSettings(),
    "fairlib": FitSettings(decode_tokens=48, prompt_tokens=(16, 256), prefill_lengths=(16, 256, 512, 1024),
                           repeats=1, prefill_repeats=2),
}
DEFAULTS["openai"] = DEFAULTS["vllm"]   # any other OpenAI-compatible server: vLLM's sweep
# The server kinds a fit records: fairlib.kinds.FIT_KINDS (``fairlib`` is ``fairlib serve``, a test
# double; ``openai`` any other OpenAI-compatible server: no kind-specific request settings or
# server-side figures).
#: How the book starts each engine (``fairlib.calibrate.lifecycle.start_engine`` flags) for fits and scenarios.
#: vLLM: one OpenMP thread (``omp_threads_bind="0"``): with two, its threads spin-wait against the
#: client and the API server on the two cores and the iteration time turns bimodal (5 or 12 ms).
#: No prefix caching (the scenarios' prompts share their first words across scenarios).
#: llama.cpp: one thread, for the same reason; no RAM prompt cache (``--cache-ram 0``,
#: ``--no-cache-idle-slots``): by default every new request makes the server copy the KV state of
#: every idle slot into its prompt cache first, a stall that grows with the idle slots (none at a
#: full batch, most at a half-full one) and that no linear cost model has.
ENGINE_FLAGS = {
    "vllm": dict(max_num_seqs=16, max_model_len=4096, scheduling_policy="priority", omp_threads_bind="0",
                 extra_args=("--no-enable-prefix-caching",)),
    "llamacpp": dict(n_parallel=16, ctx_per_slot=4096, threads=1,
                     extra_args=("--cache-ram", "0", "--no-cache-idle-slots")),
}


def start(kind: str, **overrides):
    """Start an engine as the book does (:data:`ENGINE_FLAGS`, ``overrides`` on top); returns the
    started ``fairlib.calibrate.lifecycle.EngineProcess`` (use it in ``with``)."""
    return start_engine(kind, **{**ENGINE_FLAGS.get(kind, {}), **overrides})


def fit_endpoint(base_url: str, *, model: Optional[str] = None, kind: Optional[str] = None,
                 max_batch: Optional[int] = None, tokenizer=None, api: str = "completions", out=None,
                 verbose: bool = False, note: str = "", api_key: Optional[str] = None,
                 headers: Optional[dict] = None, **settings) -> dict:
    """Measure and fit the endpoint at ``base_url`` (started elsewhere, any machine): the
    :func:`fit_engine` result, in the same format (``load_fit``, ``load_fitted_engine``, ``engine_at``
    read it), with the endpoint's identity in ``engine_info`` (:meth:`EndpointEngine.info`) and the
    client host in ``machine``. ``settings`` override :data:`DEFAULTS` of the kind
    (``fairlib fit --endpoint URL`` on the command line)."""
    eng = endpoint_engine(base_url, model=model, kind=kind, max_batch=max_batch, tokenizer=tokenizer, api=api,
                          api_key=api_key, headers=headers)
    return fit_engine(eng, max_batch=eng.settings["max_num_seqs"], out=out, verbose=verbose, note=note, **settings)


def mean_decode_context(spec, n: int = 20000, seed: int = 12345) -> float:
    """A scenario's token-weighted mean decode context: over its tenants' length distributions
    (``n`` draws each), ``sum_i rate_i E[o (p + (o + 1) / 2)] / sum_i rate_i E[o]`` (a request with
    prompt ``p`` decodes its ``k``-th token at context ``p + k``)."""
    rng = np.random.default_rng(seed)
    num = den = 0.0
    for t, r in zip(spec.scenario.tenants, spec.scenario.rates_rps()):
        p = t.prompt.sample(rng, n).astype(float)
        o = t.output.sample(rng, n).astype(float)
        num += r * float(np.mean(o * (p + (o + 1) / 2)))
        den += r * float(np.mean(o))
    return num / den


def batches_for(max_batch: int) -> list:
    """The decode sweep's batch sizes up to ``max_batch``: 1, 2, 4, 8 and a quarter, half,
    three quarters and all of it (for 16: :data:`DEFAULTS`' 1, 2, 4, 8, 12, 16)."""
    n = int(max_batch)
    return sorted({b for b in (1, 2, 4, 8, *(max(1, round(n * f)) for f in (0.25, 0.5, 0.75, 1.0))) if b <= n})


def _summary(dec: dict, pre: dict, engine, prefill: float, max_batch: int) -> dict:
    """The fit's headline numbers: the joint decode fit ``dt(B, ctx)``, the engine at the reference
    context, the prefill slope, how well each fits, and the client/server timing ratios."""
    j = dec["joint"]
    return {
        "iter_base_ms": j["iter_base_ms"], "slope_0_ms": j["slope_0_ms"],
        "slope_ctx_ms_per_1k_tokens": 1e3 * j["slope_ctx_ms_per_token"],
        "reference_context": REFERENCE_CONTEXT, "iter_slope_ms_at_reference": engine.iter_slope_ms,
        "prefill_ms_per_token": prefill, "max_batch": max_batch,
        "decode_r2": j["r2"], "decode_max_abs_residual_ms": max(abs(r) for r in j["residuals_ms"]),
        "decode_B_range": j["B_range"], "contexts": dec["contexts"],
        "prefill_r2": pre["linear"]["r2"],
        "prefill_max_abs_residual_ms": max(abs(r) for r in pre["linear"]["residuals_ms"] or [0.0]),
        "small_batch_regime": dec["small_batch_regime"], "dt1_ms": dec["dt1_ms"],
        "piecewise_demanded": dec["piecewise_demanded"],
        "client_over_server_per_token": (dec.get("server") or {}).get("client_over_server_median"),
        "client_over_server_prefill_slope": (pre.get("server") or {}).get("client_slope_over_server_slope"),
    }


def fit_engine(eng, *, max_batch: Optional[int] = None, out=None, verbose: bool = False, note: str = "",
               **settings) -> dict:
    """Measure and fit a started engine (an ``fairlib.calibrate.lifecycle.EngineProcess``, or an
    :class:`EndpointEngine` for an endpoint started elsewhere: :func:`fit_endpoint`); returns the
    result and writes it to ``out`` (JSON) when given.

    ``max_batch``: the engine's batch limit (default: ``max_num_seqs`` for vLLM, ``n_parallel``
    for llama.cpp); batches above it are not sent. ``settings`` override :data:`DEFAULTS`."""
    kind = eng.kind
    p = replace(DEFAULTS.get(kind, DEFAULTS["fairlib"]), **settings)   # an unknown setting: TypeError naming it
    slots = eng.settings.get("max_num_seqs") or eng.settings.get("n_parallel")
    if max_batch is None:
        max_batch = slots or max(p.batches)
    max_batch = int(max_batch)
    if "batches" not in settings and max_batch > max(p.batches):
        p = replace(p, batches=batches_for(max_batch))   # a larger engine: the sweep reaches its batch limit
    p = replace(p, batches=[b for b in p.batches if b <= max_batch])
    tok = eng.tokenizer()
    limit = eng.settings.get("max_model_len") or eng.settings.get("ctx_per_slot")
    if limit:   # keep every request inside the context window (a word is more than a token on real models)
        words = 1.5 if tok is None and kind != EngineKind.FAIRLIB else 1.0

        def inside(vals, out_n: int) -> list:
            keep = [x for x in vals if x * words + out_n + 8 <= limit]
            return keep or [max(1, int((limit - out_n - 8) / words / 2))]
        p = replace(p, prompt_tokens=inside(p.prompt_tokens, p.decode_tokens),
                    prefill_lengths=inside(p.prefill_lengths, p.prefill_output_tokens))
    t0 = time.time()
    cfg = eng.endpoint_config(timeout_s=300.0, headers={"Connection": "close"})   # no stale keep-alive
    raw = measure(cfg, kind, p, tokenizer=tok, verbose=verbose)
    dec = fit_decode(raw["decode"], max_batch)
    pre = fit_prefill(raw["prefill"])
    if dec["joint"] is None:
        errs = sorted({e for q in raw["decode"] for e in q.get("errors") or []})
        ok = sum(q.get("dt_ms") is not None for q in raw["decode"])
        raise RuntimeError(f"fit: too few usable decode points ({ok} of {len(raw['decode'])} batches timed"
                           + (f"; request errors: {', '.join(errs)}" if errs else "") + ")")
    if pre["linear"]["slope"] is None:
        errs = sorted({q.get("error_class") for q in raw["prefill"] if q.get("error_class") != "none"})
        raise RuntimeError("fit: too few usable prefill points"
                           + (f" (request errors: {', '.join(map(str, errs))})" if errs else ""))
    prefill = max(pre["linear"]["slope"] or 0.0, 0.0)
    result = {"fit_version": FIT_VERSION, "engine_kind": kind,
              "engine": {"iter_base_ms": 1.0, "iter_slope_ms": 0.0, "prefill_ms_per_token": prefill,
                         "max_batch": max_batch, "max_prefill_tokens": None, "kv_capacity_tokens": None},
              "fit": {"decode": dec, "prefill": pre}}
    engine = engine_at(result, REFERENCE_CONTEXT)
    result["engine"] = engine.to_dict()
    result["fit"]["ttft_overhead_ms"] = (None if pre["linear"]["intercept"] is None else
                                         float(pre["linear"]["intercept"] - float(engine_at(result, 16).iteration_ms(1))))
    result["fit"]["summary"] = _summary(dec, pre, engine, prefill, max_batch)
    result.update({
        "capacity": {"max_batch": max_batch,
                     "output_tokens_per_s_at_reference": float(1e3 * max_batch / float(engine.iteration_ms(max_batch))),
                     "definition": "decode tokens/s at a full batch from the fitted dt(B) at the reference context"},
        "engine_info": engine_info(eng),
        "machine": machine_info(),
        "date": time.strftime("%Y-%m-%d", time.gmtime(t0)),
        "started_wall": t0, "duration_s": time.time() - t0,
        "params": raw["params"],
        "points": {"decode": raw["decode"], "prefill": raw["prefill"],
                   "prefill_warmup": raw.get("prefill_warmup", [])},
        "note": note,
    })
    if out is not None:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1, default=json_default) + "\n", encoding="utf-8")
    return result


def load_engine(path_or_kind):
    """Deprecated name of :func:`load_fitted_engine` (kept for code written against the old name)."""
    warnings.warn("fairlib.calibrate.fit.load_engine is deprecated: use load_fitted_engine",
                  DeprecationWarning, stacklevel=2)
    return load_fitted_engine(path_or_kind)


def main(argv=None) -> int:
    """``python -m fairlib.calibrate.fit vllm|llamacpp [--out PATH]``: start the engine as the book does
    (:data:`ENGINE_FLAGS`), fit it, save the result (default ``data/engines/<kind>.json``)."""
    ap = argparse.ArgumentParser(prog="python -m fairlib.calibrate.fit", description=main.__doc__)
    ap.add_argument("kind", choices=list(REAL_ENGINES))
    ap.add_argument("--out", default=None, help="default data/engines/<kind>.json")
    a = ap.parse_args(argv)
    with start(a.kind) as eng:
        res = fit_engine(eng, out=a.out or fit_data_path(a.kind), verbose=True)
    print(json.dumps(res["fit"]["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
