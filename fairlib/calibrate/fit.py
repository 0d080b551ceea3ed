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

The result is JSON that :func:`fairlib.calibrate.probe.load_engine` (and :func:`load_engine` here) reads into
a :class:`fairlib.Engine` (its ``engine`` table: the model at :data:`REFERENCE_CONTEXT`), and that
``fairlib.scenarios.load(..., capacity=path)`` accepts, with the engine, its version, the model's
shape, the machine, the date, the fit quality and every raw point.

    from fairlib.calibrate.lifecycle import start_engine
    from fairlib.calibrate import fit
    with start_engine("llamacpp", **fit.ENGINE_FLAGS["llamacpp"]) as eng:
        result = fit.fit_engine(eng, out="data/engines/llamacpp.json")
    engine = fit.load_engine("data/engines/llamacpp.json")            # at the reference context
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
import asyncio
import ipaddress
import json
import os
import platform
import shlex
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence
from urllib.parse import urlsplit

import numpy as np
import pandas as pd

from fairlib import paths
from fairlib.calibrate.lifecycle import start_engine
from fairlib.calibrate.probe import decode_point, json_default, linear_fit, run_coroutine
from fairlib.calibrate.probe import load_engine as _probe_load_engine
from fairlib.client import EndpointConfig
from fairlib.client.endpoint import server_root
from fairlib.client.env import fetch_json
from fairlib.client.prom import parse_prometheus
from fairlib.client.runner import RunClock, make_session, send_request
from fairlib.client.schedule import PlannedRequest, make_prompt
from fairlib.sim.engine import Engine

__all__ = ["FIT_VERSION", "DEFAULTS", "ENGINE_FLAGS", "REFERENCE_CONTEXT", "start", "fit_engine", "measure", "fit_decode",
           "fit_decode_one", "fit_prefill", "piecewise_fit", "engine_at", "mean_decode_context", "load_engine",
           "load_fit", "machine_info", "data_path", "summary_table", "KINDS", "server_identity", "EndpointEngine",
           "endpoint_engine", "fit_endpoint", "fit_for_endpoint", "fit_command", "batches_for",
           "normalise_url"]

FIT_VERSION = 1

#: Measurement settings per engine kind (what the committed fits used). ``prompt_tokens``: the
#: prompt lengths of the decode sweep (its contexts); the first prompt length of each is also the warm-up.
DEFAULTS = {
    "vllm": dict(batches=(1, 2, 4, 8, 12, 16), decode_tokens=64, prompt_tokens=(32, 320, 768),
                 prefill_lengths=(16, 64, 128, 256, 384, 512, 768), repeats=2, prefill_repeats=3),
    "llamacpp": dict(batches=(1, 2, 4, 8, 12, 16), decode_tokens=64, prompt_tokens=(32, 320, 768),
                     prefill_lengths=(16, 64, 128, 256, 384, 512, 768), repeats=2, prefill_repeats=3),
    "fairlib": dict(batches=(1, 2, 4, 8, 12, 16), decode_tokens=48, prompt_tokens=(16, 256),
                    prefill_lengths=(16, 256, 512, 1024), repeats=1, prefill_repeats=2),
}
DEFAULTS["openai"] = dict(DEFAULTS["vllm"])   # any other OpenAI-compatible server: vLLM's sweep
#: The server kinds a fit records: ``fairlib`` is ``fairlib serve`` (a test double), ``openai`` any
#: other OpenAI-compatible server (no kind-specific request settings or server-side figures).
KINDS = ("vllm", "llamacpp", "fairlib", "openai")
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
#: The context (tokens) of the ``engine`` table saved with a fit: a prompt of 320 and 32 generated.
REFERENCE_CONTEXT = 352.0
SMALL_BATCH_OFF = 0.25          # dt(1) this far from the B >= 2 line: a regime of its own
PIECEWISE_R2_BELOW = 0.95       # a single line explaining less than this ...
PIECEWISE_SSE_CUT = 0.5         # ... and a two-piece fit cutting the residual SSE by more than half


def start(kind: str, **overrides):
    """Start an engine as the book does (:data:`ENGINE_FLAGS`, ``overrides`` on top); returns the
    started ``fairlib.calibrate.lifecycle.EngineProcess`` (use it in ``with``)."""
    return start_engine(kind, **{**ENGINE_FLAGS.get(kind, {}), **overrides})


def data_path(kind: str) -> Path:
    """``data/engines/<kind>.json`` in the repository."""
    return paths.data_path("engines", f"{kind}.json")


# --- the machine and the engine ------------------------------------------------------------------
def machine_info() -> dict:
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return {"cpu_model": cpu or platform.processor() or None, "cores": os.cpu_count(), "cores_usable": affinity,
            "mem_gib": mem, "platform": platform.platform(), "machine": platform.machine()}


def _engine_info(eng) -> dict:
    """Kind, version, flags, the model's shape and the server's identity of the engine fitted: an
    ``EngineProcess`` (``fairlib.calibrate.lifecycle``) or an :class:`EndpointEngine` (an endpoint started
    elsewhere, :func:`endpoint_engine`)."""
    if isinstance(eng, EndpointEngine):
        return eng.info()
    info = {"kind": eng.kind, "base_url": eng.base_url, "model": eng.model, "command": list(eng.command),
            "settings": dict(eng.settings)}
    root = eng.server_root
    if eng.kind == "vllm":
        v = fetch_json(root + "/version")
        info["version"] = (v.get("body") or {}).get("version") if isinstance(v.get("body"), dict) else None
        info["engine"] = f"vLLM {info['version']} (vllm-cpu)" if info["version"] else "vLLM"
    elif eng.kind == "llamacpp":
        p = fetch_json(root + "/props")
        body = p.get("body") if isinstance(p.get("body"), dict) else {}
        info["version"] = body.get("build_info")
        info["total_slots"] = body.get("total_slots")
        info["engine"] = f"llama.cpp llama-server {info['version']}" if info["version"] else "llama.cpp llama-server"
    else:
        info["version"] = None
        info["engine"] = eng.kind
    if eng.model_path is not None:
        mp = Path(eng.model_path)
        meta = (mp if mp.is_dir() else mp.parent / mp.stem) / "fairlib_model.json"
        if meta.exists():
            m = json.loads(meta.read_text())
            info["model_shape"] = {"name": m.get("name"), **(m.get("params") or {}), "n_params": m.get("n_params")}
        info["model_path"] = str(mp)
    # what the server says about itself, as fit_for_endpoint reads it
    ident = server_identity(eng.base_url, eng.model)
    if info["version"] is None and ident["version"] is not None and ident["kind"] == eng.kind:
        info["version"] = ident["version"]
    for k in ("model_root", "max_model_len", "server"):
        info[k] = ident[k]
    info["max_num_seqs"] = eng.settings.get("max_num_seqs") or eng.settings.get("n_parallel")
    info["host"], info["local"] = ident["host"], _is_loopback(ident["host"])
    info["fitted_with"] = "fairlib.calibrate.fit.fit_engine on an engine started by fairlib.calibrate.lifecycle"
    return info


