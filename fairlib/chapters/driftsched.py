"""Chapter 5: the DriftSched protocol on the engine model, with the estimator in the loop.

The workload is :func:`fairlib.chapters.driftsched_protocol.protocol_requests` (the paper's
generator: its phases, prompts, answers cut at ``max_tokens = T_base`` and the drain between the
phases; :data:`EARLIER`, the chapter's first version, beside it).

:func:`run_protocol` sends it to the engine model under a policy with the estimator in the loop:
at each arrival the estimate is made from what had finished by then (for a static-batch worker:
by the end of its batch, when its results return), SJF keys on it (the request's estimated total
budget, ``input + T_est``), and every finish feeds the estimator back. Per request it keeps the
estimates of the adaptive estimator that schedules and of a static one beside it (``B = 1``), both
counted in the run's unit, and the latency the paper measures: arrival to finish, or to the end
of the request's batch on a static-batch worker ("every request gets the batch's wall time").
With a drain the stress phase starts ``drain_s`` after the generator, looking every ``poll_s``
from its last calibration request, first sees the queue empty (no request waiting to be taken: a
rejected one does not wait).
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
from fairlib.chapters.driftsched_protocol import (EARLIER, OUTPUT_TOKENS, PAPER, PHASES, PROMPT_WORDS, Protocol,
                                                  protocol_requests)
from fairlib.client import build_schedule, run
from fairlib.drift import TIERS, DriftEstimator
from fairlib.gateway import FAIRNESS_HEADERS, GatewayProcess
from fairlib.records import load_run
from fairlib.sim import loop
from fairlib.sim.engine import Engine
from fairlib.sim.online import OnlineEngine
from fairlib.sim import state

__all__ = ["PHASES", "PROMPT_WORDS", "OUTPUT_TOKENS", "Protocol", "PAPER", "EARLIER", "POLICIES", "ENGINES", "l4_engines", "protocol_requests", "run_protocol",
           "error_table", "latency_table", "tier_table", "kendall_tau", "LIVE_TENANTS", "LIVE_SCALE", "mean_cost_ms",
           "live_requests", "live_workload", "measure_live", "chapter_runs", "live_table", "saved_live", "save_live",
           "run_steps", "run_steps_engine", "step_table"]

#: the five schedulers of the paper, as the simulator's policies (tiers as classes 0/1/2)
POLICIES: dict[str, tuple[str, dict]] = {
    "FIFO": ("fcfs", {}), "Priority": ("priority", {}), "Weighted 50/30/20": ("weighted", {"w": [5, 3, 2]}),
    "SJF": ("sjf", {}), "Aging": ("aging", {"rate": 0.01})}


def l4_engines(step_factor: float = 1.0) -> dict:
    """The paper's NVIDIA L4 serving Qwen1.5-1.8B in fp16, as the engine model sees it: a decode
    step is bound by reading the 3.6 GB of weights at the L4's 300 GB/s, 12 ms, plus 0.2 ms per
    sequence, both times ``step_factor`` (the paper's worker runs vLLM with ``enforce_eager``: no
    CUDA graphs, every kernel launched from Python at every step); a prompt token costs 2 x 1.8e9
    FLOPs, at half the L4's 121 dense fp16 TFLOPs (a typical prefill utilisation) 0.06 ms; the
    worker's batches of 32 (static: DriftSched's) or continuous batching of 32."""
    f = float(step_factor)
    if not (math.isfinite(f) and f > 0):
        raise ValueError(f"step_factor must be a finite number > 0, got {step_factor!r}")
    base = Engine(12.0 * f, 0.2 * f, 0.06, max_batch=32)
    return {"static": replace(base, batching="static", fill_wait_ms=10.0), "continuous": base}


#: the L4 engines at the step the card's bandwidth gives (step_factor 1)
ENGINES = l4_engines()


def run_protocol(requests: pd.DataFrame, engine: Engine, policy: str, params: Optional[dict] = None, *,
                 counting: str = "tokens", estimator: Optional[DriftEstimator] = None, oracle: bool = False,
                 sjf_key: str = "tokens") -> pd.DataFrame:
    """The requests through the engine model under ``policy``, the estimator in the loop (the
    module's docstring). ``counting``: ``"tokens"`` (the tokenizer: prompt and answer lengths in
    tokens) or ``"words"`` (the whitespace proxy). ``oracle``: SJF keys on the true answer instead
    of the estimate (the estimates are still made and recorded). ``sjf_key``: what SJF orders by,
    ``"tokens"`` (the estimated total budget, prompt + answer, the paper's) or ``"machine"`` (the
    estimated machine time on this engine, ``prefill * prompt_tokens + answer * per_seq(max_batch)``
    in microseconds: chapter 1's residency). Returns the requests with ``arrival_ms`` as sent (a
    drained protocol's stress phase moved to its start), ``est`` (the adaptive
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
        done = (S.RI[state.STATUS, :k] != state.RUNNING) & ~np.isnan(S.RF[state.FINISH, :k]) & ~fed[:k]
        if not done.any():
            return
        back = S.RF[state.FINISH, :k].copy()
        if static_mode:              # a batch's results return when its last request finishes
            adm = S.RF[state.ADMITTED, :k]
            for a in np.unique(adm[done]):
                members = adm == a
                if np.isnan(S.RF[state.FINISH, :k][members]).any():
                    done &= ~members            # its batch still runs
                else:
                    back[members] = S.RF[state.FINISH, :k][members].max()
        ids = np.flatnonzero(done & (back <= upto_ms))
        for r in ids[np.lexsort((ids, back[ids]))]:
            est.observe(cats[r], TIERS[tiers[r]], float(act[r]))
            fed[r] = True

    pid, arr = eng.policy.pid, requests["arrival_ms"].to_numpy(float, copy=True)
    drain_ms, poll_ms = _drain_of(requests)
    stress = np.flatnonzero(requests["phase"].to_numpy() == "stress") if "phase" in requests else np.array([], int)
    for r in range(n):
        if drain_ms is not None and len(stress) and r == stress[0] and r > 0:
            t = float(arr[r - 1])             # the generator looks at the queue after its last request
            while True:
                loop.run(eng.S, eng.E, pid, eng.pf, eng.pi, t)
                st = eng.S.RI[state.STATUS, :eng.n_requests]
                if not np.isin(st, (state.UNDELIVERED, state.WAITING, state.HELD)).any():
                    break                     # nothing queued (taken, rejected or withdrawn): empty
                t += poll_ms
            gaps = requests["gap_ms"].to_numpy(float)[r:]
            arr[r:] = t + drain_ms + np.cumsum(gaps)
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
    out["arrival_ms"] = arr
    out["est"], out["est_static"], out["actual"], out["bias"] = est_a, est_s, act, bias
    out["admitted_ms"] = S.RF[state.ADMITTED, :n]
    fin = S.RF[state.FINISH, :n].copy()
    if static_mode:
        adm = S.RF[state.ADMITTED, :n]
        ends = pd.Series(fin).groupby(adm).transform("max").to_numpy()
        fin = ends
    out["finish_ms"] = fin
    out["e2e_s"] = (fin - arr) / 1e3
    out["policy"] = policy
    return out


def _drain_of(requests: pd.DataFrame) -> tuple:
    """``(drain_ms, poll_ms)`` of a protocol's requests (``drain_s`` and ``poll_s`` columns), or
    ``(None, None)`` for phases back to back."""
    if "drain_s" not in requests or requests["drain_s"].isna().all():
        return None, None
    d = requests["drain_s"].dropna().unique()
    p = requests["poll_s"].dropna().unique() if "poll_s" in requests else np.array([2.0])
    if len(d) != 1 or len(p) != 1 or "gap_ms" not in requests:
        raise ValueError("a drained protocol's requests need one drain_s, one poll_s and gap_ms per request")
    return 1e3 * float(d[0]), 1e3 * float(p[0])


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


def live_requests(seed: int, live_engine: Engine, scale: float = LIVE_SCALE, protocol: Protocol = EARLIER) -> tuple:
    """``(requests, stretch)``: the protocol with ``scale`` times its requests in each phase, its
    arrivals stretched by ``stretch = cost on live_engine / cost on the continuous L4 model`` (the
    live engine sees the load, relative to its capacity, that the L4 model sees). Live, the client
    sends one schedule: the chapter's first protocol (:data:`EARLIER`), whose phases run back to
    back, is what the saved live runs measured."""
    if protocol.drain_s is not None:
        raise ValueError(f"a live run sends one schedule: protocol {protocol.name!r} drains between its phases")
    n_cal = max(1, int(round(PHASES[0][1] * scale)))
    n_stress = max(1, int(round(PHASES[1][1] * scale)))
    req = protocol_requests(seed, n_cal=n_cal, n_stress=n_stress, protocol=protocol)
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
            str(int(fit["engine"]["max_batch"])), "--tenants", str(tenants), "--estimator", counting,
            "--events", "--access-log", "off", "--tenant-max-share", "1"]   # the run's steps: the event log
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
                                       "seed": int(s), "scale": scale, "stretch": stretch,
                                       "protocol": EARLIER.name}, **(extra or {})}
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
        if d.get("protocol", EARLIER.name) != EARLIER.name:      # runs before the key: the first protocol
            raise ValueError(f"live run {r.path}: protocol {d['protocol']!r}, live runs are {EARLIER.name!r}")
        req, _ = live_requests(d["seed"], Engine(**r.extra["sim_engine"]), d["scale"])
        sim = run_protocol(req, Engine(**r.extra["sim_engine"]), d["policy"], d["params"], counting=d["counting"])
        sim_steps = run_protocol(req, run_steps_engine(r), d["policy"], d["params"], counting=d["counting"])
        rec = r.records.sort_values("request_id").reset_index(drop=True)
        e2e = (rec["end_s"] - rec["actual_send_s"]).astype(float).to_numpy()
        ok = (rec["error_class"] == "none").to_numpy()
        st = json.loads((Path(r.path) / "gateway.json").read_text())
        for src, lat, _bias in (("measured", e2e, (st.get("estimator") or {}).get("bias", {})),
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
    if not endpoint:
        raise ValueError("backend='http' needs endpoint (the OpenAI base URL of the engine, e.g. http://127.0.0.1:8000/v1)")
    fitmod.fit_for_endpoint(fit_file, endpoint, engine_kind, model)
    return measure_live(endpoint, engine_kind, fit_file or fitmod.fit_data_path(engine_kind), policies=policies,
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
