"""Chapter 5: the DriftSched protocol on the engine model, with the estimator in the loop.

The workload (:func:`protocol_requests`), as the paper's public code builds it
(``../shared/reference/driftsched.md``), with the lengths this book states:

- a calibration phase of ``n_cal`` = 1,000 requests, gaps uniform on [0.05, 0.15] s, categories
  short_qa / summary / technical / report drawn 40/25/25/10 %; then a stress phase of ``n_stress``
  = 2,000, gaps uniform on [0.005, 0.03] s, mix 10/20/40/30 %; tiers premium / standard / batch
  drawn uniformly;
- prompts of :data:`PROMPT_WORDS` words (uniform between the bounds, per category) and answers of
  a lognormal number of tokens (:data:`OUTPUT_TOKENS`: median and sigma per category), cut at
  ``max_tokens = T_base`` as the paper's engine cuts them (``cut`` marks them: right-censored);
- words and tokens of every prompt and answer from one text per request and a real tokenizer
  (``fairlib.chapters.tokens``: cl100k_base), so that the whitespace proxy and the tokenizer count
  the same text.

:func:`run_protocol` sends it to the engine model under a policy with the estimator in the loop:
at each arrival the estimate is made from what had finished by then (for a static-batch worker:
by the end of its batch, when its results return), SJF keys on it (the request's estimated total
budget, ``input + T_est``), and every finish feeds the estimator back. Per request it keeps the
estimates of the adaptive estimator that schedules and of a static one beside it (``B = 1``), both
counted in the run's unit, and the latency the paper measures: arrival to finish, or to the end
of the request's batch on a static-batch worker ("every request gets the batch's wall time").
"""
from __future__ import annotations

import argparse
import json
import math
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

from fairlib.calibrate import fit as fitmod
from fairlib.calibrate.lifecycle import nice_of, sched_of
from fairlib.chapters import fidelity as fd
from fairlib.chapters import gateway_live as gl
from fairlib.chapters.gateway_live import full_batch_step, run_steps
from fairlib.chapters.tokens import TextCounter
from fairlib.client import build_schedule, run
from fairlib.drift import CATEGORIES, T_BASE, TIERS, DriftEstimator
from fairlib.gateway import FAIRNESS_HEADERS, GatewayProcess
from fairlib.records import load_run
from fairlib.sim import loop
from fairlib.sim.engine import Engine
from fairlib.sim.online import OnlineEngine
from fairlib.sim.state import ADMITTED, FINISH, RUNNING, STATUS

__all__ = ["PHASES", "PROMPT_WORDS", "OUTPUT_TOKENS", "POLICIES", "ENGINES", "protocol_requests", "run_protocol",
           "error_table", "latency_table", "tier_table", "kendall_tau", "LIVE_TENANTS", "LIVE_SCALE", "mean_cost_ms",
           "live_requests", "live_workload", "measure_live", "chapter_runs", "live_table", "saved_live", "save_live",
           "run_steps", "run_steps_engine", "step_table"]

#: (name, requests, gap bounds in s, category mix in CATEGORIES' order)
PHASES = (("calibration", 1000, (0.05, 0.15), (0.40, 0.25, 0.25, 0.10)),
          ("stress", 2000, (0.005, 0.03), (0.10, 0.20, 0.40, 0.30)))
#: prompt words per category: uniform between the two bounds (the book's choice)
PROMPT_WORDS = {"short_qa": (8, 40), "summary": (150, 600), "technical": (40, 200), "report": (60, 250)}
#: answer tokens per category: lognormal (median, sigma) before the cut at T_base (the book's choice:
#: most answers end well inside the budget, a report often reaches it)
OUTPUT_TOKENS = {"short_qa": (40, 0.5), "summary": (150, 0.5), "technical": (220, 0.5), "report": (380, 0.5)}
#: the five schedulers of the paper, as the simulator's policies (tiers as classes 0/1/2)
POLICIES = {"FIFO": ("fcfs", {}), "Priority": ("priority", {}), "Weighted 50/30/20": ("weighted", {"w": [5, 3, 2]}),
            "SJF": ("sjf", {}), "Aging": ("aging", {"rate": 0.01})}