# --- an endpoint started elsewhere -----------------------------------------------------------------
#: Request settings per server kind (as ``fairlib.chapters.fidelity.endpoint_config`` sends them in the
#: chapters): vLLM returns the token ids (exact token counts), llama.cpp keeps no prompt cache.
EXTRA_BODY = {"vllm": {"return_token_ids": True}, "llamacpp": {"cache_prompt": False}}


def _host(url) -> Optional[str]:
    try:
        return urlsplit(str(url)).hostname
    except ValueError:
        return None


def _is_loopback(host) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def normalise_url(url) -> str:
    """The endpoint's OpenAI base URL (``http(s)://HOST[:PORT]/v1``; ``/v1`` added to a bare
    server URL); ``ValueError`` with a one-line reason for anything else."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError("no endpoint URL given: pass http://HOST:PORT/v1")
    u = url.strip()
    try:
        parts = urlsplit(u)
        parts.port                                      # raises on a bad port
    except ValueError as e:
        raise ValueError(f"{u!r} is not an endpoint URL ({e}): pass http://HOST:PORT/v1") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"{u!r} is not an endpoint URL: pass http://HOST:PORT/v1")
    path = parts.path.rstrip("/") or "/v1"
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = host + (f":{parts.port}" if parts.port is not None else "")   # user:password dropped
    return f"{parts.scheme}://{netloc}{path}"


def server_identity(base_url: str, model: Optional[str] = None, headers: Optional[dict] = None) -> dict:
    """What an endpoint says about itself (never raises): the models it lists (``GET /v1/models``;
    ``model``: the one asked for, default the first listed) with their ``root`` and
    ``max_model_len``, its kind and version (llama.cpp: ``GET /props`` ``build_info``, with
    ``total_slots`` as the batch limit and the per-slot ``n_ctx``; vLLM: ``GET /version``;
    ``fairlib serve``: ``GET /version`` "fairlib-serve ..." and ``max_batch`` from
    ``/fairlib/stats``; ``kind`` None when it tells nothing), and its ``Server`` header.
    ``reachable``: it answered HTTP at all; ``error``: why ``/v1/models`` failed. ``headers``: sent
    with each GET (the credentials)."""
    base = str(base_url).rstrip("/")
    root = server_root(base)
    out = {"base_url": base, "server_root": root, "host": _host(base), "reachable": False, "error": None,
           "models": None, "model": model, "model_root": None, "kind": None, "version": None, "server": None,
           "max_model_len": None, "max_num_seqs": None, "max_num_seqs_source": None}
    m = fetch_json(base + "/models", headers=headers)
    if "error" in m:
        out["error"] = f"GET {base}/models: {m['error']}"
        if not str(m["error"]).startswith("HTTP "):     # nothing answered: ask no more
            return out
    out["reachable"] = True
    out["server"] = m.get("server")
    body = m.get("body")
    data = body.get("data") if isinstance(body, dict) else None
    if isinstance(data, list):
        out["models"] = [str(x["id"]) for x in data if isinstance(x, dict) and x.get("id") is not None]
        if model is None and out["models"]:
            out["model"] = out["models"][0]
        entry = next((x for x in data if isinstance(x, dict) and str(x.get("id")) == out["model"]), None)
        if entry is not None:
            if isinstance(entry.get("root"), str):
                out["model_root"] = entry["root"]
            if isinstance(entry.get("max_model_len"), int):
                out["max_model_len"] = entry["max_model_len"]
    elif "error" not in m:
        out["error"] = f"GET {base}/models: no model list in the answer"
    props = fetch_json(root + "/props", headers=headers)
    pb = props.get("body")
    if isinstance(pb, dict) and "build_info" in pb:
        out.update(kind="llamacpp", version=pb.get("build_info"))
        if isinstance(pb.get("total_slots"), int):
            out.update(max_num_seqs=pb["total_slots"], max_num_seqs_source="GET /props total_slots")
        n_ctx = (pb.get("default_generation_settings") or {}).get("n_ctx")
        if out["max_model_len"] is None and isinstance(n_ctx, int):
            out["max_model_len"] = n_ctx                 # the context of one slot
        return out
    v = fetch_json(root + "/version", headers=headers)
    vb = v.get("body")
    if isinstance(vb, dict) and isinstance(vb.get("version"), str):
        if vb["version"].startswith("fairlib-serve"):
            out.update(kind="fairlib", version=vb["version"])
            st = fetch_json(root + "/fairlib/stats", headers=headers)
            cfg = (st.get("body") or {}).get("config") if isinstance(st.get("body"), dict) else None
            mb = ((cfg or {}).get("engine") or {}).get("max_batch")
            if isinstance(mb, int):
                out.update(max_num_seqs=mb, max_num_seqs_source="GET /fairlib/stats config.engine.max_batch")
        else:
            out.update(kind="vllm", version=vb["version"])
    return out


def _engine_label(kind: str, version, server=None) -> str:
    if kind == "vllm":
        return f"vLLM {version}" if version else "vLLM"
    if kind == "llamacpp":
        return f"llama.cpp llama-server {version}" if version else "llama.cpp llama-server"
    if kind == "fairlib":
        return f"{version or 'fairlib serve'} (a test double: the engine model in real time, not an engine)"
    return "an OpenAI-compatible server" + (f" ({server})" if server else "")


@dataclass
class EndpointEngine:
    """An endpoint started elsewhere (any machine), with what :func:`fit_engine` reads of a started
    engine: ``kind``, ``base_url``, ``model``, ``settings`` (``max_num_seqs``: the batch limit),
    ``tokenizer()``, ``endpoint_config()``, ``server_root``; ``identity`` is
    :func:`server_identity`'s answer; ``api_key`` and ``headers`` go with every request (never
    into the fit). Made by :func:`endpoint_engine`."""

    kind: str
    base_url: str
    model: str
    settings: dict
    identity: dict
    api: str = "completions"
    tokenizer_obj: object = None
    command: tuple = ()
    model_path: Optional[Path] = None
    api_key: Optional[str] = field(default=None, repr=False)
    headers: dict = field(default_factory=dict, repr=False)

    @property
    def server_root(self) -> str:
        return server_root(self.base_url)

    @property
    def metrics_url(self) -> str:
        return self.server_root + "/metrics"

    def tokenizer(self):
        return self.tokenizer_obj

    def endpoint_config(self, **overrides):
        kw = dict(base_url=self.base_url, model=self.model, api=self.api, ignore_eos=True, send_priority=False,
                  extra_body=dict(EXTRA_BODY.get(self.kind, {})), metrics_url=self.metrics_url,
                  api_key=self.api_key, headers=dict(self.headers))
        kw.update(overrides)
        return EndpointConfig(**kw)

    def info(self) -> dict:
        i = self.identity
        return {"kind": self.kind, "engine": _engine_label(self.kind, i["version"], i["server"]),
                "version": i["version"], "base_url": self.base_url, "server_root": self.server_root,
                "host": i["host"], "local": _is_loopback(i["host"]), "model": self.model, "models": i["models"],
                "model_root": i["model_root"], "max_model_len": i["max_model_len"],
                "max_num_seqs": self.settings["max_num_seqs"],
                "max_num_seqs_source": self.settings["max_num_seqs_source"],
                "kind_source": self.settings["kind_source"], "server": i["server"], "api": self.api,
                "command": None, "settings": dict(self.settings),
                "tokenizer": "given" if self.tokenizer_obj is not None else "none (prompts of N words)",
                "fitted_with": "fairlib fit --endpoint (fairlib.calibrate.fit.fit_endpoint)",
                "machine_note": "'machine' is the client host the fit ran on; the engine runs behind base_url"}


def endpoint_engine(base_url: str, *, model: Optional[str] = None, kind: Optional[str] = None,
                    max_batch: Optional[int] = None, tokenizer=None, api: str = "completions",
                    api_key: Optional[str] = None, headers: Optional[dict] = None) -> EndpointEngine:
    """An :class:`EndpointEngine` for the endpoint at ``base_url``; ``ValueError`` (one line) when
    the URL is not one, nothing answers, the model is not served, ``kind`` contradicts what the
    server says, or the batch limit is unknown (``max_batch``: vLLM's ``--max-num-seqs``;
    llama.cpp and ``fairlib serve`` tell theirs). ``api_key`` (sent as ``Authorization: Bearer``)
    and ``headers`` go with every request."""
    base = normalise_url(base_url)
    headers = dict(headers or {})
    cred = {**headers, **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind {kind!r}: one of {', '.join(KINDS)}")
    ident = server_identity(base, model, headers=cred)
    if not ident["reachable"]:
        raise ValueError(f"{base} does not answer ({ident['error']}): is the server up, and is this its "
                         "OpenAI base URL (http://HOST:PORT/v1)?")
    if not ident["models"]:
        raise ValueError(f"{base}/models lists no model ({ident['error'] or 'an empty list'}): is this the "
                         "OpenAI base URL (http://HOST:PORT/v1)?")
    if model is not None and model not in ident["models"]:
        raise ValueError(f"{base} serves {', '.join(map(repr, ident['models']))}, not {model!r}")
    detected = ident["kind"]
    if kind is not None and detected is not None and kind not in (detected, "openai"):
        raise ValueError(f"kind {kind!r}, but {base} says it is {detected} {ident['version'] or ''}".rstrip()
                         + f" (GET {'/props' if detected == 'llamacpp' else '/version'}): leave the kind out (it is"
                         " read from the server) or pass openai")
    use = kind or detected or "openai"
    told = ident["max_num_seqs"]
    if max_batch is not None:
        max_batch = int(max_batch)
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if told is not None and max_batch > told:
            raise ValueError(f"max_batch {max_batch}, but {base} runs at most {told} sequences at once "
                             f"({ident['max_num_seqs_source']})")
        source = "given (--max-batch)"
    else:
        if told is None:
            raise ValueError(f"{base} ({_engine_label(use, ident['version'], ident['server'])}) does not say how "
                             "many sequences it runs at once: pass --max-batch N (vLLM: its --max-num-seqs)")
        max_batch, source = told, ident["max_num_seqs_source"]
    settings = {"max_num_seqs": max_batch, "max_num_seqs_source": source,
                "max_num_seqs_server": told, "max_model_len": ident["max_model_len"],
                "kind_source": "given" if kind else ("GET /props" if detected == "llamacpp" else
                                                     "GET /version" if detected else "default (openai)")}
    return EndpointEngine(kind=use, base_url=base, model=ident["model"], settings=settings, identity=ident,
                          api=api, tokenizer_obj=tokenizer, api_key=api_key, headers=headers)


def fit_endpoint(base_url: str, *, model: Optional[str] = None, kind: Optional[str] = None,
                 max_batch: Optional[int] = None, tokenizer=None, api: str = "completions", out=None,
                 verbose: bool = False, note: str = "", api_key: Optional[str] = None,
                 headers: Optional[dict] = None, **settings) -> dict:
    """Measure and fit the endpoint at ``base_url`` (started elsewhere, any machine): the
    :func:`fit_engine` result, in the same format (``load_fit``, ``load_engine``, ``engine_at``
    read it), with the endpoint's identity in ``engine_info`` (:meth:`EndpointEngine.info`) and the
    client host in ``machine``. ``settings`` override :data:`DEFAULTS` of the kind
    (``fairlib fit --endpoint URL`` on the command line)."""
    eng = endpoint_engine(base_url, model=model, kind=kind, max_batch=max_batch, tokenizer=tokenizer, api=api,
                          api_key=api_key, headers=headers)
    return fit_engine(eng, max_batch=eng.settings["max_num_seqs"], out=out, verbose=verbose, note=note, **settings)


def fit_command(endpoint: str, *, kind: Optional[str] = None, model: Optional[str] = None,
                max_batch: Optional[int] = None, out: Optional[str] = None) -> str:
    """The one command that fits ``endpoint`` (what a refusal tells the reader to run)."""
    parts = ["fairlib", "fit", "--endpoint", str(endpoint)]
    if model:
        parts += ["--model", str(model)]
    if kind:
        parts += ["--kind", str(kind)]
    if max_batch:
        parts += ["--max-batch", str(max_batch)]
    parts += ["--out", out or f"runs/fits/{kind or 'engine'}.json"]
    cmd = " ".join(shlex.quote(p) for p in parts)
    if not max_batch:    # the server does not tell it (vLLM): the reader does
        cmd = cmd.replace(" --out ", " --max-batch N --out ", 1) + "    # N: the server's --max-num-seqs"
    return cmd


#: The fields of ``machine`` that must agree for a fit of an engine on this machine to describe it.
MACHINE_KEYS = ("cpu_model", "cores", "machine")


def _machine_text(m: dict) -> str:
    return f"{m.get('cpu_model') or '?'} ({m.get('cores') or '?'} cores, {m.get('machine') or '?'})"


def _describe_fit(d: dict) -> str:
    """What a fit was made for, as a sentence's predicate."""
    fi = d.get("engine_info") or {}
    where = f"at {fi.get('base_url')}" if fi.get("base_url") else "at an unrecorded URL"
    return (f"was made for {fi.get('engine') or d.get('engine_kind')} [kind {d.get('engine_kind') or fi.get('kind')}, "
            f"version {fi.get('version')}] serving {fi.get('model')!r} {where}, on "
            f"{_machine_text(d.get('machine') or {})}, {d.get('date')}")


