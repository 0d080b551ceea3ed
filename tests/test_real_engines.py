"""The book's claims on real engines: vLLM's CPU build and llama.cpp's llama-server (issue 5).

Skipped, with the reason, when an engine is not set up (``make engines``); under ``CI=true`` that
fails instead (tests/ci.py). Each engine is started once per session, as the book starts it
(``fairlib.calibrate.fit.start``: ``fairlib.calibrate.fit.ENGINE_FLAGS``; tests/conftest.py's
``engines`` fixture, shared with tests/test_engines_smoke.py), and used by every test of its
class, then stopped at the end of the session:

1. **cost-model fit** (``fairlib.calibrate.fit``, a quick sweep): the iteration time rises with the batch
   (slope > 0 over B 1..8 at every context), the joint fit ``dt = iter_base + (slope_0 + slope_ctx *
   ctx) * B`` explains at least :data:`DECODE_R2_MIN` of the variance and the prefill line
   :data:`PREFILL_R2_MIN`, and the client's numbers agree with the engine's own (llama.cpp
   ``timings``, vLLM per-request metrics) within 30%;
2. **wire formats**, from raw streams: the final chunk with or without usage, the role-only chat
   chunk, ``[DONE]``, llama.cpp's ``timings``; and the client's reading of them;
3. **chapter 8 re-measured** through papermill with ``backend="http"`` against the engine (the
   tenantbench scenarios at capacity-relative load from the fresh fit), its fresh runs checked for
   validity and wire facts (every token counted, coalesced chunks included) and against
   :data:`LIVE_BOUNDS` over the valid runs (bounds set from the noise measured on this machine),
   never against the committed text;
4. on vLLM, **priority** (``--scheduling-policy priority``, lower first) and **chapter 1** (in 5)
   re-measured (FCFS, the blog post's tenants at 3x overload: the measured residency split within
   ``fairlib.chapters.fidelity.SEED000_SHARE_PTS`` points of the simulated one);
5. on vLLM, **chapters 1-4 through the fairness gateway** (``fairlib gateway`` in front of the
   engine, each chapter's schedulers: FCFS, the equal quota, VTC, charge dt/B, the slot cap),
   papermill with ``backend="http"``: every gateway run valid, no slot left held, and the measured
   shares within :data:`GATEWAY_BOUNDS` of the simulated ones (bounds from the noise of the
   saved runs and of these tests' short windows);
6. on vLLM, **chapter 5 live** (DriftSched's protocol, scaled, through a gateway with the
   estimator in it): FIFO and SJF, every answer counted and fed back to the gateway's estimator
   (its factors equal the estimator replayed on the answers in the order they came back), and SJF
   serving the short answers first (short_qa's median E2E lower than under FIFO).

Timings on this 2-core machine are noisy (client, server and engine share the cores; the engines
run 10 nice steps below the client, ``fairlib.calibrate.lifecycle.DEFAULT_NICE``): bounds are wide, shapes and
medians over tenants, not exact times, are asserted, and every run appends its statistics to
``.cache/engines/live_stats.jsonl`` (the noise record behind the bounds). Papermill runs write ``.cache/engines/`` logs.
"""
import json
import os
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fairlib.chapters import fidelity as fd
from fairlib.chapters import gateway_live as gl
from fairlib.calibrate import fit
from fairlib.protocol.sse import DONE, SSEParser, decode_payload
from fairlib.records import load_run

pytestmark = [pytest.mark.engine]

ROOT = Path(__file__).resolve().parents[1]
CH8 = ROOT / "notebooks" / "08_simulator_fidelity.ipynb"
CH1 = ROOT / "notebooks" / "01_residency_accounting.ipynb"
CH2 = ROOT / "notebooks" / "02_quota_inversion.ipynb"
CH3 = ROOT / "notebooks" / "03_vtc_weight_derivation.ipynb"
CH4 = ROOT / "notebooks" / "04_slot_cap_failure.ipynb"
CH5 = ROOT / "notebooks" / "05_drift_calibration.ipynb"
CH6 = ROOT / "notebooks" / "06_token_pools.ipynb"
#: Chapter 6 live in the test: every duration and replica instant x0.3 (a 12 s flood, a 27 s
#: capacity loss with replica 1 out from 7.5 to 16.5 s), three of the five variants, one seed
CH6_SCALE = 0.3
CH6_VARIANTS = {"flood": ["fcfs", "pool_estimate"], "loss": ["pool"]}
#: Chapter 5 live in the test: this fraction of the protocol's requests (30 + 60), one seed
CH5_SCALE = 0.03
#: A quick fit: two contexts, five batch sizes, the median of three repeats (the committed fits
#: use DEFAULTS). One repeat (11 s on vLLM) gave a decode R2 of 0.67 once, on a machine loaded to
#: twice its cores: one timed batch 7 ms off. Three (about 30 s) take the median; the prefill too
#: (two repeats gave a prefill R2 of 0.91 once: the engine runs under SCHED_IDLE, so any other
#: work on the machine stretches a 10-50 ms prefill it is timing). The fit sends one untimed
#: request per prefill length first: vLLM-CPU's first prompt of a new length was the slow repeat
#: (R2 0.78 once, in a fresh clone, when a second repeat was disturbed as well).
QUICK_FIT = dict(batches=(1, 2, 4, 8, 16), prompt_tokens=(32, 512), decode_tokens=48, repeats=3,
                 prefill_lengths=(16, 128, 256, 512), prefill_repeats=3)
