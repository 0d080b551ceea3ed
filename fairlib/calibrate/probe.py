"""Probe a live OpenAI-compatible endpoint: fit the engine model's cost parameters and state its
sustainable single-tenant capacity, saved as JSON the simulator loads (``load_probed_engine``).

What it measures (one tenant, streaming, exact output lengths as the client forces them):

(a) **Iteration time vs running batch.** For each ``B`` in ``batches`` (ascending) it sends ``B``
    identical requests at once (``prompt_tokens`` prompt words, ``decode_tokens`` output tokens)
    and keeps the *steady window*: from the last stream's first token to the first stream's last
    token, where all ``B`` streams run together. Every inter-token gap inside it (a gap divided by
    the tokens its chunk carried) is one iteration at batch ``B``. ``dt(B)`` is the median over
    the streams of each stream's least-squares slope of token time against token index inside the
    window: single gaps jitter (on a busy 2-core machine by +-3 ms) but a late token does not
    delay the next one, so the slope over tens of tokens is exact to a few hundredths of a ms
    where the median gap is not. ``dt = iter_base_ms + iter_slope_ms * B`` is fitted by least squares over the ``B`` points
    (``R^2`` reported). When fewer than ``B`` streams overlap (the first finished before the last
    started) the engine's batch is full: ``max_batch`` = the number that did overlap, the sweep
    stops there and that point is left out of the fit.
(b) **Prefill cost.** On the idle endpoint, one request at a time, prompts of ``prefill_lengths``
    tokens (each ``prefill_repeats`` times, interleaved), ``prefill_output_tokens`` output tokens:
    ``TTFT = c + prefill_ms_per_token * P`` is fitted over the medians (``R^2`` reported). In the
    engine model ``c = dt(1)`` (one iteration at B = 1); the rest of ``c`` is the HTTP round trip,
    reported as ``ttft_overhead_ms``. The prompt length on the x-axis is the server's own count
    (``usage.prompt_tokens``) when it reports one.
(c) **Capacity** (kept simple): the saturated decode throughput, ``1000 * B / dt(B)`` output
    tokens/s at ``B = max_batch`` from the fit (and the measured value at the largest ``B`` whose
    streams all overlapped), plus the request rate the fitted engine sustains for a reference
    request (``reference_prompt_tokens``, ``reference_output_tokens``) when it runs at
    ``max_batch``: ``1000 / Engine.request_cost_ms(P, N, max_batch)`` requests/s. Scenarios at
    ``rho`` use the fitted engine itself (``fairlib run --rho R --capacity-file probe.json``).

Noise: on a loaded 2-core machine single gaps jitter by a millisecond or more; medians over
hundreds of gaps and repeated TTFTs keep the fit within a few percent of ``fairlib serve``'s true
parameters (tests/test_probe.py). Against a real engine the fit is only as good as the linear
model (``R^2`` says how good).

    from fairlib.client import EndpointConfig
    from fairlib.calibrate.probe import probe, load_probed_engine
    result = probe(EndpointConfig(base_url="http://127.0.0.1:8000/v1", model="m"), out="probe.json")
    engine = load_probed_engine("probe.json")
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from fairlib.client.endpoint import EndpointConfig, mask_url
from fairlib.client.env import fetch_json
from fairlib.client.runner import RunClock, make_session, send_request
from fairlib.client.schedule import PlannedRequest, make_prompt
from fairlib.sim.engine import Engine
from fairlib.progress import progress_line

__all__ = ["probe", "load_probed_engine", "load_probe", "linear_fit", "decode_point", "PROBE_VERSION"]

PROBE_VERSION = 1


def linear_fit(x, y) -> dict:
    """Least squares ``y = intercept + slope * x`` with ``R^2`` (``None`` fields when < 2 points)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.size < 2 or np.ptp(x) == 0:
        return {"intercept": None, "slope": None, "r2": None, "n": int(x.size)}
    slope, intercept = np.polyfit(x, y, 1)
    pred = intercept + slope * x
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return {"intercept": float(intercept), "slope": float(slope), "r2": float(r2), "n": int(x.size),
            "residuals": [float(v) for v in (y - pred)]}