def _describe_endpoint(ident: dict) -> str:
    """What an endpoint is, as a sentence's predicate."""
    served = ", ".join(map(repr, ident["models"] or [])) or "no model list"
    label = _engine_label(ident["kind"] or "openai", ident["version"], ident["server"])
    return (f"is {label} [kind {ident['kind'] or 'not told'}, version {ident['version'] or 'not told'}] serving "
            f"{served}, seen from {_machine_text(machine_info())}")


def fit_for_endpoint(fit_file, endpoint: str, engine_kind: Optional[str] = None,
                     model: Optional[str] = None) -> dict:
    """The fit to use with ``backend="http"``: loads ``fit_file`` (``None``: the committed
    ``data/engines/<engine_kind>.json``, the kind defaulting to what the endpoint says it is) and
    returns it when it describes the engine behind ``endpoint``; otherwise ``ValueError`` naming the
    fit file, what it was made for, what the endpoint is, and the one command that fits it.

    Refused when (the endpoint asked with :func:`server_identity`):

    - the fit's engine kind differs from ``engine_kind`` or from the kind the server says it is
      (a fit of kind ``openai`` is checked against ``engine_kind`` only);
    - the fit's model differs from the model the chapter sends (``model``, default the first the
      endpoint lists), or, both recorded, the model's ``root`` (its checkpoint) differs;
    - the fit's server version differs from the endpoint's (either one recorded);
    - ``fit_file`` is None and the committed fit was made for another endpoint or machine: a fit of
      an engine on the loopback interface describes only an engine on this machine's loopback,
      and only when this machine is the one it was made on (``MACHINE_KEYS`` of ``machine``); a
      fit of a remote endpoint, only that endpoint (same server root).

    A fit given as ``fit_file`` is trusted for the machine (a fresh fit of a local engine passes
    against its own endpoint); an endpoint that does not answer is refused too."""
    base = normalise_url(endpoint)
    ident = server_identity(base, model)
    if not ident["reachable"]:
        raise ValueError(f"backend='http': the endpoint {base} does not answer ({ident['error']}); start it, or "
                         "fix `endpoint` (the OpenAI base URL, http://HOST:PORT/v1)")
    if engine_kind is not None and engine_kind not in KINDS:
        raise ValueError(f"engine_kind {engine_kind!r}: one of {', '.join(KINDS)}")
    kind = engine_kind or ident["kind"]
    default = fit_file is None
    if default and kind is None:
        raise ValueError(f"backend='http': {base} does not say what server it is: pass engine_kind, and a fit_file "
                         f"made for it:\n    {fit_command(base, kind='openai', model=ident['model'])}")
    path = data_path(kind) if default else Path(fit_file)
    cmd = fit_command(base, kind=None if ident["kind"] else engine_kind, model=model or ident["model"],
                      max_batch=ident["max_num_seqs"], out=f"runs/fits/{ident['kind'] or kind or 'engine'}.json")
    try:
        d = load_fit(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"backend='http': cannot read the fit file {path} ({type(e).__name__}: {e}); fit the "
                         f"endpoint with\n    {cmd}\nand pass that file as fit_file") from None
    if not isinstance(d, dict) or "fit_version" not in d or "engine_info" not in d:
        raise ValueError(f"backend='http': {path} is not a fit of fairlib.calibrate.fit (a `fairlib probe` result has one "
                         f"context and no engine identity); fit the endpoint with\n    {cmd}")
    fi = d.get("engine_info") or {}
    fk = d.get("engine_kind") or fi.get("kind")
    why = []
    if engine_kind is not None and fk not in (engine_kind,):
        why.append(f"engine kind: the fit is for {fk!r}, engine_kind is {engine_kind!r}")
    elif ident["kind"] is not None and fk not in (ident["kind"], "openai"):
        why.append(f"engine kind: the fit is for {fk!r}, the endpoint is {ident['kind']!r}")
    sent = model or ident["model"]
    if model is not None and ident["models"] is not None and model not in ident["models"]:
        why.append(f"model: the endpoint does not serve {model!r}")
    if fi.get("model") != sent:
        why.append(f"model: the fit is for {fi.get('model')!r}, the chapter would send {sent!r}")
    elif fi.get("model_root") and ident["model_root"] and fi["model_root"] != ident["model_root"]:
        why.append(f"model: the fit's {fi.get('model')!r} is {fi['model_root']!r}, the endpoint's is "
                   f"{ident['model_root']!r}")
    if (fi.get("version") or ident["version"]) and fi.get("version") != ident["version"]:
        why.append(f"server version: the fit is for {fi.get('version')!r}, the endpoint says {ident['version']!r}")
    if default:
        fit_host = _host(fi.get("base_url"))
        if _is_loopback(fit_host):
            if not _is_loopback(ident["host"]):
                why.append(f"endpoint: the fit was made for an engine on its own machine ({fi.get('base_url')}), "
                           f"the endpoint is on {ident['host']}")
            else:
                here, there = machine_info(), d.get("machine") or {}
                diff = [k for k in MACHINE_KEYS if here.get(k) != there.get(k)]
                if diff:
                    why.append("machine: the fit was made on another machine ("
                               + ", ".join(f"{k} {there.get(k)!r} there, {here.get(k)!r} here" for k in diff) + ")")
        else:
            froot = str(fi.get("server_root") or fi.get("base_url") or "").rstrip("/")
            froot = froot[:-3] if froot.endswith("/v1") else froot
            if froot != ident["server_root"]:
                why.append(f"endpoint: the fit was made for {fi.get('base_url')}, not {base}")
    if why:
        raise ValueError(
            f"backend='http': the fit file {path} does not describe the endpoint {base}:\n"
            + "".join(f"  - {w}\n" for w in why)
            + f"The fit file {_describe_fit(d)}.\n"
            + f"The endpoint {_describe_endpoint(ident)}.\n"
            + "Fit this endpoint with one command, then pass the file as fit_file (papermill -r fit_file PATH):\n"
            + f"    {cmd}")
    return d