DECODE_R2_MIN = 0.8
PREFILL_R2_MIN = 0.95
LIVE_DURATION_S = 20.0
TIMINGS = {}


def _timed(name):
    class T:
        def __enter__(self):
            self.t = time.monotonic()

        def __exit__(self, *a):
            TIMINGS[name] = round(time.monotonic() - self.t, 1)
            out = ROOT / ".cache" / "engines"
            out.mkdir(parents=True, exist_ok=True)
            (out / "test_real_engines_timings.json").write_text(json.dumps(TIMINGS, indent=1) + "\n")
    return T()


def _papermill(nb: Path, out: Path, params: list, timeout: int):
    env = dict(os.environ)
    env.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".cache" / "numba"))
    cmd = [sys.executable, "-m", "papermill", str(nb), str(out), "--cwd", str(ROOT / "notebooks"),
           "--no-progress-bar", *params]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return out


def _outputs(nb_path: Path) -> str:
    import nbformat
    nb = nbformat.read(nb_path, as_version=4)
    texts = []
    for c in nb.cells:
        for o in c.get("outputs", []):
            assert o.get("output_type") != "error", o
            if o.get("output_type") == "stream":
                texts.append(o.get("text", ""))
    return "\n".join(texts)


# --- raw streams --------------------------------------------------------------------------------
def _raw_stream(base_url: str, body: dict) -> list:
    """POST a streaming request and return its SSE payloads (dicts, and DONE), without timing."""
    api = "chat/completions" if "messages" in body else "completions"
    req = urllib.request.Request(f"{base_url.rstrip('/')}/{api}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=60) as r:
        raw = r.read()
    p = SSEParser()
    events = p.feed(raw) + p.flush()
    return [decode_payload(e) for e in events]


def _check_wire(kind: str, eng):
    """Both APIs, raw: the chunk structure each engine sends (what the client must handle)."""
    tok = eng.tokenizer()
    ids = tok.encode("the quick brown fox jumps over the lazy dog " * 3)[:24]
    n = 6
    base = {"model": eng.model, "max_tokens": n, "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": True, **eng.settings.get("extra_body", {})}
    comp = _raw_stream(eng.base_url, {**base, "prompt": ids})
    chat = _raw_stream(eng.base_url, {**{k: v for k, v in base.items() if k != "return_token_ids"},
                                      "messages": [{"role": "user", "content": "tell me about the river"}],
                                      "max_completion_tokens": n})
    facts = {}
    for api, frames in (("completions", comp), ("chat", chat)):
        assert frames[-1] is DONE, f"{kind} {api}: the stream must end with [DONE]"
        chunks = [f for f in frames if f is not DONE]
        with_usage = [c for c in chunks if c.get("usage")]
        assert with_usage and with_usage[-1]["usage"]["completion_tokens"] == n, (kind, api, chunks[-2:])
        if api == "completions":
            assert with_usage[-1]["usage"]["prompt_tokens"] == len(ids)
        last = with_usage[-1]
        usage_alone = last.get("choices") == []
        finish = [c for c in chunks if c.get("choices") and c["choices"][0].get("finish_reason")]
        assert finish and finish[-1]["choices"][0]["finish_reason"] == "length"

        def text(c, api=api):
            ch = c["choices"][0]
            return ch.get("text") if api == "completions" else (ch.get("delta") or {}).get("content")
        def ids(c):
            return c["choices"][0].get("token_ids") or []
        # A chunk carries text or token ids. The tiny model's random tokens include byte pieces
        # whose text is empty until the character completes, so their text comes in a later
        # chunk (4 text chunks for 6 tokens in one run of ten): count tokens, not text chunks.
        token_chunks = [c for c in chunks if c.get("choices") and (text(c) or ids(c))]
        assert 1 <= len(token_chunks) <= n, (kind, api, len(token_chunks))
        if any(ids(c) for c in token_chunks):
            assert sum(len(ids(c)) for c in token_chunks) == n, (kind, api, token_chunks)
        f = {"usage_chunk_has_no_choices": usage_alone,
             "final_token_chunk_carries_finish_reason": bool(text(finish[-1])),
             "timings": sorted(last.get("timings", {}))}
        if api == "chat":
            first = chunks[0]["choices"][0]["delta"]
            f["role_only_first_chunk"] = first.get("role") == "assistant" and not first.get("content")
            assert f["role_only_first_chunk"], (kind, chunks[0])
        facts[api] = f
    if kind == "vllm":
        # vLLM: the last token chunk carries finish_reason; usage comes alone (choices: []), then [DONE]
        assert facts["completions"]["usage_chunk_has_no_choices"] and facts["chat"]["usage_chunk_has_no_choices"]
        assert facts["completions"]["final_token_chunk_carries_finish_reason"]
        assert any(c.get("choices") and c["choices"][0].get("token_ids") for c in comp if c is not DONE)
    else:
        # llama.cpp completions: a final chunk with empty text, finish_reason, usage and timings
        assert not facts["completions"]["usage_chunk_has_no_choices"]
        assert not facts["completions"]["final_token_chunk_carries_finish_reason"]
        assert {"predicted_n", "predicted_ms", "prompt_n", "prompt_ms"} <= set(facts["completions"]["timings"])
    # the client reads both APIs to the same record shape
    from fairlib.client import build_schedule, load_records, run
    wl = pd.DataFrame({"arrival_ms": [0.0, 50.0], "tenant": [0, 1], "prompt_tokens": [24, 24], "output_tokens": [n, n],
                       "api": ["completions", "chat"]})
    import tempfile
    d = tempfile.mkdtemp(prefix=f"wire-{kind}-")
    sched = build_schedule(wl, seed=991, tokenizer=tok, token_id_prompts=None)
    run(sched, eng.endpoint_config(), d, scrape_metrics=False, collect_env=False)
    rec = load_records(d)
    assert (rec.error_class == "none").all(), rec[["api", "error_class", "error_message"]]
    assert (rec.completion_tokens == n).all() and (rec.n_token_chunks <= n).all()
    assert rec.chunk_tokens.map(sum).eq(n).all(), rec.chunk_tokens.tolist()
    assert (rec.ttft_s > 0).all() and (rec.done).all()
    return facts


# --- the fresh runs of chapter 8 ----------------------------------------------------------------
def _check_runs(kind: str, runs_dir: Path):
    runs = [load_run(p) for p in sorted((runs_dir / kind).glob("*/seed*"))]
    assert {r.name for r in runs} == set(fd.SCENARIOS), [r.name for r in runs]
    lines = []
    for r in runs:
        s, rec = r.summary, r.records
        # validity is reported; the median send lag holds on any run (a p99 miss is a flagged stall)
        assert {"valid", "valid_reason", "schedule_lag_ms", "achieved_rate_rps"} <= set(s)
        assert s["schedule_lag_ms"]["p50"] < 10.0, (r.name, s["schedule_lag_ms"])
        assert s["n_ok"] == s["n_planned"] == len(rec), (r.name, s["error_counts"])
        # every token counted (from usage, not from chunks; coalesced chunks carry several)
        assert (rec.completion_tokens == rec.max_tokens).all()
        assert (rec.chunk_tokens.map(sum) == rec.completion_tokens).all()
        assert (rec.usage.map(lambda u: u["prompt_tokens"]) == rec.prompt_tokens).all(), "token-id prompts are exact"
        assert rec.done.all() and (rec.finish_reason == "length").all()
        if kind == "llamacpp":
            assert (rec.server_timings.map(lambda t: t.get("predicted_n")) == rec.completion_tokens).all()
        else:
            sm = s["server_metrics"]    # /metrics sampled all along (in a child process)
            assert sm["samples"] >= r.duration_s * 0.5 and sm["errors"] == 0, (r.name, sm)
            qt = rec.server_timings.map(lambda t: ((t or {}).get("metrics") or {}).get("queue_time_ms"))
            assert qt.notna().all()
        coalesced = int(rec.chunk_tokens.map(lambda c: sum(1 for x in c if x > 1)).sum())
        lines.append(f"{r.name}: {s['valid_reason']}; {coalesced} coalesced chunks")
        if not s["valid"]:
            warnings.warn(f"{kind} {r.name}: run invalid ({s['valid_reason']})")
    return runs, lines


#: What a fresh live run must show, over the rows (scenario x tenant) of its VALID runs, and why
#: each bound is where it is. The noise was measured on this 2-core machine: three seeds of every
#: scenario on each engine (30-s windows, engines fitted on the machine) and six runs of these
#: tests (20-s windows, .cache/engines/live_stats.jsonl); the bounds sit at 1.5-2x the worst seen.
#: - shares (the book's claim): median |error| <= 4 points (seen <= 2.5), and 90% of the tenant
#:   rows within 10 points (seen <= 6.6 on llama.cpp; the single worst row of a short window
#:   moved 1-10 points between runs, so the max is reported, not asserted);
#: - throughput: median |error| <= 25% (seen <= 9.1% here, 17.8% on the CI machine: the engine
#:   fitted idle runs slower beside the client on two shared cores, and how much is the machine's);
#: - E2E p50: median |error| <= 100% (seen 5-44% here, 58% on the CI machine, same cause; the fit
#:   was made minutes earlier); a cost model off by 2x still fails it (queueing amplifies it);
#: - TTFT p50: reported only. On an engine that is idle between requests TTFT is a few ms, and
#:   its relative error moved from 7% to 140% between runs of the same schedule.
LIVE_BOUNDS = {"share_pts_median": 4.0, "share_pts_p90": 10.0, "throughput_pct_median": 25.0,
               "e2e_p50_pct_median": 100.0}
#: At least this many of the five runs must be valid (schedule lag p99 <= 10 ms, every request
#: sent and recorded), with the engine's /metrics sampled all along. Before issue 10 the client
#: stalled 40-500 ms once or twice per vLLM run (aiohttp, and /metrics parsed on the send loop, so
#: live runs did not sample): 12 of 21 recorded vLLM runs valid, 1 of 5 in two of five test runs.
#: With the send loop's own HTTP client and the sampler in a child process: 5 of 5 on both
#: engines, sampling on. Fewer valid runs fail the test: latencies the client distorted are not
#: the engine's.
MIN_VALID_RUNS = 3
#: Chapters 1-4 through the gateway: one seed of each chapter's schedulers (8 runs), 15-s windows.
#: The noise the bounds come from: the saved runs (5 policies x 3 seeds, 30 s) put the measured
#: share 0.34 points (median sd over seeds) from run to run, 2.65 at most in one run. In 15-s
#: windows FCFS (and a quota that does not bind in so short a window) depends on which long
#: answers enter first: two runs of this test gave |measured - simulated| 0.41 and 1.84 points at
#: the median, 1.08 and 6.04 at most (FCFS, summarise, in the second, a fresh fit and schedule).
#: The bounds sit at 1.5x the worst seen; a gateway that admits out of the policy's order still
#: fails them (FCFS's shares against VTC's: 12 points for classify).
GATEWAY_DURATION_S = 15.0
GATEWAY_BOUNDS = {"share_pts_median": 3.0, "share_pts_max": 9.0}
#: Runs whose client fell behind its schedule (p99 lag > 10 ms) are reported and left out; at
#: least this many of the 8 must be valid (the first run of this test: 7 of 8, one at 22 ms).
MIN_VALID_GATEWAY_RUNS = 6
#: A live chapter whose runs the client's own schedule lag made invalid (p99 lag over its bound and
#: nothing else wrong: the machine was busy, the engine is not measured by such a run) is run
#: again, at most this many more times, before its runs are checked; the bounds stay as they are.
#: CI saw every vLLM run of a busy machine INVALID this way (p99 lag 13-101 ms, issue 23).
LAG_RETRIES = 2


def lag_only(summary: dict) -> bool:
    """An invalid run whose every reason is the client falling behind its schedule."""
    parts = str(summary.get("valid_reason", "")).split("; ")
    return not summary["valid"] and all(p.endswith("the client fell behind") for p in parts)


def measure_with_retries(measure, enough, what: str):
    """``measure()`` (returns the runs it made), again while ``enough(runs)`` is false and every
    invalid run is :func:`lag_only`, at most :data:`LAG_RETRIES` more times; the last runs."""
    for attempt in range(1 + LAG_RETRIES):
        runs = measure()
        bad = [r for r in runs if not r.summary["valid"]]
        if enough(runs) or not bad or not all(lag_only(r.summary) for r in bad):
            return runs
        reasons = [r.summary["valid_reason"] for r in bad]
        with open(ROOT / ".cache" / "engines" / "live_stats.jsonl", "a") as f:
            f.write(json.dumps({"kind": "lag-retry", "what": what, "attempt": attempt, "t": time.time(),
                                "reasons": reasons}) + "\n")
        if attempt < LAG_RETRIES:
            warnings.warn(f"{what}: {len(bad)} of {len(runs)} runs invalid by the client's schedule lag "
                          f"alone ({reasons[0]}): measured again ({attempt + 1} of {LAG_RETRIES})")
    return runs


def _live_stats(table: pd.DataFrame) -> dict:
    """The statistics of :data:`LIVE_BOUNDS` (and the reported ones) over the valid runs' rows."""
    t = fd.valid_rows(table)
    share = t["share_pct_err"].abs()
    return {"share_pts_median": share.median(), "share_pts_p90": share.quantile(0.9),
            "share_pts_max": share.max(),
            "throughput_pct_median": t["throughput_tok_s_err"].abs().median(),
            "e2e_p50_pct_median": t["e2e_p50_ms_err"].abs().median(),
            "ttft_p50_pct_median": t["ttft_p50_ms_err"].abs().median(), "rows": len(t)}


def _fidelity(runs):
    table = fd.compare_all(fd.simulate_pairs(runs))
    stats = _live_stats(table)
    out = ROOT / ".cache" / "engines" / "live_stats.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a") as f:       # the noise record across runs (the bounds above come from it)
        f.write(json.dumps({"kind": runs[0].extra.get("engine_kind"), "t": time.time(),
                            "valid_runs": sum(bool(r.summary["valid"]) for r in runs),
                            **{k: round(float(v), 3) for k, v in stats.items()}}) + "\n")
    return table, stats