def _engines() -> dict:
    """The paper's NVIDIA L4 serving Qwen1.5-1.8B in fp16, as the engine model sees it: a decode
    step is bound by reading the 3.6 GB of weights at the L4's 300 GB/s, 12 ms, plus 0.2 ms per
    sequence; a prompt token costs 2 x 1.8e9 FLOPs, at half the L4's 121 dense fp16 TFLOPs (a
    typical prefill utilisation) 0.06 ms; the worker's batches of 32 (static: DriftSched's) or
    continuous batching of 32."""
    base = Engine(12.0, 0.2, 0.06, max_batch=32)
    return {"static": replace(base, batching="static", fill_wait_ms=10.0), "continuous": base}


ENGINES = _engines()


def protocol_requests(seed: int, tokenizer=None, n_cal: Optional[int] = None, n_stress: Optional[int] = None) -> pd.DataFrame:
    """The paper's 3,000 requests (the module's docstring), seeded; per request: arrival_ms,
    phase, category, tier (0 premium, 1 standard, 2 batch), prompt words and tokens, the answer's
    true tokens and words (after the cut) and whether it was cut. ``tokenizer``: a
    ``fairlib.chapters.tokens.TextCounter`` (default the book's)."""
    tc = tokenizer or TextCounter()
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 5005]))
    rows, t = [], 0.0
    for name, n, (g0, g1), mix in PHASES:
        n = n if (name == "calibration" and n_cal is None) or (name == "stress" and n_stress is None) else \
            (n_cal if name == "calibration" else n_stress)
        gaps = rng.uniform(g0, g1, n)
        cats = rng.choice(len(CATEGORIES), n, p=np.asarray(mix) / sum(mix))
        tiers = rng.integers(0, len(TIERS), n)
        for i in range(n):
            t += gaps[i] * 1e3
            c = CATEGORIES[cats[i]]
            lo, hi = PROMPT_WORDS[c]
            pw = int(rng.integers(lo, hi + 1))
            med, sig = OUTPUT_TOKENS[c]
            true = max(1, int(round(rng.lognormal(math.log(med), sig))))
            rows.append({"arrival_ms": t, "phase": name, "category": c, "tier": int(tiers[i]),
                         "prompt_words_target": pw, "true_tokens": true})
    df = pd.DataFrame(rows)
    counts = tc.count_requests(df["category"].tolist(), df["prompt_words_target"].tolist(),
                               np.minimum(df["true_tokens"], [T_BASE[c] for c in df["category"]]).tolist(), seed)
    df["prompt_words"], df["prompt_tokens"], df["output_tokens"], df["output_words"] = counts
    df["cut"] = df["true_tokens"] >= df["category"].map(T_BASE)
    return df.drop(columns=["prompt_words_target"])