def decode_point(records: Sequence[dict], B: int) -> dict:
    """The steady-window statistics of one batch of ``B`` simultaneous streams (records as the
    client writes them)."""
    ok = [r for r in records if r.get("error_class") == "none" and len(r.get("chunk_times_s") or []) >= 2]
    errors = sorted({str(r.get("error_class")) for r in records if r.get("error_class") != "none"})
    point: dict = {"B": int(B), "n_ok": len(ok), "errors": errors}
    if len(ok) < B:
        point.update(concurrent=len(ok), n_gaps=0, dt_ms=None)
        return point
    firsts = [r["chunk_times_s"][0] for r in ok]
    lasts = [r["chunk_times_s"][-1] for r in ok]
    start, end = max(firsts), min(lasts)
    concurrent = sum(1 for f in firsts if f <= end)
    gaps, slopes = [], []
    for r in ok:
        t = np.asarray(r["chunk_times_s"], float)
        k = np.asarray(r.get("chunk_tokens") or [1] * t.size, float)
        x = np.cumsum(np.maximum(k, 1))          # token index of each chunk's last token
        inside = (t >= start) & (t <= end)
        for i in range(1, t.size):
            if inside[i - 1] and inside[i]:
                gaps.append((t[i] - t[i - 1]) * 1e3 / (x[i] - x[i - 1]))
        if inside.sum() >= 3:
            slopes.append(float(np.polyfit(x[inside], t[inside], 1)[0]) * 1e3)
    g = np.asarray(gaps, float)
    point.update(concurrent=int(concurrent), window_ms=(end - start) * 1e3, n_gaps=int(g.size),
                 dt_ms=float(np.median(slopes)) if slopes else None,
                 dt_median_gap_ms=float(np.median(g)) if g.size else None,
                 dt_mean_gap_ms=float(g.mean()) if g.size else None,
                 dt_p10_gap_ms=float(np.percentile(g, 10)) if g.size else None,
                 dt_p90_gap_ms=float(np.percentile(g, 90)) if g.size else None)
    point["tokens_per_s"] = float(B * 1e3 / point["dt_ms"]) if point["dt_ms"] else None
    return point


# --- sending ----------------------------------------------------------------------------------

class _Sender:
    """Plans unique requests and sends them over one session (one event loop)."""

    def __init__(self, cfg, seed: int, tokenizer=None):
        self.cfg, self.seed, self.tokenizer = cfg, seed, tokenizer
        self.api = cfg.api or "completions"
        self.clock = RunClock(time.time())
        self.session = make_session(cfg)
        self.k = 0

    def plan(self, prompt_tokens: int, output_tokens: int):
        as_ids = self.tokenizer is not None and self.api == "completions"
        prompt, n = make_prompt(self.seed, 0, self.k, prompt_tokens, self.tokenizer, as_ids)
        req = PlannedRequest(self.k, 0, "probe", 0.0, prompt, n, output_tokens, 0, self.api)
        self.k += 1
        return req

    async def send(self, reqs) -> list:
        return list(await asyncio.gather(*(send_request(self.session, r, self.cfg, self.clock) for r in reqs)))

    async def close(self):
        await self.session.close()


def _endpoint_info(cfg) -> dict:
    root = cfg.server_root
    info = {"base_url": mask_url(cfg.base_url), "model": cfg.model, "api": cfg.api or "completions",
            "models": fetch_json(cfg.plain_base_url.rstrip("/") + "/models"), "version": fetch_json(root + "/version")}
    stats = fetch_json(root + "/fairlib/stats")
    if isinstance(stats.get("body"), dict):  # a fairlib serve instance: keep what it says it is
        info["fairlib_serve"] = {"config": stats["body"].get("config"),
                                 "note": "a test double (the engine model in real time), not an engine"}
    return info