def _assert_live(runs, table, stats):
    """At least :data:`MIN_VALID_RUNS` valid runs, and :data:`LIVE_BOUNDS` over them."""
    valid = [r.name for r in runs if r.summary["valid"]]
    assert len(valid) >= MIN_VALID_RUNS, (f"{len(valid)} of {len(runs)} live runs valid ({valid})",
                                          [r.summary["valid_reason"] for r in runs])
    bounds = dict(LIVE_BOUNDS)
    bad = {k: (round(float(stats[k]), 3), b) for k, b in bounds.items() if not stats[k] <= b}
    assert not bad, (bad, stats)


# --- one engine per test class (started as the book starts it), its quick fit, chapter 8 on it ----
@pytest.fixture(scope="class")
def eng(request, engines):
    """The session's engine; for the class's tests (and its other fixtures, set up after this one)
    the test process runs beside it, off its CPU (tests/ci.py's ``beside``)."""
    from ci import beside
    kind = request.cls.kind
    with _timed(f"{kind} start (or the session's)"):
        e = engines(kind)
    with beside(kind):
        yield e


@pytest.fixture(scope="class")
def fitted(request, eng, tmp_path_factory):
    kind = request.cls.kind
    out = tmp_path_factory.mktemp("fit") / f"{kind}.json"
    with _timed(f"{kind} fit"):
        res = fit.fit_engine(eng, out=out, **QUICK_FIT)
    return res, out