# --- measuring -----------------------------------------------------------------------------------
def _hist(metrics: dict, name: str) -> tuple:
    """(sum, count) of a Prometheus histogram in a parsed /metrics sample (labels summed over)."""
    s = sum(v for k, v in metrics.items() if k.split("{")[0] == name + "_sum" and v is not None)
    c = sum(v for k, v in metrics.items() if k.split("{")[0] == name + "_count" and v is not None)
    return s, c


def _scrape(url: str, headers=None) -> dict:

    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(urllib.request.Request(url, headers=dict(headers or {})), timeout=3.0) as r:
            return parse_prometheus(r.read().decode("utf-8", "replace"))
    except OSError:
        return {}


def _server_decode(records: list, kind: str) -> dict:
    """The engine's own per-token figure for a batch of simultaneous streams (median over them)."""
    st = [r.get("server_timings") or {} for r in records if r.get("error_class") == "none"]
    if kind == "llamacpp":
        v = [s["predicted_per_token_ms"] for s in st if s.get("predicted_per_token_ms")]
        return {"server_ms_per_token": float(np.median(v)) if v else None, "server_source": "timings.predicted_per_token_ms"}
    if kind == "vllm":
        v = [(s.get("metrics") or {}).get("mean_itl_ms") for s in st]
        v = [x for x in v if x]
        return {"server_ms_per_token": float(np.median(v)) if v else None, "server_source": "metrics.mean_itl_ms"}
    return {"server_ms_per_token": None, "server_source": None}