async def _probe_async(cfg, p) -> dict:
    s = _Sender(cfg, p["seed"], p["tokenizer"])
    log = p["log"]
    try:
        for _ in range(p["warmup"]):
            await s.send([s.plan(p["prompt_tokens"], 4)])
        # (a) decode sweep
        points, max_batch, saturated = [], p["max_batch"], False
        for B in p["batches"]:
            if p["max_batch"] is not None and B > p["max_batch"]:
                break
            t = time.perf_counter()
            recs = await s.send([s.plan(p["prompt_tokens"], p["decode_tokens"]) for _ in range(B)])
            pt = decode_point(recs, B)
            pt["wall_s"] = time.perf_counter() - t
            points.append(pt)
            log(f"probe: B={B:4d} dt={pt['dt_ms'] if pt['dt_ms'] is None else round(pt['dt_ms'], 3)} ms "
                f"gaps={pt['n_gaps']} concurrent={pt['concurrent']} ({pt['wall_s']:.1f} s)")
            if pt["n_ok"] < B:
                pt["note"] = "requests failed: sweep stopped"
                break
            if pt["concurrent"] < B:
                saturated, max_batch = True, pt["concurrent"]
                pt["note"] = f"only {pt['concurrent']} of {B} streams overlapped: the batch is full"
                break
        fit_pts = [q for q in points if q["dt_ms"] is not None and q["concurrent"] == q["B"] and q["n_gaps"] >= 3]
        decode_fit = linear_fit([q["B"] for q in fit_pts], [q["dt_ms"] for q in fit_pts])
        if max_batch is None:
            max_batch = max((q["B"] for q in fit_pts), default=1)
        # (b) prefill sweep, one request at a time
        raw = []
        for rep in range(p["prefill_repeats"]):
            for P in p["prefill_lengths"]:
                rec = (await s.send([s.plan(P, p["prefill_output_tokens"])]))[0]
                usage = rec.get("usage") or {}
                raw.append({"P_sent": P, "P": int(usage.get("prompt_tokens") or P), "rep": rep,
                            "ttft_ms": None if rec.get("ttft_s") is None else rec["ttft_s"] * 1e3,
                            "error_class": rec.get("error_class")})
        by_p: dict = {}
        for r in raw:
            if r["ttft_ms"] is not None and r["error_class"] == "none":
                by_p.setdefault(r["P"], []).append(r["ttft_ms"])
        prefill_pts = [{"P": P, "ttft_ms": float(np.median(v)), "n": len(v), "ttft_all_ms": v}
                       for P, v in sorted(by_p.items())]
        prefill_fit = linear_fit([q["P"] for q in prefill_pts], [q["ttft_ms"] for q in prefill_pts])
        log("probe: prefill " + ", ".join(f"P={q['P']}: {q['ttft_ms']:.2f} ms" for q in prefill_pts))
    finally:
        await s.close()
    return {"points": points, "fit_points_B": [q["B"] for q in fit_pts], "decode_fit": decode_fit,
            "max_batch": int(max_batch), "saturated": saturated, "prefill_raw": raw, "prefill_points": prefill_pts,
            "prefill_fit": prefill_fit}


def _max_model_len(info) -> Optional[int]:
    body: dict = (info.get("models") or {}).get("body") or {}
    try:
        for m in body["data"]:
            if m.get("id") == info["model"] and isinstance(m.get("max_model_len"), int):
                return m["max_model_len"]
    except (TypeError, KeyError, AttributeError):
        pass
    return None