@pytest.fixture(scope="class")
def chapter8(request, eng, fitted, tmp_path_factory):
    kind = request.cls.kind
    box = {}

    def measure():
        tmp = box["tmp"] = tmp_path_factory.mktemp(f"ch08-{kind}")
        with _timed(f"{kind} chapter 8 (papermill, live)"):
            _papermill(CH8, tmp / "ch08.ipynb",
                       ["-p", "backend", "http", "-r", "endpoint", eng.base_url, "-r", "engine_kind", kind,
                        "-r", "fit_file", str(fitted[1]), "-p", "duration_s", str(LIVE_DURATION_S),
                        "-y", "seeds: [0]", "-r", "runs_dir", str(tmp / "runs"),
                        # the five scenarios whose noise LIVE_BOUNDS were measured on (the chapter's
                        # default adds prefill_mix and seed000, as in the saved runs)
                        "-y", "scenarios: " + json.dumps(list(fd.SCENARIOS))], timeout=420)
        return [load_run(p) for p in sorted((tmp / "runs" / kind).glob("*/seed*"))]

    measure_with_retries(measure, lambda runs: sum(bool(r.summary["valid"]) for r in runs) >= MIN_VALID_RUNS,
                         f"{kind} chapter 8")
    return box["tmp"] / "ch08.ipynb", box["tmp"] / "runs"