def _server_prefill(rec: dict, kind: str) -> Optional[float]:
    s = rec.get("server_timings") or {}
    if kind == "llamacpp":
        return s.get("prompt_ms")
    if kind == "vllm":
        m = s.get("metrics") or {}
        if m.get("time_to_first_token_ms") is not None:
            return float(m["time_to_first_token_ms"]) - float(m.get("queue_time_ms") or 0.0)
    return None


async def _measure_async(cfg, kind: str, p: dict) -> dict:
    clock = RunClock(time.time())
    counter = {"k": 0}
    tok = p["tokenizer"]
    metrics_url = cfg.resolved_metrics_url if kind == "vllm" else None
    log = p["log"]

    def plan(n_prompt: int, n_out: int):
        k = counter["k"]
        counter["k"] += 1
        prompt, n = make_prompt(p["seed"], 0, k, n_prompt, tok, tok is not None)
        return PlannedRequest(k, 0, "fit", 0.0, prompt, n, n_out, 0, "completions")

    decode, prefill = [], []
    async with make_session(cfg) as session:
        async def send(reqs):
            return list(await asyncio.gather(*(send_request(session, r, cfg, clock) for r in reqs)))

        for _ in range(p["warmup"]):
            await send([plan(p["prompt_tokens"][0], 8) for _ in range(2)])
        for rep in range(p["repeats"]):
            for pt in p["prompt_tokens"]:
                for B in p["batches"]:
                    before = _scrape(metrics_url, cfg.metrics_headers) if metrics_url else {}
                    t = time.perf_counter()
                    recs = await send([plan(pt, p["decode_tokens"]) for _ in range(B)])
                    wall = time.perf_counter() - t
                    after = _scrape(metrics_url, cfg.metrics_headers) if metrics_url else {}
                    pt_ = decode_point(recs, B)
                    pt_.update(rep=rep, prompt_tokens=pt, context=pt + p["decode_tokens"] / 2.0, wall_s=wall,
                               **_server_decode(recs, kind))
                    if before and after:
                        s0, c0 = _hist(before, "vllm:inter_token_latency_seconds")
                        s1, c1 = _hist(after, "vllm:inter_token_latency_seconds")
                        pt_["server_hist_itl_ms"] = 1e3 * (s1 - s0) / (c1 - c0) if c1 > c0 else None
                        s0, c0 = _hist(before, "vllm:iteration_tokens_total")
                        s1, c1 = _hist(after, "vllm:iteration_tokens_total")
                        pt_["server_hist_tokens_per_iteration"] = (s1 - s0) / (c1 - c0) if c1 > c0 else None
                    counts = [(r.get("usage") or {}).get("prompt_tokens") for r in recs]
                    counts = [c for c in counts if isinstance(c, (int, float))]
                    pt_["prompt_tokens_server"] = float(np.median(counts)) if counts else None
                    decode.append(pt_)
                    dt = pt_["dt_ms"]
                    srv = pt_["server_ms_per_token"]
                    log(f"fit: rep {rep} prompt {pt:4d} B={B:3d} dt={dt if dt is None else round(dt, 3)} ms "
                        f"server={srv if srv is None else round(srv, 3)} concurrent={pt_['concurrent']}")
        # one untimed request per prefill length first: vLLM-CPU's first prompt of a length it has
        # not run yet is slower (+3 to +13 ms at 64-512 tokens in every saved fit: the first repeat
        # of each new length), and a warm-up in the timed repeats leaves the median one disturbance
        # from a wrong value (a quick fit's prefill R2 of 0.78 over 4 lengths x 3 repeats)
        warm = []
        if p["warmup"] > 0:
            for P in p["prefill_lengths"]:
                rec = (await send([plan(P, p["prefill_output_tokens"])]))[0]
                warm.append({"P_sent": P, "ttft_ms": None if rec.get("ttft_s") is None else rec["ttft_s"] * 1e3,
                             "error_class": rec.get("error_class")})
            log("fit: prefill warm-up (not fitted): " + ", ".join(
                f"P={q['P_sent']}: {q['ttft_ms']:.1f} ms" for q in warm if q["ttft_ms"] is not None))
        for rep in range(p["prefill_repeats"]):
            for P in p["prefill_lengths"]:
                rec = (await send([plan(P, p["prefill_output_tokens"])]))[0]
                usage = rec.get("usage") or {}
                prefill.append({"P_sent": P, "P": int(usage.get("prompt_tokens") or P), "rep": rep,
                                "ttft_ms": None if rec.get("ttft_s") is None else rec["ttft_s"] * 1e3,
                                "server_prefill_ms": _server_prefill(rec, kind),
                                "error_class": rec.get("error_class")})
            log(f"fit: prefill rep {rep}: " + ", ".join(f"P={q['P']}: {q['ttft_ms']:.1f} ms"
                                                         for q in prefill[-len(p['prefill_lengths']):]
                                                         if q["ttft_ms"] is not None))
    if tok is None:   # prompts of N words: the context is what the server counted (median per prompt length)
        for pt in p["prompt_tokens"]:
            pts = [q for q in decode if q["prompt_tokens"] == pt]
            counts = [q["prompt_tokens_server"] for q in pts if q.get("prompt_tokens_server")]
            if counts:
                for q in pts:
                    q.update(context=float(np.median(counts)) + p["decode_tokens"] / 2.0,
                             context_source="usage.prompt_tokens")
    return {"decode": decode, "prefill": prefill, "prefill_warmup": warm}