def run_protocol(requests: pd.DataFrame, engine: Engine, policy: str, params: Optional[dict] = None, *,
                 counting: str = "tokens", estimator: Optional[DriftEstimator] = None, oracle: bool = False,
                 sjf_key: str = "tokens") -> pd.DataFrame:
    """The requests through the engine model under ``policy``, the estimator in the loop (the
    module's docstring). ``counting``: ``"tokens"`` (the tokenizer: prompt and answer lengths in
    tokens) or ``"words"`` (the whitespace proxy). ``oracle``: SJF keys on the true answer instead
    of the estimate (the estimates are still made and recorded). ``sjf_key``: what SJF orders by,
    ``"tokens"`` (the estimated total budget, prompt + answer, the paper's) or ``"machine"`` (the
    estimated machine time on this engine, ``prefill * prompt_tokens + answer * per_seq(max_batch)``
    in microseconds: chapter 1's residency). Returns the requests with ``est`` (the adaptive
    estimate, in the run's unit), ``est_static``, ``actual`` (the answer in the run's unit),
    ``admitted_ms``, ``finish_ms``, ``e2e_s`` (arrival to finish, or to the end of the request's
    batch on a static-batch worker) and ``bias`` (the factor its estimate used)."""
    if counting not in ("tokens", "words"):
        raise ValueError(f"counting must be 'tokens' or 'words', got {counting!r}")
    if sjf_key not in ("tokens", "machine"):
        raise ValueError(f"sjf_key must be 'tokens' or 'machine', got {sjf_key!r}")
    if sjf_key == "machine" and counting != "tokens":
        raise ValueError("sjf_key='machine' prices tokens: it needs counting='tokens'")
    if oracle and counting != "tokens":
        raise ValueError("oracle=True keys on the true answer in tokens: it needs counting='tokens'")
    est = estimator if estimator is not None else DriftEstimator()
    static = DriftEstimator(adaptive=False, key=est.key)
    eng = OnlineEngine(engine, policy, n_tenants=len(TIERS), n_classes=len(TIERS), priority_levels=range(3),
                       capacity=len(requests) + 1, **(params or {}))
    inp = requests["prompt_tokens" if counting == "tokens" else "prompt_words"].to_numpy()
    act = requests["output_tokens" if counting == "tokens" else "output_words"].to_numpy()
    cats, tiers = requests["category"].to_numpy(), requests["tier"].to_numpy()
    n = len(requests)
    est_a, est_s, bias = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n)
    fed = np.zeros(n, bool)
    static_mode = engine.batching == "static"

    def feedback(upto_ms: float) -> None:
        """Every answer whose result was back by ``upto_ms`` to the estimator, in that order."""
        S = eng.S
        k = eng.n_requests
        done = (S.RI[STATUS, :k] != RUNNING) & ~np.isnan(S.RF[FINISH, :k]) & ~fed[:k]
        if not done.any():
            return
        back = S.RF[FINISH, :k].copy()
        if static_mode:              # a batch's results return when its last request finishes
            adm = S.RF[ADMITTED, :k]
            for a in np.unique(adm[done]):
                members = adm == a
                if np.isnan(S.RF[FINISH, :k][members]).any():
                    done &= ~members            # its batch still runs
                else:
                    back[members] = S.RF[FINISH, :k][members].max()
        ids = np.flatnonzero(done & (back <= upto_ms))
        for r in ids[np.lexsort((ids, back[ids]))]:
            est.observe(cats[r], TIERS[tiers[r]], float(act[r]))
            fed[r] = True

    pid, arr = eng.policy.pid, requests["arrival_ms"].to_numpy(float)
    for r in range(n):
        loop.run(eng.S, eng.E, pid, eng.pf, eng.pi, float(arr[r]))
        feedback(float(arr[r]))
        tier = TIERS[tiers[r]]
        est_a[r] = est.estimate(cats[r], tier, float(inp[r]))
        est_s[r] = static.estimate(cats[r], tier, float(inp[r]))
        bias[r] = est.bias[est.key_of(cats[r], tier)]
        true_out = int(requests["output_tokens"].iat[r])
        p_tok = int(requests["prompt_tokens"].iat[r])
        answer = true_out if oracle else int(est_a[r])
        if sjf_key == "tokens":
            key = int(inp[r]) + answer
        else:                       # microseconds of machine on this engine: the answer at a full batch
            per_tok = float(engine.per_seq_ms(engine.max_batch))
            key = int(round(1e3 * (engine.prefill_ms_per_token * p_tok + answer * per_tok)))
        eng.submit(int(tiers[r]), p_tok, true_out, float(arr[r]), est_output_tokens=max(1, key),
                   klass=int(tiers[r]), priority=int(tiers[r]))
    loop.run(eng.S, eng.E, pid, eng.pf, eng.pi, math.inf)
    S = eng.S
    out = requests.copy()
    out["est"], out["est_static"], out["actual"], out["bias"] = est_a, est_s, act, bias
    out["admitted_ms"] = S.RF[ADMITTED, :n]
    fin = S.RF[FINISH, :n].copy()
    if static_mode:
        adm = S.RF[ADMITTED, :n]
        ends = pd.Series(fin).groupby(adm).transform("max").to_numpy()
        fin = ends
    out["finish_ms"] = fin
    out["e2e_s"] = (fin - arr) / 1e3
    out["policy"] = policy
    return out