# --- vLLM ---------------------------------------------------------------------------------------
class TestVLLM:
    kind = "vllm"

    def test_fit_quality(self, fitted):
        _fit_quality(fitted, self.kind)

    def test_kv_capacity_in_metrics(self, eng):
        """vLLM states its KV cache in ``vllm:cache_config_info`` (chapter 6's capacity table): at
        least one sequence of the full context window must fit, or vLLM would not have started."""
        from fairlib.pools import kv_capacity_from_metrics
        with urllib.request.urlopen(eng.metrics_url, timeout=10) as r:
            kv = kv_capacity_from_metrics(r.read().decode())
        assert kv["tokens"] == kv["num_gpu_blocks"] * kv["block_size"]
        assert kv["tokens"] >= eng.settings["max_model_len"], kv
        print("vLLM KV capacity:", kv)

    def test_wire_format(self, eng):
        facts = _check_wire(self.kind, eng)
        assert facts["chat"]["role_only_first_chunk"]

    def test_priority_lower_first(self, eng, tmp_path):
        """16 long streams (priority 1) fill the batch and end one by one; then 4 requests with
        priority 1 arrive, then 4 with priority 0: the later, higher-priority ones start first."""
        from fairlib.client import build_schedule, load_records, run
        n_bg = eng.settings["max_num_seqs"]
        wl = pd.DataFrame({"arrival_ms": [0.0] * n_bg + [600.0] * 4 + [700.0] * 4,
                           "tenant": [0] * n_bg + [1] * 4 + [2] * 4, "prompt_tokens": 32,
                           "output_tokens": [120 + 12 * i for i in range(n_bg)] + [8] * 8,
                           "priority": [1] * n_bg + [1] * 4 + [0] * 4})
        cfg = eng.endpoint_config()
        assert cfg.send_priority
        with _timed("vllm priority"):
            run(build_schedule(wl, seed=4242, tokenizer=eng.tokenizer(), tenant_names=["bg", "low", "high"]),
                cfg, tmp_path / "run", scrape_metrics=False, collect_env=False)
        rec = load_records(tmp_path / "run")
        assert (rec.error_class == "none").all(), rec.error_message.dropna().tolist()
        # The engine's decision, from its own clock: admitted at (sent + vLLM's queue time). The
        # client's first-token times are not the order of admission: a backlog of streamed
        # chunks (client or API server behind on shared cores) arrives as one burst, read in
        # socket order (CI: 7 first tokens within 0.2 ms, one "low" read 54 ms before them).
        qt = rec.server_timings.map(lambda t: t["metrics"]["queue_time_ms"]) / 1e3
        admitted = rec.actual_send_s + qt
        low, high = admitted[rec.tenant_name == "low"], admitted[rec.tenant_name == "high"]
        assert high.max() < low.min(), (sorted(high), sorted(low), sorted(rec.first_token_s[low.index]),
                                         sorted(rec.first_token_s[high.index]))
        # all eight waited for a slot (the batch was full): otherwise the order proves nothing
        assert (qt[low.index.append(high.index)] > 0.1).all(), qt.tolist()

    def test_chapter8_live(self, chapter8):
        nb, runs_dir = chapter8
        text = _outputs(nb)
        assert "live runs (measured now)" in text and "vllm: share_pts_max" in text
        runs, lines = _check_runs(self.kind, runs_dir)
        table, stats = _fidelity(runs)
        print("\n".join(lines))
        print(fd.error_summary(table, valid_only=True).round(2).to_string())
        print({k: round(float(v), 2) for k, v in stats.items()})
        _assert_live(runs, table, stats)
        # priority ran on the engine: the simulator ran slo_mix with the priority policy too
        slo = next(r for r in runs if r.name == "slo_mix")
        assert slo.extra["policy"] == "priority" and slo.config["endpoint"]["send_priority"]

    def test_chapters_1_to_4_live(self, eng, fitted, tmp_path):
        """Chapter 1's FCFS run on the engine as it schedules, then each chapter's schedulers
        measured through a gateway it starts in front of vLLM: chapters 1 and 2 on the Python data
        plane (the default), chapters 3 and 4 on Envoy + ``fairlib epp`` (``gateway_data_plane=
        "envoy"``), so that the live bounds are checked on both. (All four through Envoy once,
        2026-12-07: chapter 1's four runs valid, client lag p99 4.3-6.5 ms; chapter 2's quota run
        invalid by the client's lag, 20.1 ms, as on the Python plane once the same day, 17.7 ms,
        measured again by the retry.)"""
        keys = {CH1: gl.POLICY_KEYS[:4], CH2: ("fcfs", "rpm_quota"), CH3: ("vtc",), CH4: ("slot_cap",)}
        planes = {CH1: "python", CH2: "python", CH3: "envoy", CH4: "envoy"}
        runs = []
        for nb, want in keys.items():
            box = {}

            def measure(nb=nb, box=box):
                box["n"] = box.get("n", 0) + 1
                box["dir"] = d = tmp_path / f"{nb.stem}-{box['n']}"
                d.mkdir()
                out = d / nb.name
                with _timed(f"vllm {nb.stem} (papermill, through the gateway)"):
                    _papermill(nb, out, ["-p", "backend", "http", "-r", "endpoint", eng.base_url,
                                         "-r", "engine_kind", self.kind, "-r", "fit_file", str(fitted[1]),
                                         "-y", "gateway_seeds: [0]",
                                         "-p", "gateway_duration_s", str(GATEWAY_DURATION_S),
                                         "-p", "gateway_data_plane", planes[nb],
                                         "-p", "live_duration_s", str(LIVE_DURATION_S),
                                         "-r", "runs_dir", str(d / nb.stem)], timeout=900)
                box["text"] = _outputs(out)
                return [load_run(p) for p in sorted((d / nb.stem / "gateway" / self.kind).glob("*/seed*"))]

            # every run of a chapter valid, or measured again (the test needs 6 of the 8 valid)
            got = measure_with_retries(measure, lambda rs: all(r.summary["valid"] for r in rs), f"vllm {nb.stem}")
            text = box["text"]
            assert "through the gateway (measured now)" in text, text[-2000:]
            assert sorted(r.extra["gateway"]["key"] for r in got) == sorted(want)
            assert {r.extra["gateway"]["data_plane"] for r in got} == {planes[nb]}
            runs += got
            if nb == CH1:
                _check_chapter1_fcfs(box["dir"] / nb.stem, text)
        _check_gateway_runs(runs)

    def test_chapter5_live(self, eng, fitted, tmp_path):
        """Chapter 5's protocol, scaled to :data:`CH5_SCALE`, FIFO and SJF through a gateway with
        the estimator (papermill, ``backend="http"``)."""
        out = tmp_path / CH5.name
        with _timed("vllm chapter 5 (papermill, through the gateway)"):
            _papermill(CH5, out, ["-p", "backend", "http", "-r", "endpoint", eng.base_url,
                                  "-r", "engine_kind", self.kind, "-r", "fit_file", str(fitted[1]),
                                  "-y", "seeds: [0]", "-p", "live_scale", str(CH5_SCALE),
                                  "-y", 'live_policies: ["FIFO", "SJF"]', "-y", "live_seeds: [0]",
                                  "-r", "runs_dir", str(tmp_path / "ch05")], timeout=900)
        text = _outputs(out)
        assert "through the gateway (measured now)" in text, text[-2000:]
        _check_chapter5_runs([load_run(p) for p in sorted((tmp_path / "ch05").glob("*/*/seed*"))])