def measure(endpoint, kind: str, *, batches: Sequence[int], decode_tokens: int = 64,
            prompt_tokens: Sequence[int] = (32, 320, 768),
            prefill_lengths: Sequence[int] = (16, 64, 128, 256, 384, 512, 768), repeats: int = 2,
            prefill_repeats: int = 3, prefill_output_tokens: int = 2, warmup: int = 2, seed: int = 7001,
            tokenizer=None, verbose: bool = False) -> dict:
    """The raw points: every (repeat, prompt length, B) decode batch and every (repeat, P) single
    prefill. ``endpoint``: a ``fairlib.client.EndpointConfig``; ``kind`` picks the server-side
    figures. Prompts are unique (``make_prompt`` with ``seed``), token ids when a tokenizer is given."""
    if isinstance(prompt_tokens, (int, np.integer)):
        prompt_tokens = (int(prompt_tokens),)
    p = {"batches": sorted({int(b) for b in batches}), "decode_tokens": int(decode_tokens),
         "prompt_tokens": [int(x) for x in prompt_tokens], "prefill_lengths": [int(x) for x in prefill_lengths],
         "repeats": int(repeats), "prefill_repeats": int(prefill_repeats),
         "prefill_output_tokens": int(prefill_output_tokens), "warmup": int(warmup), "seed": int(seed),
         "tokenizer": tokenizer, "log": print if verbose else (lambda *_: None)}
    raw = run_coroutine(_measure_async(endpoint, kind, p))
    raw["params"] = {k: v for k, v in p.items() if k not in ("tokenizer", "log")}
    return raw


# --- fitting -------------------------------------------------------------------------------------
def _medians(points: Sequence[dict], key: str, value: str) -> tuple:
    by: dict = {}
    for q in points:
        if q.get(value) is not None and (q.get("concurrent") is None or q.get("concurrent") == q.get("B")):
            by.setdefault(q[key], []).append(float(q[value]))
    xs = sorted(by)
    return (np.array(xs, float), np.array([np.median(by[x]) for x in xs]),
            {x: [min(by[x]), max(by[x])] for x in xs})