def error_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per run group (columns other than the requests'): MAE and RMSE of the static and adaptive
    estimates against the answer, in the run's unit, and the cut the adaptive one makes (%)."""
    def one(g):
        e_a, e_s = g["est"] - g["actual"], g["est_static"] - g["actual"]
        mae_a, mae_s = e_a.abs().mean(), e_s.abs().mean()
        rm_a, rm_s = math.sqrt((e_a ** 2).mean()), math.sqrt((e_s ** 2).mean())
        return pd.Series({"MAE static": mae_s, "MAE adaptive": mae_a, "MAE cut (%)": 100 * (1 - mae_a / mae_s),
                          "RMSE static": rm_s, "RMSE adaptive": rm_a, "RMSE cut (%)": 100 * (1 - rm_a / rm_s)})
    return runs.groupby(["counting", "engine", "policy", "seed"], sort=False).apply(one, include_groups=False)


def latency_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (counting, engine, policy, seed): E2E p50 and p99 over every request (s)."""
    g = runs.groupby(["counting", "engine", "policy", "seed"], sort=False)["e2e_s"]
    return pd.DataFrame({"p50 (s)": g.quantile(0.5), "p99 (s)": g.quantile(0.99), "mean (s)": g.mean()})


def tier_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (counting, engine, policy, seed, tier): mean E2E (s)."""
    t = runs.assign(tier_name=runs["tier"].map(dict(enumerate(TIERS))))
    return t.groupby(["counting", "engine", "policy", "seed", "tier_name"], sort=False)["e2e_s"].mean().unstack("tier_name")[list(TIERS)]


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-b between two orders (ties counted as in scipy)."""
    return float(kendalltau(np.asarray(a, float), np.asarray(b, float)).statistic)


# --- live: the protocol through the fairness gateway on a real engine ---------------------------------
#: the paper's three tiers as gateway tenants: class and priority 0/1/2 (premium first)
LIVE_TENANTS = {"tenant": [{"name": t, "klass": i, "priority": i, "tier": t} for i, t in enumerate(TIERS)]}
#: the schedulers the gateway runs live (the paper's five)
LIVE_SCALE = 0.1
RECORD_SEEDS = (0, 1, 2)


def mean_cost_ms(requests: pd.DataFrame, engine: Engine) -> float:
    """Machine time of the mean request on ``engine`` at a full batch:
    ``prefill * prompt_tokens + answer_tokens * per_seq(max_batch)``."""
    return float(engine.prefill_ms_per_token * requests["prompt_tokens"].mean()
                 + requests["output_tokens"].mean() * engine.per_seq_ms(engine.max_batch))


def live_requests(seed: int, live_engine: Engine, scale: float = LIVE_SCALE) -> tuple:
    """``(requests, stretch)``: the protocol with ``scale`` times its requests in each phase, its
    arrivals stretched by ``stretch = cost on live_engine / cost on the continuous L4 model`` (the
    live engine sees the load, relative to its capacity, that the L4 model sees)."""
    n_cal = max(1, int(round(PHASES[0][1] * scale)))
    n_stress = max(1, int(round(PHASES[1][1] * scale)))
    req = protocol_requests(seed, n_cal=n_cal, n_stress=n_stress)
    stretch = mean_cost_ms(req, live_engine) / mean_cost_ms(req, ENGINES["continuous"])
    return req.assign(arrival_ms=req["arrival_ms"] * stretch), stretch


def live_workload(requests: pd.DataFrame, counting: str) -> pd.DataFrame:
    """The client's workload table: one tenant per tier, prompts of the run's unit (token ids for
    ``tokens``, words for ``words``), answers forced to their (cut) length, the category as a header."""
    return pd.DataFrame({"arrival_ms": requests["arrival_ms"], "tenant": requests["tier"],
                         "prompt_tokens": requests["prompt_tokens" if counting == "tokens" else "prompt_words"],
                         "output_tokens": requests["output_tokens"],
                         "headers": [{"x-fairlib-category": c} for c in requests["category"]]})


def measure_live(endpoint: str, kind: str, fit_path, *, policies: Sequence[str] = tuple(POLICIES),
                 seeds: Sequence[int] = (0,), counting: str = "tokens", scale: float = LIVE_SCALE,
                 runs_dir="runs/ch05", model: Optional[str] = None, extra: Optional[dict] = None,
                 fit_label: Optional[str] = None, log=print) -> list:
    """Each scheduler x seed of the protocol, scaled, through a gateway with the estimator in front
    of ``endpoint``; run directories ``runs_dir/<counting>/<policy>/seed<k>`` (the client's
    records and the gateway's log and state). ``fit_label``: how the runs name the fit file
    (default its path)."""
    fit = fitmod.load_fit(fit_path)
    live_engine = fd.fitted_engine(fit)
    cfg = fd.endpoint_config(kind, endpoint, model, priority=False)
    tok = fd.model_tokenizer(kind) if counting == "tokens" else None
    tenants = Path(tempfile.mkdtemp(prefix="fairlib-ch05-")) / "tenants.toml"
    tenants.write_text("".join(f'[[tenant]]\nname = "{t["name"]}"\nklass = {t["klass"]}\npriority = {t["priority"]}\n'
                               f'tier = "{t["tier"]}"\n' for t in LIVE_TENANTS["tenant"]))
    args = ["--upstream", endpoint.rstrip("/"), "--cost-model", str(fit_path), "--max-inflight",
            str(int(fit["engine"]["max_batch"])), "--tenants", str(tenants), "--estimator", counting]
    out = []
    with GatewayProcess(args) as gw:
        for label in policies:
            pol, params = POLICIES[label]
            for s in seeds:
                req, stretch = live_requests(s, live_engine, scale)
                sched = build_schedule(live_workload(req, counting), s, tenant_names=list(TIERS), tokenizer=tok,
                                       token_id_prompts=counting == "tokens")
                gw.set_policy(pol, params)
                rd = Path(runs_dir) / counting / pol / f"seed{s}"
                more = {"engine_kind": kind, "fit": {"file": fit_label or str(fit_path), "date": fit.get("date")},
                        "sim_engine": live_engine.to_dict(), "loadavg_1m": fd.loadavg(),
                        "driftsched": {"label": label, "policy": pol, "params": params, "counting": counting,
                                       "seed": int(s), "scale": scale, "stretch": stretch}, **(extra or {})}
                c = replace(cfg, base_url=gw.base_url, tenant_header=FAIRNESS_HEADERS[0])
                run(sched, c, rd, config_extra=more, overwrite=True, scrape_metrics=False)
                gl.wait_idle(gw, 600)
                gl.keep_gateway_files(gw, rd)
                r = load_run(rd)
                log(f"{kind} ch05 {label} seed {s} ({counting}, {len(req)} requests, x{stretch:.1f}): "
                    f"{r.summary['valid_reason']}")
                out.append(r)
    return out


def run_steps_engine(run) -> Engine:
    """The engine model with the step times the engine showed in the run: ``dt = a + b B`` by
    least squares over the median step of each batch size ``B >= 2`` (weights: the square root of
    its count), the fit's prefill price and batch limit (one batch size seen: the fit's slope
    through its median; none: the fitted engine). A line that falls with the batch becomes the
    mean step; one with a negative intercept the least-squares line through the origin."""
    eng = Engine(**run.extra["sim_engine"])
    st = run_steps(run)
    st = st[st["B"] >= 2]
    g = st.groupby("B")["dt_ms"]
    med, n = g.median(), g.size()
    if len(med) < 2:       # one batch size seen: the fit's slope through its median step
        if not len(med):
            return eng
        b = eng.iter_slope_ms
        a = float(med.iloc[0]) - b * float(med.index[0])
    else:
        b, a = np.polyfit(med.index.to_numpy(float), med.to_numpy(float), 1, w=np.sqrt(n.to_numpy(float)))
    if b < 0:           # a noisy line falling with the batch: the mean step, the same at every batch
        a, b = float(np.average(med.to_numpy(float), weights=n.to_numpy(float))), 0.0
    if a < 0:           # a line through the medians crossing zero: through the origin instead
        B = med.index.to_numpy(float)
        a, b = 0.0, float((med.to_numpy(float) * B * n).sum() / (B * B * n).sum())
    return Engine(float(a), float(b), eng.prefill_ms_per_token, eng.max_batch)


def step_table(runs: Sequence) -> pd.DataFrame:
    """Per live run: the fitted engine's step at a full batch against the median step the gateway
    saw at that batch, their ratio, and the mean batch over the steps."""
    rows = []
    for r in runs:
        d, b = r.extra["driftsched"], int(r.extra["sim_engine"]["max_batch"])
        st = run_steps(r)
        fitted, measured = full_batch_step(r, st)
        rows.append({"policy": d["label"], "seed": d["seed"], "steps": len(st), "mean batch": float(st["B"].mean()),
                     f"fitted step at B={b} (ms)": fitted, f"measured median at B={b} (ms)": measured,
                     "measured / fitted": measured / fitted})
    return pd.DataFrame(rows).set_index(["policy", "seed"])


def live_table(runs: Sequence) -> pd.DataFrame:
    """Per live run, measured and simulated (continuous batching, the same schedule, the same
    scheduler, the estimator in the loop) on the fitted engine and on the engine with the run's
    own step times (:func:`run_steps_engine`): E2E p50 and p99 over every request and the mean per
    tier (s), and the estimator's factors at the end (measured: the gateway's)."""
    rows = []
    for r in runs:
        d = r.extra["driftsched"]
        req, _ = live_requests(d["seed"], Engine(**r.extra["sim_engine"]), d["scale"])
        sim = run_protocol(req, Engine(**r.extra["sim_engine"]), d["policy"], d["params"], counting=d["counting"])
        sim_steps = run_protocol(req, run_steps_engine(r), d["policy"], d["params"], counting=d["counting"])
        rec = r.records.sort_values("request_id").reset_index(drop=True)
        e2e = (rec["end_s"] - rec["actual_send_s"]).astype(float).to_numpy()
        ok = (rec["error_class"] == "none").to_numpy()
        st = json.loads((Path(r.path) / "gateway.json").read_text())
        for src, lat, bias in (("measured", e2e, (st.get("estimator") or {}).get("bias", {})),
                               ("simulated", sim["e2e_s"].to_numpy(), None),
                               ("simulated, the run's steps", sim_steps["e2e_s"].to_numpy(), None)):
            row = {"policy": d["label"], "seed": d["seed"], "source": src, "valid": bool(r.summary.get("valid")),
                   "answered": int(ok.sum()) if src == "measured" else len(sim),
                   "p50 (s)": float(np.nanquantile(lat, 0.5)), "p99 (s)": float(np.nanquantile(lat, 0.99))}
            for i, t in enumerate(TIERS):
                row[f"{t} mean (s)"] = float(np.nanmean(lat[req["tier"].to_numpy() == i]))
            rows.append(row)
    return pd.DataFrame(rows).set_index(["policy", "seed", "source"])


def chapter_runs(backend: str, *, engine_kind: str = "vllm", endpoint: Optional[str] = None,
                 model: Optional[str] = None, fit_file=None, policies: Sequence[str] = tuple(POLICIES),
                 seeds: Sequence[int] = (0,), scale: float = LIVE_SCALE, runs_dir="runs/ch05", log=print) -> list:
    """What the chapter's live section shows: on ``sim`` the saved runs; on ``http`` the schedulers
    measured now through a gateway in front of ``endpoint``, with a fit that describes it
    (``fairlib.calibrate.fit.fit_for_endpoint`` refuses one made for another engine or machine)."""
    if backend != "http":
        return saved_live(engine_kind)
    fitmod.fit_for_endpoint(fit_file, endpoint, engine_kind, model)
    return measure_live(endpoint, engine_kind, fit_file or fitmod.data_path(engine_kind), policies=policies,
                        seeds=seeds, scale=scale, runs_dir=runs_dir, model=model, log=log)


def saved_live(kind: str = "vllm", counting: str = "tokens", root=None) -> list:
    """The saved live runs: ``data/runs/drift/<kind>/<counting>/<policy>/seed<k>``."""
    base = (Path(root) if root is not None else fd.runs_root()) / "drift" / kind / counting
    if not base.is_dir():
        raise FileNotFoundError(f"no saved chapter-5 live runs under {base}")
    order = [p for p, _ in POLICIES.values()]
    dirs = sorted((p for p in base.glob("*/seed*")), key=lambda p: (order.index(p.parent.name), int(p.name[4:])))
    return [load_run(p) for p in dirs]


def save_live(runs: Sequence, kind: str = "vllm", root=None) -> list:
    """The runs' small files under ``data/runs/drift/<kind>/<counting>/<policy>/seed<k>`` (records
    and event log compressed)."""
    base = (Path(root) if root is not None else fd.runs_root()) / "drift" / kind
    out = []
    for r in runs:
        d = r.extra["driftsched"]
        dst = base / d["counting"] / d["policy"] / f"seed{d['seed']}"
        gl.store_run_files(r, dst)
        out.append(dst)
    return out


def record(kind: str = "vllm", *, seeds: Sequence[int] = RECORD_SEEDS, counting: str = "tokens",
           scale: float = LIVE_SCALE, fit_path=None, root=None, quiet_load: Optional[float] = 3.5) -> list:
    """Start the engine as the book does, measure every scheduler x seed through the gateway with
    the fit the gateway experiment uses (``data/runs/gateway/<kind>/fit.json``, made on the same
    machine), and save the runs."""
    ffile = Path(fit_path) if fit_path is not None else gl.fit_path_of(kind)
    saved = []
    with fitmod.start(kind) as eng:
        extra = {"engine_nice": nice_of(eng.pid), "engine_sched": sched_of(eng.pid)}
        for label in POLICIES:
            fd.wait_quiet(quiet_load, 300.0, print)
            runs = measure_live(eng.base_url, kind, ffile, policies=[label], seeds=seeds, counting=counting,
                                scale=scale, runs_dir=Path(tempfile.mkdtemp(prefix="fairlib-ch05-")), model=eng.model,
                                extra=extra, fit_label=None if fit_path is not None else
                                f"data/runs/gateway/{kind}/fit.json")
            saved += save_live(runs, kind, root)
    return saved


def main(argv=None) -> int:
    """``python -m fairlib.chapters.driftsched record vllm [--seeds 0 1 2] [--counting tokens]``."""
    ap = argparse.ArgumentParser(prog="python -m fairlib.chapters.driftsched", description=main.__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="measure the protocol through the gateway into data/runs/drift")
    r.add_argument("kind", choices=list(fd.KINDS))
    r.add_argument("--seeds", type=int, nargs="+", default=list(RECORD_SEEDS))
    r.add_argument("--counting", choices=["tokens", "words"], default="tokens")
    r.add_argument("--scale", type=float, default=LIVE_SCALE)
    a = ap.parse_args(argv)
    record(a.kind, seeds=a.seeds, counting=a.counting, scale=a.scale)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