def _check_chapter5_runs(runs):
    """Every answer of each run served in full and fed back to the gateway's estimator, whose
    factors equal ``fairlib.drift.DriftEstimator`` fed the same answers in the order they came
    back (the client's end times; neighbours closer than the clock may swap: 0.02 slack); in the
    stress phase SJF serves short_qa sooner than FIFO does (median end-to-end latency)."""
    from fairlib.chapters import driftsched as ds
    from fairlib.drift import TIERS, DriftEstimator
    from fairlib.sim.engine import Engine
    assert sorted(r.extra["driftsched"]["policy"] for r in runs) == ["fcfs", "sjf"]
    short = {}
    for r in runs:
        d = r.extra["driftsched"]
        st = json.loads((Path(r.path) / "gateway.json").read_text())
        assert st["in_flight"] == 0 and st["waiting"] == 0 and st["pending"] == 0, st
        rec = r.records.sort_values("request_id").reset_index(drop=True)
        ok = rec.error_class == "none"
        assert ok.all(), rec.error_message.dropna().tolist()
        assert (rec.completion_tokens == rec.max_tokens).all()
        req, _ = ds.live_requests(d["seed"], Engine(**r.extra["sim_engine"]), d["scale"])
        assert len(req) == len(rec) and (rec.max_tokens.to_numpy() == req["output_tokens"].to_numpy()).all()
        est = st["estimator"]
        assert est["observed"] == len(rec), est
        e = DriftEstimator()
        for i in np.argsort(rec["end_s"].to_numpy(), kind="stable"):
            c = req["category"].iat[i]
            e.observe(c, TIERS[req["tier"].iat[i]], float(req["output_tokens"].iat[i]))
        for c, b in e.bias.items():
            assert abs(est["bias"][c] - b) <= 0.02, (c, est["bias"], e.bias)
        e2e = (rec.end_s - rec.actual_send_s).to_numpy()
        # in the stress phase, where the gateway holds a queue for SJF to reorder; the calibration
        # phase's light load leaves nothing to reorder (a failed run: medians 0.35 s FIFO, 0.42 s
        # SJF there, only the engine's pace between the runs; stress 6.22 s and 1.24 s)
        stress_short = ((req["category"] == "short_qa") & (req["phase"] == "stress")).to_numpy()
        short[d["policy"]] = float(np.median(e2e[stress_short]))
        if not r.summary["valid"]:
            warnings.warn(f"chapter 5 run {d['policy']} invalid: {r.summary['valid_reason']}")
    print({k: round(v, 2) for k, v in short.items()})
    assert short["sjf"] < short["fcfs"], short


#: Chapter 1's fresh FCFS run (seed000, one 20-s window, vLLM as it schedules): |measured -
#: simulated| per tenant, residency with prefill priced. Seen over eleven runs of this test: the
#: worst tenant within the saved run's 4-point bound in ten (the one printed: 0.65), 5.3 in one
#: (median over the tenants 3.6: FCFS in so short a window depends on which long answers enter
#: first). Bounds at 1.5x the worst seen; an
#: accounting that charged prefill to every running sequence, or a policy that is not FCFS,
#: moves a tenant by 5-10 points and the median with it.
CH1_LIVE_BOUNDS = {"median": 5.0, "max": 8.0}


