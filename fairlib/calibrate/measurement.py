"""The measurement of ``fairlib fit``: timed decode batches at each context and single requests
for the prefill line, repeated and interleaved, with the server's own figures beside the client's
(llama.cpp's ``timings``, vLLM's per-request metrics and ``/metrics`` histograms)."""
from __future__ import annotations

import asyncio
import time
import urllib.request
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import numpy as np

from fairlib.calibrate.probe import decode_point, run_coroutine
from fairlib.client.prom import parse_prometheus
from fairlib.client.runner import RunClock, make_session, send_request
from fairlib.client.schedule import PlannedRequest, make_prompt
from fairlib.kinds import EngineKind
from fairlib.progress import progress_line

__all__ = ["FitSettings", "measure"]

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
    if kind == EngineKind.LLAMACPP:
        v = [s["predicted_per_token_ms"] for s in st if s.get("predicted_per_token_ms")]
        return {"server_ms_per_token": float(np.median(v)) if v else None, "server_source": "timings.predicted_per_token_ms"}
    if kind == EngineKind.VLLM:
        v = [(s.get("metrics") or {}).get("mean_itl_ms") for s in st]
        v = [x for x in v if x]
        return {"server_ms_per_token": float(np.median(v)) if v else None, "server_source": "metrics.mean_itl_ms"}
    return {"server_ms_per_token": None, "server_source": None}


def _server_prefill(rec: dict, kind: str) -> Optional[float]:
    s = rec.get("server_timings") or {}
    if kind == EngineKind.LLAMACPP:
        return s.get("prompt_ms")
    if kind == EngineKind.VLLM:
        m = s.get("metrics") or {}
        if m.get("time_to_first_token_ms") is not None:
            return float(m["time_to_first_token_ms"]) - float(m.get("queue_time_ms") or 0.0)
    return None


async def _measure_async(cfg, kind: str, p: dict) -> dict:
    clock = RunClock(time.time())
    counter = {"k": 0}
    tok = p["tokenizer"]
    metrics_url = cfg.resolved_metrics_url if kind == EngineKind.VLLM else None
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
                    told = [(r.get("usage") or {}).get("prompt_tokens") for r in recs]
                    counts = [float(c) for c in told if isinstance(c, (int, float))]
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
            server = [float(q["prompt_tokens_server"]) for q in pts if q.get("prompt_tokens_server")]
            if server:
                for q in pts:
                    q.update(context=float(np.median(server)) + p["decode_tokens"] / 2.0,
                             context_source="usage.prompt_tokens")
    return {"decode": decode, "prefill": prefill, "prefill_warmup": warm}


def _counts(owner: str, name: str, v, low: int = 1) -> tuple:
    vals = (v,) if isinstance(v, (int, np.integer)) else tuple(v)
    if not vals or any(isinstance(x, bool) or not float(x).is_integer() or x < low for x in vals):
        raise ValueError(f"{owner}.{name} must be integers >= {low} (one or more), got {v!r}")
    return tuple(int(x) for x in vals)


@dataclass(frozen=True)
class FitSettings:
    """One fit's sweep (``fairlib.calibrate.fit.DEFAULTS`` per engine kind: what the committed
    fits used), checked when it is made."""

    #: the decode batch sizes B (each sent as B simultaneous streams)
    batches: Sequence[int] = (1, 2, 4, 8, 12, 16)
    #: tokens each decode request generates (>= 8: the steady window needs them)
    decode_tokens: int = 64
    #: the decode sweep's prompt lengths, i.e. its contexts (the first is also the warm-up's)
    prompt_tokens: Sequence[int] = (32, 320, 768)
    #: the prompt lengths P of the single requests the prefill line is fitted to
    prefill_lengths: Sequence[int] = (16, 64, 128, 256, 384, 512, 768)
    #: times each (prompt length, B) batch is measured, interleaved; the fit takes medians
    repeats: int = 2
    #: times each prefill length is measured
    prefill_repeats: int = 3
    #: tokens each prefill request generates
    prefill_output_tokens: int = 2
    #: untimed batches before the sweep
    warmup: int = 2
    #: the prompts' seed (``make_prompt``: every prompt unique)
    seed: int = 7001

    def __post_init__(self):
        own = "FitSettings"
        object.__setattr__(self, "batches", tuple(sorted(set(_counts(own, "batches", self.batches)))))
        for name in ("prompt_tokens", "prefill_lengths"):
            object.__setattr__(self, name, _counts(own, name, getattr(self, name)))
        for name, low in (("decode_tokens", 8), ("repeats", 1), ("prefill_repeats", 1),
                          ("prefill_output_tokens", 1), ("warmup", 0), ("seed", 0)):
            (v,) = _counts(own, name, (getattr(self, name),), low)
            object.__setattr__(self, name, v)


def measure(endpoint, kind: str, settings: FitSettings, *, tokenizer=None, verbose: bool = False) -> dict:
    """The raw points: every (repeat, prompt length, B) decode batch and every (repeat, P) single
    prefill of ``settings``. ``endpoint``: a ``fairlib.client.EndpointConfig``; ``kind`` picks the
    server-side figures. Prompts are unique (``make_prompt`` with the settings' seed), token ids
    when a tokenizer is given."""
    p: dict = {**{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(settings).items()},
               "tokenizer": tokenizer, "log": progress_line if verbose else (lambda *_: None)}
    raw = run_coroutine(_measure_async(endpoint, kind, p))
    raw["params"] = {k: v for k, v in p.items() if k not in ("tokenizer", "log")}
    return raw