def piecewise_fit(x, y, min_points: int = 2) -> Optional[dict]:
    """Two separate lines, split at the breakpoint (between consecutive ``x``) with the least total
    squared error; ``None`` when there are too few points."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    best = None
    for k in range(min_points, x.size - min_points + 1):
        lo, hi = linear_fit(x[:k], y[:k]), linear_fit(x[k:], y[k:])
        if lo["slope"] is None or hi["slope"] is None:
            continue
        sse = float(np.sum(np.square(lo["residuals"])) + np.sum(np.square(hi["residuals"])))
        if best is None or sse < best["sse"]:
            best = {"break_after": float(x[k - 1]), "low": {k2: lo[k2] for k2 in ("intercept", "slope", "r2", "n")},
                    "high": {k2: hi[k2] for k2 in ("intercept", "slope", "r2", "n")}, "sse": sse}
    return best


def _lin(d: dict) -> dict:
    return {k: d[k] for k in ("intercept", "slope", "r2", "n")} | {"residuals_ms": d.get("residuals")}


def fit_decode_one(points: Sequence[dict], max_batch: int) -> dict:
    """``dt = a + s * B`` over the per-B medians of one context with ``B <= max_batch``, the
    small-batch check at ``B = 1`` and the two-piece check (module docstring)."""
    B, dt, spread = _medians(points, "B", "dt_ms")
    in_range = B <= max_batch
    lin_all = linear_fit(B[in_range], dt[in_range])
    ge2 = in_range & (B >= 2)
    lin_b2 = linear_fit(B[ge2], dt[ge2]) if ge2.sum() >= 2 else None
    small = None
    if lin_b2 is not None and lin_b2["slope"] is not None and 1.0 in set(B):
        d1 = float(dt[list(B).index(1.0)])
        pred1 = lin_b2["intercept"] + lin_b2["slope"]
        small = {"dt1_ms": d1, "line_at_1_ms": pred1, "off": (pred1 - d1) / d1,
                 "separate": bool(abs(pred1 - d1) / d1 > SMALL_BATCH_OFF)}
    use_b2 = bool(small and small["separate"])
    lin = lin_b2 if use_b2 else lin_all
    rng = ge2 if use_b2 else in_range
    pw = piecewise_fit(B[rng], dt[rng]) if rng.sum() >= 4 else None
    demanded = False
    if pw is not None and lin["r2"] is not None:
        sse = float(np.sum(np.square(lin["residuals"])))
        pw["sse_cut"] = 1.0 - pw["sse"] / sse if sse > 0 else 0.0
        demanded = lin["r2"] < PIECEWISE_R2_BELOW and pw["sse_cut"] > PIECEWISE_SSE_CUT
    return {"B": B.tolist(), "dt_ms_median": dt.tolist(), "dt_ms_range": {str(int(k)): v for k, v in spread.items()},
            "fit_range_B": [int(B[rng].min()), int(B[rng].max())] if rng.any() else None,
            "linear": _lin(lin), "linear_1_to_max": _lin(lin_all), "small_batch_regime": small,
            "piecewise": pw, "piecewise_demanded": bool(demanded)}


def fit_decode(points: Sequence[dict], max_batch: int) -> dict:
    """Per context (prompt length) :func:`fit_decode_one`, then the joint fit over every context
    ``dt = iter_base + (slope_0 + slope_ctx * ctx) * B`` (least squares over the per-(context, B)
    medians, ``B >= 2`` when the small-batch regime shows at most contexts), with its ``R^2`` and
    residuals, and the server's per-token figures beside the client's."""
    ctxs = sorted({float(q.get("context", q.get("prompt_tokens", 0))) for q in points})
    per = {}
    for c in ctxs:
        pts = [q for q in points if float(q.get("context", q.get("prompt_tokens", 0))) == c]
        per[c] = fit_decode_one(pts, max_batch)
    n_small = sum(bool((v["small_batch_regime"] or {}).get("separate")) for v in per.values())
    small = n_small * 2 > len(per)
    bmin = 2 if small else 1
    rows = []
    for c, v in per.items():
        for b, d in zip(v["B"], v["dt_ms_median"]):
            if bmin <= b <= max_batch:
                rows.append((c, b, d))
    X = np.array([[1.0, b, b * c] for c, b, _ in rows])
    y = np.array([d for _, _, d in rows])
    joint = None
    if len(rows) >= 3:
        cols = [0, 1, 2] if len(per) >= 2 else [0, 1]
        coef, *_ = np.linalg.lstsq(X[:, cols], y, rcond=None)
        full = np.zeros(3)
        full[cols] = coef
        pred = X @ full
        ss = float(((y - y.mean()) ** 2).sum())
        joint = {"iter_base_ms": float(full[0]), "slope_0_ms": float(full[1]), "slope_ctx_ms_per_token": float(full[2]),
                 "r2": 1.0 - float(((y - pred) ** 2).sum()) / ss if ss > 0 else 1.0, "n": len(rows),
                 "B_range": [bmin, int(max_batch)],
                 "points": [{"context": c, "B": b, "dt_ms": d, "fit_ms": float(f)} for (c, b, d), f in zip(rows, pred)],
                 "residuals_ms": [float(v) for v in y - pred]}
    out = {"contexts": ctxs, "per_context": {str(c): v for c, v in per.items()}, "joint": joint,
           "small_batch_regime": bool(small),
           "dt1_ms": {str(c): (v["small_batch_regime"] or {}).get("dt1_ms") for c, v in per.items()},
           "piecewise_demanded": any(v["piecewise_demanded"] for v in per.values())}
    if any(q.get("server_ms_per_token") is not None for q in points):
        srv = {}
        ratios = []
        for c in ctxs:
            pts = [q for q in points if float(q.get("context", q.get("prompt_tokens", 0))) == c]
            Bm, sm, _ = _medians(pts, "B", "server_ms_per_token")
            Bc, dc, _ = _medians(pts, "B", "dt_ms")
            srv[str(c)] = {"B": Bm.tolist(), "ms_per_token_median": sm.tolist()}
            for b, d in zip(Bc, dc):
                if b in set(Bm) and b <= max_batch:
                    ratios.append(d / sm[list(Bm).index(b)])
        out["server"] = {"per_context": srv, "client_over_server": [float(r) for r in ratios],
                         "client_over_server_median": float(np.median(ratios)) if ratios else None,
                         "source": next(q["server_source"] for q in points if q.get("server_source"))}
    if any(q.get("server_hist_itl_ms") is not None for q in points):
        Bh, hm, _ = _medians(points, "B", "server_hist_itl_ms")
        _, tpi, _ = _medians(points, "B", "server_hist_tokens_per_iteration")
        out["server_histograms"] = {"B": Bh.tolist(), "mean_itl_ms_median_over_contexts": hm.tolist(),
                                    "tokens_per_iteration_median": tpi.tolist()}
    return out


def fit_prefill(points: Sequence[dict]) -> dict:
    """``TTFT = c + prefill * P`` over the per-P medians (client TTFT), a quadratic beside it, and
    the server's own prefill time against ``P`` (llama.cpp ``prompt_ms``; vLLM server TTFT minus
    queue time)."""
    ok = [q for q in points if q.get("error_class") == "none"]
    P, ttft, spread = _medians(ok, "P", "ttft_ms")
    lin = linear_fit(P, ttft)
    out = {"P": P.tolist(), "ttft_ms_median": ttft.tolist(), "ttft_ms_range": {str(int(k)): v for k, v in spread.items()},
           "linear": _lin(lin)}
    if P.size >= 3:
        c2, c1, c0 = np.polyfit(P, ttft, 2)
        out["quadratic"] = {"c0": float(c0), "c1": float(c1), "c2": float(c2),
                            "slope_at_256": float(c1 + 2 * c2 * 256), "slope_at_768": float(c1 + 2 * c2 * 768)}
    srv = [q for q in ok if q.get("server_prefill_ms") is not None]
    if srv:
        Ps, sp, _ = _medians(srv, "P", "server_prefill_ms")
        sl = linear_fit(Ps, sp)
        out["server"] = {"P": Ps.tolist(), "prefill_ms_median": sp.tolist(), "linear": _lin(sl)}
        if sl["slope"] and lin["slope"]:
            out["server"]["client_slope_over_server_slope"] = lin["slope"] / sl["slope"]
    return out


# --- the engine model at a context ---------------------------------------------------------------
def engine_at(fit, context: Optional[float] = None) -> Engine:
    """The engine model at a decode context (tokens): ``iter_slope = slope_0 + slope_ctx * context``
    (default :data:`REFERENCE_CONTEXT`). ``fit``: a fit's dict, its path, or an engine kind."""
    d = fit if isinstance(fit, dict) else load_fit(fit)
    j = d["fit"]["decode"]["joint"]
    ctx = REFERENCE_CONTEXT if context is None else float(context)
    e = d["engine"]
    slope = max(j["slope_0_ms"] + j["slope_ctx_ms_per_token"] * ctx, 0.0)
    base = max(j["iter_base_ms"], 0.0)
    return Engine(base if base + slope > 0 else 1e-3, slope, e["prefill_ms_per_token"], e["max_batch"])


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