def _check_chapter1_fcfs(runs_dir, text):
    """Chapter 1's FCFS run (the blog post's tenants at 3x overload, as the engine schedules them):
    the residency split measured within :data:`CH1_LIVE_BOUNDS` of the simulated one (median and
    worst over the tenants). Asserted: residency with prefill priced (a cost fitted from the same
    streams), the accounting the simulator uses. Not asserted: the equal split of prefill time,
    which charges a prompt's prefill to every running sequence; how far it lands from the
    simulator's equal split depends on how slow this machine prefills relative to decode (1 point
    here, 10 points on another CPU in issue 8), so it is a property of the machine, not a check."""
    assert "the scheduler comparison below runs on the simulator" in text and "measured now" in text
    run = load_run(runs_dir / "vllm" / "seed000" / "seed0")
    split = fd.seed000_compare(run)
    print(split.round(2).to_string())
    d = split["difference, priced (points)"].abs()
    stats = {"median": float(d.median()), "max": float(d.max())}
    with open(ROOT / ".cache" / "engines" / "live_stats.jsonl", "a") as f:
        f.write(json.dumps({"kind": "vllm-ch1-fcfs", "t": time.time(), **stats}) + "\n")
    bad = {k: (round(stats[k], 2), b) for k, b in CH1_LIVE_BOUNDS.items() if not stats[k] <= b}
    assert not bad, (bad, split)
    assert run.summary["schedule_lag_ms"]["p50"] < 10.0


def _check_gateway_runs(runs):
    """Fresh gateway runs: drained (no slot held after the run), every answered request's tokens
    counted by the gateway, at least :data:`MIN_VALID_GATEWAY_RUNS` valid, and the measured shares
    of the valid ones within :data:`GATEWAY_BOUNDS` of the simulated ones."""
    for r in runs:
        st = json.loads((Path(r.path) / "gateway.json").read_text())
        assert st["in_flight"] == 0 and st["waiting"] == 0 and st["pending"] == 0, st
        ok = r.records[r.records.error_class == "none"]
        assert (ok.completion_tokens == ok.max_tokens).all()
        tokens = sum(t["output_tokens"] for t in st["tenants"].values())
        assert tokens >= ok.completion_tokens.sum(), (tokens, ok.completion_tokens.sum())
        if not r.summary["valid"]:
            warnings.warn(f"gateway run {r.extra['gateway']['key']} invalid: {r.summary['valid_reason']}")
    valid = [r for r in runs if r.summary["valid"]]
    assert len(valid) >= MIN_VALID_GATEWAY_RUNS, [r.summary["valid_reason"] for r in runs]
    rows = gl.share_rows(valid)
    diff = rows["difference"].abs()
    stats = {"share_pts_median": float(diff.median()), "share_pts_max": float(diff.max()), "rows": len(rows),
             "valid_runs": len(valid)}
    out = ROOT / ".cache" / "engines" / "live_stats.jsonl"
    with open(out, "a") as f:
        f.write(json.dumps({"kind": "vllm-gateway", "t": time.time(), **stats}) + "\n")
    print(rows.round(2).to_string())
    print(stats)
    bad = {k: (round(stats[k], 2), b) for k, b in GATEWAY_BOUNDS.items() if not stats[k] <= b}
    assert not bad, (bad, stats)


def _check_chapter6_runs(runs):
    """Every planned request sent and answered (200 or the pool's 429, nothing else), every answer
    in full; the gateway's event log replays to its own final counters; the pool kept the
    guaranteed tenant's p99 TTFT below first come, first served's, never refused it, refused the
    spot tenant; the drain is in the log at the instants the run asked for."""
    from fairlib.chapters import token_pools_live as tl
    from fairlib.sim.gate import replay
    by = {(r.extra["pools"]["experiment"], r.extra["pools"]["variant"]): r for r in runs}
    assert set(by) == {(e, v) for e, vs in CH6_VARIANTS.items() for v in vs}, sorted(by)
    for key, r in by.items():
        s, rec = r.summary, r.records
        assert s["n_sent"] == s["n_planned"] == len(rec), (key, s["valid_reason"])
        assert set(rec["error_class"]) <= {"none", "http_429"}, (key, rec["error_class"].value_counts())
        ok = rec[rec["error_class"] == "none"]
        assert (ok["completion_tokens"] == ok["max_tokens"]).all(), key
        head, events = gl._events(r)
        gate = replay(head["spec"], events)
        st = json.loads((Path(r.path) / "gateway.json").read_text())
        want = [st["tenants"][n]["machine_ms"] for n in head["tenants"]]
        np.testing.assert_allclose(gate.tenant_state()["machine_ms"][:len(want)], want, rtol=1e-6, atol=1e-3)
        rej = int((rec["error_class"] == "http_429").sum())
        assert sum(st["tenants"][n]["rejected"] for n in head["tenants"]) == rej, key
    q_f = tl._measured_requests(by[("flood", "fcfs")])
    q_p = tl._measured_requests(by[("flood", "pool_estimate")])
    g99 = [float(np.percentile(q.loc[(q["tenant"] == 0) & q["ok"], "ttft_s"], 99)) for q in (q_f, q_p)]
    assert g99[1] < g99[0], g99
    assert not q_p.loc[q_p["tenant"] == 0, "rejected"].any()          # guaranteed, within its share
    assert q_p.loc[q_p["tenant"] == 2, "rejected"].any()              # the spot flood
    assert not q_f["rejected"].any()                                  # no admission control
    ev = tl.replicas_events(by[("loss", "pool")])
    assert [n for _, n in ev] == [1, 2], ev
    (t_down, _), (t_up, _) = ev
    assert abs(t_down - tl.LOSS_DOWN_S * CH6_SCALE) < 1.0 and abs(t_up - tl.LOSS_UP_S * CH6_SCALE) < 1.0, ev
    print({"guaranteed p99 TTFT fcfs / pool (s)": [round(x, 2) for x in g99],
           "spot 429 (%)": round(100 * float(q_p.loc[q_p["tenant"] == 2, "rejected"].mean()), 1),
           "replicas": [(round(t, 2), n) for t, n in ev], "step ratio": [round(tl.step_ratio(r), 2) for r in runs]})