def run_coroutine(coro):
    """Run ``coro`` to completion from synchronous code, also inside a running event loop (a
    notebook kernel: then in a thread with its own loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box = {}
    th = threading.Thread(target=lambda: box.setdefault("r", asyncio.run(coro)), name="fairlib-probe")
    th.start()
    th.join()
    return box["r"]


def probe(endpoint, *, batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64), decode_tokens: int = 48,
          prompt_tokens: int = 16, prefill_lengths: Sequence[int] = (16, 256, 512, 1024, 1536, 2048),
          prefill_repeats: int = 5, prefill_output_tokens: int = 2, max_batch: Optional[int] = None,
          warmup: int = 2, seed: int = 0, tokenizer=None, reference_prompt_tokens: Optional[int] = None,
          reference_output_tokens: Optional[int] = None, out=None, verbose: bool = False) -> dict:
    """Probe ``endpoint`` (a ``fairlib.client.EndpointConfig``); returns the result and writes it
    to ``out`` (JSON) when given. ``max_batch``: the engine's known batch limit (the sweep stops
    there); otherwise it is found where the streams stop overlapping (or is the largest ``B``
    tried, flagged ``max_batch_is_lower_bound``)."""

    if not isinstance(endpoint, EndpointConfig):
        raise TypeError("endpoint must be a fairlib.client.EndpointConfig")
    endpoint = replace(endpoint, api=endpoint.api or "completions")
    batches = sorted({int(b) for b in batches})
    if not batches or batches[0] < 1 or decode_tokens < 8:
        raise ValueError("batches must be integers >= 1 and decode_tokens >= 8")
    params: dict = {"batches": batches, "decode_tokens": int(decode_tokens), "prompt_tokens": int(prompt_tokens),
              "prefill_lengths": [int(x) for x in prefill_lengths], "prefill_repeats": int(prefill_repeats),
              "prefill_output_tokens": int(prefill_output_tokens), "max_batch": max_batch, "warmup": int(warmup),
              "seed": int(seed)}
    info = _endpoint_info(endpoint)
    limit = _max_model_len(info)
    if limit is not None:  # keep every prompt inside the endpoint's context window
        keep = [x for x in params["prefill_lengths"] if x + prefill_output_tokens + 8 <= limit]
        params["prefill_lengths"] = keep or [max(1, limit // 4)]
    t0 = time.time()
    res = run_coroutine(_probe_async(endpoint, {**params, "tokenizer": tokenizer,
                                       "log": progress_line if verbose else (lambda *_: None)}))
    df, pf = res["decode_fit"], res["prefill_fit"]
    if df["slope"] is None:
        seen = "; ".join(f"B={q['B']}: {q['n_ok']}/{q['B']} ok" + (f" ({', '.join(q['errors'])})" if q["errors"] else "")
                         for q in res["points"]) or "no batch sent"
        raise RuntimeError(f"probe of {mask_url(endpoint.base_url)} (model {endpoint.model!r}) failed: dt(B) needs "
                           f"two batch sizes with timings, got {len(res['fit_points_B'])} ({seen}); is the endpoint "
                           f"serving that model, and are --batches at least two sizes?")
    base, slope = max(df["intercept"], 0.0), max(df["slope"], 0.0)
    prefill = max(pf["slope"], 0.0) if pf["slope"] is not None else 0.0
    mb = res["max_batch"]
    engine = Engine(base, slope, prefill, mb) if base + slope > 0 else Engine(1e-3, slope, prefill, mb)
    ref_p = int(reference_prompt_tokens or prompt_tokens)
    ref_n = int(reference_output_tokens or decode_tokens)
    largest = max((q for q in res["points"] if q["B"] in res["fit_points_B"]), key=lambda q: q["B"], default=None)
    capacity = {
        "definition": "saturated decode throughput at max_batch from the fitted dt(B); requests/s for the "
                      "reference request at max_batch: 1000 / Engine.request_cost_ms(P, N, max_batch)",
        "max_batch": mb,
        "max_batch_is_lower_bound": not res["saturated"] and max_batch is None,
        "output_tokens_per_s": float(1e3 * mb / float(engine.iteration_ms(mb))),
        "measured_output_tokens_per_s": None if largest is None else largest["tokens_per_s"],
        "measured_at_B": None if largest is None else largest["B"],
        "reference_prompt_tokens": ref_p, "reference_output_tokens": ref_n,
        "requests_per_s": float(1e3 / float(engine.request_cost_ms(ref_p, ref_n, mb))),
    }
    result = {
        "probe_version": PROBE_VERSION,
        "engine": engine.to_dict(),
        "fit": {
            "decode": {k: df[k] for k in ("intercept", "slope", "r2", "n")} | {"residuals_ms": df.get("residuals")},
            "prefill": {k: pf[k] for k in ("intercept", "slope", "r2", "n")} | {"residuals_ms": pf.get("residuals")},
            "ttft_overhead_ms": None if pf["intercept"] is None else float(pf["intercept"] - (base + slope)),
        },
        "capacity": capacity,
        "points": {"decode": res["points"], "prefill": res["prefill_points"], "prefill_raw": res["prefill_raw"]},
        "params": params,
        "endpoint": info,
        "started_wall": t0, "duration_s": time.time() - t0,
    }
    if out is not None:
        p = Path(out)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(result, indent=2, default=json_default) + "\n", encoding="utf-8")
    return result


def json_default(o):
    """``json.dumps(..., default=json_default)``: numpy scalars and arrays as plain numbers and
    lists, anything else as its text."""
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def load_probe(path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def load_probed_engine(path) -> Engine:
    """The fitted ``Engine`` of a probe result (``path``: its JSON file, or the dict itself): its
    ``engine`` table (a saved fit has one too: ``fairlib.calibrate.fit.load_fitted_engine``)."""
    d = path if isinstance(path, dict) else load_probe(path)
    e = d.get("engine", d)
    fields = {k: e[k] for k in ("iter_base_ms", "iter_slope_ms", "prefill_ms_per_token", "max_batch",
                                "max_prefill_tokens", "kv_capacity_tokens") if k in e and e[k] is not None}
    if not {"iter_base_ms", "iter_slope_ms", "prefill_ms_per_token", "max_batch"} <= set(fields):
        raise ValueError(f"{path}: not a probe result (no complete 'engine' table)")
    return Engine(**fields)


def load_engine(path) -> Engine:
    """Deprecated name of :func:`load_probed_engine` (kept for code written against the old name)."""
    warnings.warn("fairlib.calibrate.probe.load_engine is deprecated: use load_probed_engine",
                  DeprecationWarning, stacklevel=2)
    return load_probed_engine(path)