def fit_engine(eng, *, max_batch: Optional[int] = None, out=None, verbose: bool = False, note: str = "",
               **settings) -> dict:
    """Measure and fit a started engine (an ``fairlib.calibrate.lifecycle.EngineProcess``, or an
    :class:`EndpointEngine` for an endpoint started elsewhere: :func:`fit_endpoint`); returns the
    result and writes it to ``out`` (JSON) when given.

    ``max_batch``: the engine's batch limit (default: ``max_num_seqs`` for vLLM, ``n_parallel``
    for llama.cpp); batches above it are not sent. ``settings`` override :data:`DEFAULTS`."""
    kind = eng.kind
    p = dict(DEFAULTS.get(kind, DEFAULTS["fairlib"]))
    p.update(settings)
    slots = eng.settings.get("max_num_seqs") or eng.settings.get("n_parallel")
    if max_batch is None:
        max_batch = slots or max(p["batches"])
    max_batch = int(max_batch)
    if "batches" not in settings and max_batch > max(p["batches"]):
        p["batches"] = batches_for(max_batch)        # a larger engine: the sweep reaches its batch limit
    p["batches"] = [b for b in p["batches"] if b <= max_batch]
    tok = eng.tokenizer()
    limit = eng.settings.get("max_model_len") or eng.settings.get("ctx_per_slot")
    if limit:   # keep every request inside the context window (a word is more than a token on real models)
        words = 1.5 if tok is None and kind != "fairlib" else 1.0
        dt_out = int(p.get("decode_tokens", 64))
        for key, out_n in (("prompt_tokens", dt_out), ("prefill_lengths", int(p.get("prefill_output_tokens", 2)))):
            vals = [p[key]] if isinstance(p[key], (int, np.integer)) else list(p[key])
            keep = [x for x in vals if x * words + out_n + 8 <= limit]
            p[key] = keep or [max(1, int((limit - out_n - 8) / words / 2))]
    t0 = time.time()
    cfg = eng.endpoint_config(timeout_s=300.0, headers={"Connection": "close"})   # no stale keep-alive
    raw = measure(cfg, kind, tokenizer=tok, verbose=verbose, **p)
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
    j = dec["joint"]
    result["fit"]["ttft_overhead_ms"] = (None if pre["linear"]["intercept"] is None else
                                         float(pre["linear"]["intercept"] - float(engine_at(result, 16).iteration_ms(1))))
    result["fit"]["summary"] = {
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
    result.update({
        "capacity": {"max_batch": max_batch,
                     "output_tokens_per_s_at_reference": float(1e3 * max_batch / float(engine.iteration_ms(max_batch))),
                     "definition": "decode tokens/s at a full batch from the fitted dt(B) at the reference context"},
        "engine_info": _engine_info(eng),
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


# --- reading -------------------------------------------------------------------------------------
def load_fit(path_or_kind) -> dict:
    """A saved fit: a path, or an engine kind (``data/engines/<kind>.json``)."""
    p = Path(path_or_kind)
    if not p.exists() and str(path_or_kind) in ("vllm", "llamacpp", "fairlib"):
        p = data_path(str(path_or_kind))
    return json.loads(p.read_text(encoding="utf-8"))


def load_engine(path_or_kind) -> Engine:
    """The fitted :class:`fairlib.Engine` of a saved fit at the reference context
    (``fairlib.calibrate.probe.load_engine`` reads the same file); :func:`engine_at` for another context."""
    d = path_or_kind if isinstance(path_or_kind, dict) else load_fit(path_or_kind)
    return _probe_load_engine(d)


def summary_table(fits: dict):
    """One row per engine: the fitted parameters and the fit quality (a DataFrame)."""
    rows = []
    for name, d in fits.items():
        s = d["fit"]["summary"]
        rows.append({
            "engine": name, "version": d["engine_info"].get("version"),
            "iter_base (ms)": s["iter_base_ms"], "slope_0 (ms)": s["slope_0_ms"],
            "slope per 1k context tokens (ms)": s["slope_ctx_ms_per_1k_tokens"],
            "prefill (ms/token)": s["prefill_ms_per_token"], "max_batch": s["max_batch"],
            "decode fitted over B": "{}-{}".format(*s["decode_B_range"]),
            "decode R2": s["decode_r2"], "decode max |residual| (ms)": s["decode_max_abs_residual_ms"],
            "prefill R2": s["prefill_r2"], "prefill max |residual| (ms)": s["prefill_max_abs_residual_ms"],
            "B=1 a regime of its own": s["small_batch_regime"],
            "TTFT overhead (ms)": d["fit"]["ttft_overhead_ms"],
            "client/server per-token time": s["client_over_server_per_token"],
            "client/server prefill slope": s["client_over_server_prefill_slope"],
        })
    return pd.DataFrame(rows).set_index("engine")


def main(argv=None) -> int:
    """``python -m fairlib.calibrate.fit vllm|llamacpp [--out PATH]``: start the engine as the book does
    (:data:`ENGINE_FLAGS`), fit it, save the result (default ``data/engines/<kind>.json``)."""
    ap = argparse.ArgumentParser(prog="python -m fairlib.calibrate.fit", description=main.__doc__)
    ap.add_argument("kind", choices=["vllm", "llamacpp"])
    ap.add_argument("--out", default=None, help="default data/engines/<kind>.json")
    a = ap.parse_args(argv)
    with start(a.kind) as eng:
        res = fit_engine(eng, out=a.out or data_path(a.kind), verbose=True)
    print(json.dumps(res["fit"]["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