# --- llama.cpp ------------------------------------------------------------------------------------
class TestLlamaCpp:
    kind = "llamacpp"

    def test_fit_quality(self, fitted):
        res, _ = fitted
        _fit_quality(fitted, self.kind)
        # Whether llama.cpp's one-sequence decode is a regime of its own depends on the CPU: on the
        # AMD EPYC the committed fit was made on, B = 1 took 2.4 ms against 5.6 on the B >= 2 line;
        # on an Intel Xeon, the engine under SCHED_IDLE (2026-12-01), 2.2 ms against 1.9: no regime. The fit detects it either
        # way (fit_decode_one); the test reports it and asserts the fit's quality above.
        print("llama.cpp small-batch regime:", res["fit"]["decode"]["small_batch_regime"],
              res["fit"]["decode"]["dt1_ms"])

    def test_wire_format(self, eng):
        facts = _check_wire(self.kind, eng)
        assert facts["chat"]["role_only_first_chunk"]

    def test_chapter6_live(self, eng, fitted, tmp_path):
        """Chapter 6's two experiments, scaled to :data:`CH6_SCALE`, through a gateway in front of
        this engine and a second one started as the book starts it (papermill, ``backend="http"``)."""
        out = tmp_path / CH6.name
        with fit.start(self.kind) as second, _timed("llamacpp chapter 6 (papermill, two replicas)"):
            _papermill(CH6, out, ["-p", "backend", "http",
                                  "-y", "endpoints: " + json.dumps([eng.base_url, second.base_url]),
                                  "-r", "engine_kind", self.kind, "-r", "fit_file", str(fitted[1]),
                                  "-y", "seeds: [0]", "-p", "live_scale", str(CH6_SCALE),
                                  "-y", "live_variants: " + json.dumps(CH6_VARIANTS),
                                  "-r", "runs_dir", str(tmp_path / "ch06")], timeout=900)
        text = _outputs(out)
        assert "through the gateway (measured now)" in text, text[-2000:]
        _check_chapter6_runs([load_run(p) for p in sorted((tmp_path / "ch06").glob("*/*/seed*"))])

    def test_chapter8_live(self, chapter8):
        nb, runs_dir = chapter8
        text = _outputs(nb)
        assert "live runs (measured now)" in text and "llamacpp: share_pts_max" in text
        runs, lines = _check_runs(self.kind, runs_dir)
        table, stats = _fidelity(runs)
        print("\n".join(lines))
        print(fd.error_summary(table, valid_only=True).round(2).to_string())
        print({k: round(float(v), 2) for k, v in stats.items()})
        _assert_live(runs, table, stats)
        slo = next(r for r in runs if r.name == "slo_mix")
        assert slo.extra["policy"] == "fcfs" and not slo.config["endpoint"]["send_priority"]


def _fit_quality(fitted, kind):
    res, path = fitted
    dec, pre = res["fit"]["decode"], res["fit"]["prefill"]
    # the iteration time rises with the batch at the longest context. At the shortest (56 tokens)
    # vLLM-CPU's step is ~10 ms of fixed cost and ~0.1 ms per sequence, inside the +-1 ms noise
    # of one quick sweep on shared cores (a fitted slope of -0.12 ms was seen): not asserted there.
    longest = max(dec["per_context"], key=float)
    v = dec["per_context"][longest]
    B, dt = np.array(v["B"]), np.array(v["dt_ms_median"])
    assert np.polyfit(B, dt, 1)[0] > 0, (kind, longest, v["B"], v["dt_ms_median"])
    j = dec["joint"]
    assert j["r2"] >= DECODE_R2_MIN, (kind, j["r2"], j["residuals_ms"])
    assert j["slope_ctx_ms_per_token"] > 0, (kind, j)          # longer contexts cost more
    assert pre["linear"]["r2"] >= PREFILL_R2_MIN and pre["linear"]["slope"] > 0, (kind, pre["linear"])
    # the client's per-token times and prefill slope against the engine's own figures
    assert 0.7 < dec["server"]["client_over_server_median"] < 1.3, dec["server"]
    assert 0.8 < pre["server"]["client_slope_over_server_slope"] < 1.25, pre["server"]
    # the saved file loads into the simulator's Engine, through fairlib.calibrate.probe too
    from fairlib.calibrate.probe import load_probed_engine
    eng = load_probed_engine(path)
    assert eng.max_batch == res["engine"]["max_batch"] and eng.iter_slope_ms > 0
    saved = json.loads(Path(path).read_text())
    assert {"engine", "engine_info", "machine", "date", "params", "fit", "points"} <= set(saved)
    assert saved["engine_info"]["version"] and saved["engine_info"]["model_shape"]["hidden"] == 512
