"""Simulator fidelity on real engines (chapter 8): the same scenarios measured live and simulated
with the engine's fitted cost model, compared per tenant.

    from fairlib.chapters import fidelity as fd
    runs = fd.load_saved("vllm")                           # data/runs/vllm/<scenario>/seed<k>
    pairs = fd.simulate_pairs(runs)                        # (measured, simulated) per run
    table = fd.compare_all(pairs)                          # per tenant: measured, predicted, error
    fd.error_summary(table, valid_only=True)               # the error table, valid runs only
    fd.sensitivity(runs)                                   # each error with one parameter scaled

**One schedule.** A live run records the scenario it ran (``config.json``: the scenario, its seed,
the fitted engine that set its load, the engine the simulator runs and the policy the endpoint
ran). The fitted engine is the one at the scenario's mean decode context (:func:`scenario_spec`;
``fairlib.calibrate.fit.engine_at``). The simulation reloads the same scenario file with the recorded
engines, checks that the schedule is the one that was sent (every intended send time equal), and
runs it with the endpoint's policy (FCFS, or priority for vLLM started with
``--scheduling-policy priority``).

**Compared per tenant** (``fairlib.analysis``, one code path for both): the machine share (the
residency rebuilt from the stream timings, equal split, inside the load window), TTFT and E2E
p50/p99 over the completed requests, and the output throughput (tokens emitted in the load window
per second). Errors: share in percentage points, latencies and throughput relative to the
measured value, ``(predicted - measured) / measured``. A run is valid when the client kept its
schedule (p99 send lag within the threshold); the chapter's figures use the valid runs only
(``valid_only=True``; the default keeps every row). ``seed000`` runs (the blog post's scenario) are
cut after their window, so they are compared on share and throughput only.

**Sensitivity** (:func:`sensitivity`): every run simulated again with one fitted parameter scaled
(``iter_base``, ``iter_slope``, ``prefill``), to show which errors test the cost model.

**Live runs** sample ``/metrics`` from a child process (``fairlib.client.prom``: the raw text saved
as it comes, parsed after the run) and keep connections alive. The saved runs predate that: the
scraper then parsed on the send loop and stalled it against vLLM by up to 1.3 s, so they were
recorded without sampling (``scrape_metrics`` false in their ``config.json``). Recorded runs
(:func:`record`, ``python -m fairlib.chapters.fidelity record KIND``) also wait for a quiet machine, run
the engine a few nice steps below the client, and save the machine's load average with each run. They use an
engine's own request settings (:func:`endpoint_config`: vLLM's
``return_token_ids`` and priorities, llama.cpp's ``cache_prompt: false``) and token-id prompts
of exact length in the tiny model's vocabulary (:func:`model_tokenizer`).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from fairlib import analysis as an
from fairlib import paths
from fairlib.backend import resolve_model, run_scenario
from fairlib.calibrate import fit as fitmod
from fairlib.calibrate.fit import engine_at, mean_decode_context
from fairlib.calibrate.lifecycle import ModelTokenizer, default_model, nice_of, sched_of
from fairlib.chapters import published
from fairlib.client import EndpointConfig
from fairlib.records import Run, load_run, simulate_run
from fairlib.records.rundir import records_path, write_gzip
from fairlib.scenarios import load
from fairlib.sim.engine import Engine
from fairlib.sim.policies import POLICIES

__all__ = ["KINDS", "SCENARIOS", "GOALS", "CHECKS", "runs_root", "endpoint_config", "model_tokenizer",
           "fit_file", "fitted_engine", "scenario_spec", "load_specs", "run_live", "save_runs", "load_saved", "sim_spec",
           "simulate_pairs", "compare", "compare_all", "error_summary", "goal_table", "check", "published_table",
           "seed000_spec", "seed000_live", "seed000_compare", "SEED000_SHARE_PTS", "SAVED_FILES", "STORED_FILES", "record", "fit_points",
           "scenario_table", "live_validity_table", "LIVE_VALIDITY_COLUMNS", "RECORD_SCENARIOS", "SAVED_SCENARIOS",
           "RECORD_SEEDS", "RECORD_DURATION_S", "RECORD_SEED000_S", "simulate_live", "STALL_GAP_MS", "STALL_REPEAT",
           "STALL_BURST_MS", "loadavg", "compact_records", "check_same_schedule", "wait_quiet",
           "METRICS", "LATENCY_METRICS", "METRIC_LABELS", "both_ways", "sensitivity", "SENSITIVITY_PARAMS",
           "SENSITIVITY_FACTORS", "PARAM_LABELS", "idle_ttft", "ENGINE_COLOURS", "OTHER_ENGINE_COLOUR", "fit_chart", "crosscheck_table",
           "valid_rows", "long_errors", "scenario_errors", "scenario_error_chart", "scatter_chart",
           "sensitivity_table", "sensitivity_chart", "stalls", "run_costs"]

KINDS = ("vllm", "llamacpp")
SCENARIOS = ("fair_share", "noisy_neighbor", "victim_baseline", "slo_mix", "overload")
#: The issue's goals: share within 2 points, E2E p50 within 10%, TTFT p50 within 20%.
GOALS = {"share_pts": 2.0, "e2e_p50_pct": 10.0, "ttft_p50_pct": 20.0}
#: Regression bounds asserted on the saved runs (the chapter) and on fresh runs (the tests), the
#: same for both: the medians over tenants and the worst tenant. Wider than the goals: this 2-core
#: machine shares its cores between client, server and engine (see chapter 8). The worst share
#: error grows with the rows it is taken over: 6.1 points among the 57 tenant rows of llama.cpp's
#: saved runs (noisy_neighbor, the batch tenant), hence 8.
CHECKS = {"share_pts_max": 8.0, "share_pts_median": 3.0, "e2e_p50_pct_median": 35.0, "ttft_p50_pct_median": 60.0,
          "throughput_pct_median": 15.0}
#: Chapter 1 on a real engine: the measured residency split within this many points of the
#: simulated one, for every tenant, asserted on the saved run; a fresh 20-s window is reported
#: against it (its noise is wider: the real-engine tests' CH1_LIVE_BOUNDS).
SEED000_SHARE_PTS = 4.0
#: What a saved run keeps of a run directory (server_metrics.jsonl is left out: it is large).
SAVED_FILES = ("records.jsonl", "summary.json", "config.json", "env.json")
#: what a saved run directory holds: the same files, the records compressed (``save_runs``)
STORED_FILES = ("records.jsonl.gz", "summary.json", "config.json", "env.json")


def runs_root() -> Path:
    return paths.data_path("runs")


# --- live runs ------------------------------------------------------------------------------------
def endpoint_config(kind: str, base_url: str, model: Optional[str] = None, *, priority: bool = True,
                    timeout_s: float = 600.0):
    """The request settings ``fairlib.calibrate.lifecycle`` uses for an engine of ``kind`` (for an endpoint
    started elsewhere): vLLM ``return_token_ids`` (+ ``priority`` when it runs
    ``--scheduling-policy priority``), llama.cpp ``cache_prompt: false``; ``ignore_eos`` on both."""
    model = model or resolve_model(base_url)
    extra = {"vllm": {"return_token_ids": True}, "llamacpp": {"cache_prompt": False}}.get(kind, {})
    return EndpointConfig(base_url=base_url, model=model, ignore_eos=True, send_priority=bool(priority and kind == "vllm"),
                          extra_body=extra, timeout_s=timeout_s)


def model_tokenizer(kind: str):
    """The tiny model's tokenizer (exact token-id prompts), or ``None`` when it is not set up here."""
    m = default_model(kind)
    if m is None:
        return None
    folder = m if m.is_dir() else m.parent / m.stem
    return ModelTokenizer(folder) if (folder / "tokenizer.json").exists() else None


def fit_file(kind: str) -> Path:
    return fitmod.data_path(kind)


def fitted_engine(fit, context: Optional[float] = None) -> Engine:
    """The fitted engine model at a decode context (default the fit's reference context)."""
    return engine_at(fit, context)


def _load(name, engine: Engine, duration_s):
    return load(name, capacity={"engine": engine.to_dict()}, duration_s=duration_s)


def scenario_spec(fit, name: str, duration_s: Optional[float] = None) -> tuple:
    """``(spec, info)``: scenario ``name`` with the fitted engine at the scenario's own mean decode
    context (``fairlib.calibrate.fit.mean_decode_context``, two fixed-point steps: the context sets the
    slope, the slope the rates, the rates the mix). The load is relative to that engine's
    capacity. A baseline scenario (``victim_baseline``) keeps the rates its base scenario has
    (the same requests), and is simulated at its own context. ``info``: the contexts and both
    engines (``load_engine`` set the rates, ``sim_engine`` is what the simulator runs)."""

    base_name = name
    probe_spec = _load(name, fitted_engine(fit), duration_s)
    if probe_spec.baseline_of:
        base_name = probe_spec.baseline_of
    eng = fitted_engine(fit)
    for _ in range(2):
        ctx = mean_decode_context(_load(base_name, eng, duration_s))
        eng = fitted_engine(fit, ctx)
    load_engine = eng
    spec = _load(name, load_engine, duration_s)
    own_ctx = mean_decode_context(spec)
    sim_engine = fitted_engine(fit, own_ctx)
    if sim_engine != load_engine:
        spec = replace(spec, scenario=replace(spec.scenario, engine=sim_engine))
    info = {"decode_context": own_ctx, "load_context": ctx, "load_engine": load_engine.to_dict(),
            "sim_engine": sim_engine.to_dict()}
    return spec, info


def load_specs(fit, names: Optional[Sequence[str]] = None, duration_s: Optional[float] = None) -> list:
    """``[(spec, info)]`` of :func:`scenario_spec` for each scenario (default :data:`SCENARIOS`)."""
    return [scenario_spec(fit, n, duration_s) for n in (names or SCENARIOS)]


def loadavg() -> Optional[float]:
    """The machine's 1-minute load average as a run starts (recorded with the run)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def run_live(specs, seeds, cfg, runs_dir, *, kind: str, tokenizer=None, fit_info: Optional[dict] = None,
             server_policy: Optional[str] = None, extra: Optional[dict] = None) -> list:
    """Every ``(spec, info)`` x seed sent to ``cfg`` (an ``EndpointConfig``); run directories
    ``runs_dir/<scenario>/seed<k>``. The engines and contexts (``info``) and the engine kind go
    into each run's config. ``server_policy``: what the endpoint schedules with, recorded for the
    simulation (default: ``priority`` when the endpoint is sent priorities, i.e. vLLM started with
    ``--scheduling-policy priority``, else ``fcfs``; llama.cpp has no priority scheduling).
    ``extra``: more to record in each run's config."""
    if server_policy is None:
        server_policy = "priority" if cfg.send_priority else "fcfs"
    out = []
    for spec, info in specs:
        for seed in seeds:
            rd = Path(runs_dir) / spec.name / f"seed{seed}"
            more = {"engine_kind": kind, **info, "fit": fit_info or {}, "loadavg_1m": loadavg(), **(extra or {})}
            out.append(run_scenario(spec, seed, "http", run_dir=rd, endpoint_config=cfg, tokenizer=tokenizer,
                                    server_policy=server_policy, config_extra=more, scrape_metrics=True))
    return out


def _round(v, digits: int):
    if isinstance(v, float):
        return round(v, digits) if math.isfinite(v) else v
    if isinstance(v, list):
        return [_round(x, digits) for x in v]
    if isinstance(v, dict):
        return {k: _round(x, digits) for k, x in v.items()}
    return v


def compact_records(src: Path, dst: Path, digits: int = 6) -> None:
    """``records.jsonl`` with its times rounded to a microsecond (the 16 digits JSON writes are
    below any clock's resolution; it halves the file). The intended send times stay exact: the
    simulation checks the schedule against them."""
    with open(src, encoding="utf-8") as fi, open(dst, "w", encoding="utf-8") as fo:
        for line in fi:
            if not line.strip():
                continue
            rec = json.loads(line)
            rec = {k: (v if k == "intended_send_s" else _round(v, digits)) for k, v in rec.items()}
            fo.write(json.dumps(rec, separators=(",", ":")) + "\n")


def save_runs(runs, kind: str, root: Optional[Path] = None) -> list:
    """Copy the small files of live runs to ``data/runs/<kind>/<scenario>/seed<k>`` (the records
    with their chunk times rounded to a microsecond, gzip-compressed: ``records.jsonl.gz``)."""
    root = Path(root) if root is not None else runs_root()
    paths = []
    for r in runs:
        dst = root / kind / r.name / f"seed{r.seed}"
        dst.mkdir(parents=True, exist_ok=True)
        for f in SAVED_FILES:
            src = Path(r.path) / f
            if src.exists() and f == "records.jsonl":       # compacted, then compressed
                compact_records(src, dst / f)
                write_gzip(dst / f, dst / (f + ".gz"))
                (dst / f).unlink()
            elif src.exists():
                shutil.copyfile(src, dst / f)
        paths.append(dst)
    return paths


def load_saved(kind: str, names: Optional[Sequence[str]] = None, seeds: Optional[Sequence[int]] = None,
               root: Optional[Path] = None) -> list:
    """The saved live runs of one engine (every seed found, or ``seeds``)."""
    root = (Path(root) if root is not None else runs_root()) / kind
    out = []
    for n in names or SCENARIOS:
        d = root / n
        if not d.exists():
            raise FileNotFoundError(f"no saved runs of {n!r} on {kind} under {d}")
        found = sorted(d.glob("seed*"), key=lambda p: int(p.name[4:]))
        for p in found:
            if seeds is None or int(p.name[4:]) in [int(s) for s in seeds]:
                out.append(load_run(p))
    return out


# --- the simulation of a live run -----------------------------------------------------------------
def sim_spec(run: Run):
    """The scenario of a live run: loaded with the engine that set its rates, simulated with the
    engine of its own context (both recorded in its config)."""

    load_eng = run.extra.get("load_engine") or run.scenario.get("engine")
    if not load_eng:
        raise ValueError(f"run {run.path}: its config records no engine")
    spec = load(run.name, capacity={"engine": load_eng}, duration_s=run.scenario["duration_s"])
    sim_eng = run.extra.get("sim_engine")
    if sim_eng:
        spec = replace(spec, scenario=replace(spec.scenario, engine=Engine(**sim_eng)))
    return spec


def check_same_schedule(run: Run, spec) -> None:
    req = spec.requests(run.seed)
    sent = np.sort(pd.to_numeric(run.records["intended_send_s"]).to_numpy(float))
    if len(sent) != len(req) or not np.allclose(sent, np.sort(req["arrival_ms"].to_numpy(float)) / 1e3,
                                                rtol=0, atol=1e-6):
        raise ValueError(f"run {run.path}: its schedule is not the scenario's ({len(sent)} vs {len(req)} requests): "
                         "the scenario file or the fitted engine changed since it was measured")


def simulate_live(run: Run, engine: Optional[Engine] = None, *, check_schedule: bool = True) -> Run:
    """The simulation of one live run: its schedule under the policy the endpoint ran, with the
    engine recorded with the run (or ``engine``: a perturbed cost model, :func:`sensitivity`)."""

    spec = sim_spec(run)
    if engine is not None:
        spec = replace(spec, scenario=replace(spec.scenario, engine=engine))
    policy = run.extra.get("policy") if run.extra.get("policy") in POLICIES else spec.policy
    if check_schedule:
        check_same_schedule(run, spec)
    sim = simulate_run(spec, run.seed, policy)
    sim.config["extra"]["policy"] = policy
    return sim


def simulate_pairs(runs: Sequence[Run]) -> list:
    """``(measured, simulated)`` for each live run: the same schedule in the simulator, under the
    policy the endpoint ran (recorded with the run: FCFS, or priority for vLLM started with
    ``--scheduling-policy priority``), run until every request finished. Raises if the schedules
    differ."""
    return [(r, simulate_live(r)) for r in runs]


#: The metrics compared, latencies first. Share in points, the others relative (%).
METRICS = ("e2e_p50_ms", "e2e_p99_ms", "ttft_p50_ms", "ttft_p99_ms", "throughput_tok_s", "share_pct")
LATENCY_METRICS = ("e2e_p50_ms", "e2e_p99_ms", "ttft_p50_ms", "ttft_p99_ms")
#: Display names of the metrics (tables and charts).
METRIC_LABELS = {"e2e_p50_ms": "E2E p50", "e2e_p99_ms": "E2E p99", "ttft_p50_ms": "TTFT p50",
                 "ttft_p99_ms": "TTFT p99", "throughput_tok_s": "throughput", "share_pct": "machine share"}


def _tenant_metrics(run: Run, n_boot: int = 0) -> pd.DataFrame:
    """Per tenant: share (load window), TTFT/E2E p50/p99 over the completed requests, throughput.
    A run whose requests were cut (``cut_after_s``: seed000 at 3x overload) has no latencies:
    what completed there depends on the cut, which the simulator does not make."""
    names = run.tenant_names
    lat = an.latency_wide(an.latency(run.records, names, qs=(50, 99), n_boot=max(n_boot, 1)))
    res = an.residency(run, "load", names)
    tok = an.token_service(run, "load", names)
    out = pd.DataFrame(index=pd.Index(names, name="tenant"))
    out["share_pct"] = 100 * res["share"]
    out["ttft_p50_ms"], out["ttft_p99_ms"] = lat["ttft_p50"], lat["ttft_p99"]
    out["e2e_p50_ms"], out["e2e_p99_ms"] = lat["e2e_p50"], lat["e2e_p99"]
    if run.extra.get("cut_after_s") is not None:
        out[list(LATENCY_METRICS)] = math.nan
    out["throughput_tok_s"] = tok["output_tokens"] / run.duration_s
    ok = run.records["error_class"] == "none"
    out["requests"] = run.records.groupby("tenant_name").size().reindex(names).fillna(0).astype(int)
    out["completed"] = run.records[ok].groupby("tenant_name").size().reindex(names).fillna(0).astype(int)
    return out


def _errors(m: pd.DataFrame, s: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame(index=m.index)
    out["requests"] = m["requests"]
    out["completed"] = m["completed"]
    for k in METRICS:
        out[f"{k}_measured"] = m[k]
        out[f"{k}_predicted"] = s[k]
        if k == "share_pct":
            out[f"{k}_err"] = s[k] - m[k]
        else:
            out[f"{k}_err"] = 100 * (s[k] - m[k]) / m[k]
    return out


def compare(measured: Run, simulated: Run) -> pd.DataFrame:
    """One row per tenant: ``<metric>_measured``, ``<metric>_predicted`` and ``<metric>_err``
    (share: points; the others: % of the measured value), and ``valid`` (the live run's schedule
    held: p99 send lag within its threshold)."""
    out = _errors(_tenant_metrics(measured), _tenant_metrics(simulated))
    out["valid"] = bool(measured.summary.get("valid", True))
    return out


def compare_all(pairs, kind: Optional[str] = None) -> pd.DataFrame:
    """:func:`compare` for every pair, stacked: index (engine, scenario, seed, tenant)."""
    parts = []
    for meas, sim in pairs:
        c = compare(meas, sim)
        k = kind or meas.extra.get("engine_kind") or "?"
        c.index = pd.MultiIndex.from_product([[k], [meas.name], [meas.seed], list(c.index)],
                                             names=["engine", "scenario", "seed", "tenant"])
        parts.append(c)
    return pd.concat(parts)


def _valid(table: pd.DataFrame, valid_only: bool) -> pd.DataFrame:
    if valid_only and "valid" in table:
        return table[table["valid"].astype(bool)]
    return table


def error_summary(table: pd.DataFrame, valid_only: bool = False) -> pd.DataFrame:
    """Per engine and metric (latencies first): median and mean absolute error over (scenario,
    seed, tenant) rows, the worst, and the signed median (bias); share in points, the others in
    %. ``valid_only``: only the rows of valid runs."""
    rows = []
    for eng, t in _valid(table, valid_only).groupby(level="engine", sort=False):
        for k in METRICS:
            e = t[f"{k}_err"].astype(float).dropna()
            a = e.abs()
            rows.append({"engine": eng, "metric": k, "unit": "points" if k == "share_pct" else "%",
                         "median |error|": a.median(), "mean |error|": a.mean(), "max |error|": a.max(),
                         "median error (bias)": e.median(), "n": int(e.size)})
    cols = ["engine", "metric", "unit", "median |error|", "mean |error|", "max |error|",
            "median error (bias)", "n"]
    return pd.DataFrame(rows, columns=cols).set_index(["engine", "metric"])


def both_ways(table: pd.DataFrame) -> pd.DataFrame:
    """Median |error| per engine and metric over every run and over the valid runs only, with
    the rows each counts."""
    a, v = error_summary(table), error_summary(table, valid_only=True)
    return pd.DataFrame({"unit": a["unit"], "all runs": a["median |error|"], "rows (all)": a["n"],
                         "valid runs only": v["median |error|"], "rows (valid)": v["n"]})


def goal_table(table: pd.DataFrame, valid_only: bool = False) -> pd.DataFrame:
    """Per engine: how many tenant rows meet each of the issue's goals (:data:`GOALS`)."""
    rows = []
    for eng, t in _valid(table, valid_only).groupby(level="engine", sort=False):
        for k, col, lim in ((f"E2E p50 within {GOALS['e2e_p50_pct']:g}%", "e2e_p50_ms_err", GOALS["e2e_p50_pct"]),
                            (f"TTFT p50 within {GOALS['ttft_p50_pct']:g}%", "ttft_p50_ms_err", GOALS["ttft_p50_pct"]),
                            (f"share within {GOALS['share_pts']:g} points", "share_pct_err", GOALS["share_pts"])):
            e = t[col].astype(float).dropna().abs()
            rows.append({"engine": eng, "goal": k, "rows meeting it": int((e <= lim).sum()), "rows": int(e.size),
                         "fraction": float((e <= lim).mean()) if e.size else math.nan})
    cols = ["engine", "goal", "rows meeting it", "rows", "fraction"]
    return pd.DataFrame(rows, columns=cols).set_index(["engine", "goal"])


def check(table: pd.DataFrame, valid_only: bool = False) -> dict:
    """The regression bounds (:data:`CHECKS`) per engine: ``{engine: {bound: (value, limit, ok)}}``.
    ``valid_only``: over the rows of valid runs only."""
    out = {}
    for eng, t in _valid(table, valid_only).groupby(level="engine", sort=False):
        share = t["share_pct_err"].abs()
        vals = {"share_pts_max": share.max(), "share_pts_median": share.median(),
                "e2e_p50_pct_median": t["e2e_p50_ms_err"].abs().median(),
                "ttft_p50_pct_median": t["ttft_p50_ms_err"].abs().median(),
                "throughput_pct_median": t["throughput_tok_s_err"].abs().median()}
        out[eng] = {k: (float(v), CHECKS[k], bool(v <= CHECKS[k])) for k, v in vals.items()}
    return out


#: The fitted parameters :func:`sensitivity` perturbs, and by how much.
SENSITIVITY_PARAMS = ("iter_base_ms", "iter_slope_ms", "prefill_ms_per_token")
SENSITIVITY_FACTORS = (0.5, 1.0, 1.5, 2.0)
PARAM_LABELS = {"iter_base_ms": "iter_base", "iter_slope_ms": "iter_slope",
                "prefill_ms_per_token": "prefill"}


def sensitivity(runs: Sequence[Run], params: Sequence[str] = SENSITIVITY_PARAMS,
                factors: Sequence[float] = SENSITIVITY_FACTORS, valid_only: bool = True) -> pd.DataFrame:
    """How each error moves when one fitted parameter is scaled: every live run simulated again
    with ``param x factor`` (the others as fitted; the same schedule) and compared. Long table:
    engine, parameter, factor, metric, median |error| and median error (bias) over the (scenario,
    seed, tenant) rows, share in points and the others in %."""
    runs = [r for r in runs if r.summary.get("valid", True) or not valid_only]
    if not runs:
        return pd.DataFrame(columns=["engine", "parameter", "factor", "metric", "unit",
                                     "median |error|", "median error (bias)"])
    measured = [_tenant_metrics(r) for r in runs]
    rows = []
    for p in params:
        for f in factors:
            if f == 1.0 and p != params[0]:
                continue
            parts = []
            for r, m in zip(runs, measured):
                eng = Engine(**(r.extra.get("sim_engine") or sim_spec(r).engine.to_dict()))
                eng = replace(eng, **{p: getattr(eng, p) * f})
                e = _errors(m, _tenant_metrics(simulate_live(r, eng, check_schedule=False)))
                e["engine"] = r.extra.get("engine_kind") or "?"
                parts.append(e)
            t = pd.concat(parts)
            for eng_kind, g in t.groupby("engine", sort=False):
                for k in METRICS:
                    e = g[f"{k}_err"].astype(float).dropna()
                    for pp in (params if f == 1.0 else [p]):
                        rows.append({"engine": eng_kind, "parameter": PARAM_LABELS.get(pp, pp), "factor": f,
                                     "metric": METRIC_LABELS[k], "unit": "points" if k == "share_pct" else "%",
                                     "median |error|": e.abs().median(), "median error (bias)": e.median()})
    return pd.DataFrame(rows)


def idle_ttft(fits: dict) -> pd.DataFrame:
    """The idle engine's time to first token per prompt length (the fit's single requests,
    medians) against the engine model's: one iteration with one sequence at that context plus
    ``prefill * P``. Positive: the model is slower than the engine."""
    rows = []
    for kind, d in fits.items():
        pre = d["fit"]["prefill"]
        for P, t in zip(pre["P"], pre["ttft_ms_median"]):
            eng = engine_at(d, float(P))
            model = float(eng.iteration_ms(1)) + eng.prefill_ms_per_token * float(P)
            lin = pre["linear"]["intercept"] + pre["linear"]["slope"] * float(P)
            rows.append({"engine": kind, "prompt tokens": int(P), "measured TTFT (ms)": t,
                         "model TTFT (ms)": model, "model - measured (ms)": model - t,
                         "prefill line residual (ms)": t - lin})
    return pd.DataFrame(rows).set_index(["engine", "prompt tokens"])


def published_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Ours next to the published fidelity of Vidur, BLIS and LLMServingSim
    (``data/published_figures.toml``, ch8.*), metric by metric where they say which."""
    vid = published.figure("ch8.vidur_error")["value"]
    blis = published.figure("ch8.blis_error")["value"]
    lss = published.figure("ch8.llmservingsim_error")["value"]
    rows = [{"simulator": "Vidur", "what": published.figure("ch8.vidur_error")["what"], "error (%)": vid},
            {"simulator": "BLIS", "what": "median E2E error (%)", "error (%)": blis[0]},
            {"simulator": "BLIS", "what": "mean TTFT error (%)", "error (%)": blis[1]},
            {"simulator": "LLMServingSim 2.0", "what": published.figure("ch8.llmservingsim_error")["what"],
             "error (%)": lss}]
    for eng in dict.fromkeys(summary.index.get_level_values("engine")):
        s = summary.loc[eng]
        rows += [{"simulator": f"fairlib on {eng}", "what": "median |E2E p50 error| over tenants (%)",
                  "error (%)": s.loc["e2e_p50_ms", "median |error|"]},
                 {"simulator": f"fairlib on {eng}", "what": "mean |TTFT p50 error| over tenants (%)",
                  "error (%)": s.loc["ttft_p50_ms", "mean |error|"]},
                 {"simulator": f"fairlib on {eng}", "what": "median |E2E p99 error| over tenants (%)",
                  "error (%)": s.loc["e2e_p99_ms", "median |error|"]}]
    return pd.DataFrame(rows)


def fit_points(fits: dict) -> pd.DataFrame:
    """The decode sweep of each fit, long: engine, context, B, measured median dt (ms) and the
    joint fit's dt at the same point (for a chart)."""
    rows = []
    for kind, d in fits.items():
        dec = d["fit"]["decode"]
        j = dec["joint"]
        for c, v in dec["per_context"].items():
            for b, m in zip(v["B"], v["dt_ms_median"]):
                rows.append({"engine": kind, "context": float(c), "B": b, "measured_ms": m,
                             "fitted_ms": j["iter_base_ms"] + (j["slope_0_ms"] + j["slope_ctx_ms_per_token"] * float(c)) * b})
    return pd.DataFrame(rows)


def scenario_table(runs: Sequence[Run]) -> pd.DataFrame:
    """Per live run: the engine, the scenario's mean decode context, the simulated engine's slope,
    the offered load, requests sent and the policy the endpoint ran."""
    rows = []
    for r in runs:
        sim = r.extra.get("sim_engine") or {}
        rows.append({"engine": r.extra.get("engine_kind"), "scenario": r.name, "seed": r.seed,
                     "decode context (tokens)": r.extra.get("decode_context"),
                     "iter_slope (ms)": sim.get("iter_slope_ms"),
                     # what this run's tenants offered: a baseline offers its victim's part of the
                     # scenario's rho (runs recorded before offered_load existed stored that as rho)
                     "rho": r.scenario.get("offered_load", r.scenario.get("rho")),
                     "load window (s)": r.duration_s, "requests": len(r.records),
                     "server policy": r.extra.get("policy")})
    return pd.DataFrame(rows).set_index(["engine", "scenario", "seed"])


#: The columns of ``fairlib.analysis.validity_table`` that :func:`live_validity_table` shows, and their names there.
LIVE_VALIDITY_COLUMNS = {"valid": "valid", "lag_p50_ms": "lag p50 (ms)", "lag_p99_ms": "lag p99 (ms)",
                         "lag_max_ms": "lag max (ms)", "requested_rps": "requested (req/s)",
                         "achieved_rps": "achieved (req/s)", "n_ok": "completed", "n_planned": "planned",
                         "errors": "errors"}


def live_validity_table(runs: Sequence[Run]) -> pd.DataFrame:
    """``fairlib.analysis.validity_table`` of live runs (valid: p99 schedule lag within the
    threshold; lag p50/p99/max (ms), requested and achieved send rate, requests completed and
    planned, the errors seen) under the names of :data:`LIVE_VALIDITY_COLUMNS`, with what only a
    live run records: the machine load as it started and the client's pauses seen in its streams
    (:func:`stalls`). Indexed by (engine, scenario, seed)."""
    runs = list(runs)
    v = an.validity_table(runs)[["scenario", "seed", *LIVE_VALIDITY_COLUMNS]].rename(columns=LIVE_VALIDITY_COLUMNS)
    v.insert(0, "engine", [r.extra.get("engine_kind") for r in runs])
    st = [stalls(r) for r in runs]
    v["machine load (1 min)"] = [r.extra.get("loadavg_1m", math.nan) for r in runs]
    v["client pauses"] = [x["n"] for x in st]
    v["client paused (ms)"] = [x["total_ms"] for x in st]
    return v.set_index(["engine", "scenario", "seed"])


#: What :func:`stalls` counts as a client pause: a gap of more than this many ms between token
#: chunks, after which one stream delivered this many chunks within this many ms.
STALL_GAP_MS, STALL_REPEAT, STALL_BURST_MS = 100.0, 3, 5.0


def stalls(run: Run, gap_ms: float = STALL_GAP_MS, repeat: int = STALL_REPEAT,
           burst_ms: float = STALL_BURST_MS) -> dict:
    """Pauses of the client seen in a live run's streams: gaps of more than ``gap_ms`` between
    consecutive token chunks of the whole run (all streams together) while a request was in
    flight, after which one stream delivered at least ``repeat`` chunks within ``burst_ms``
    (faster than any engine iteration here): the engine kept emitting while the client did not
    read, and the client then read what had queued up. A gap without that is the engine's (a
    long prefill, say). The simulator has no such pauses.
    ``{"n": count, "total_ms": sum of the gaps, "max_ms": the longest}``."""
    rec = run.records[run.records["error_class"] == "none"]
    ts, sid = [], []
    for k, ch in enumerate(rec["chunk_times_s"]):
        if isinstance(ch, (list, tuple)):
            ts.extend(ch)
            sid.extend([k] * len(ch))
    if len(ts) < 2:
        return {"n": 0, "total_ms": 0.0, "max_ms": 0.0}
    order = np.argsort(ts, kind="stable")
    t, sid = np.asarray(ts, float)[order], np.asarray(sid)[order]
    send = pd.to_numeric(run.records["actual_send_s"]).to_numpy(float)
    end = pd.to_numeric(run.records["end_s"]).to_numpy(float)
    gaps = []
    for i in np.flatnonzero(np.diff(t) * 1e3 > gap_ms):
        a, b = t[i], t[i + 1]
        if not np.any((send < a) & (end > b)):
            continue
        stop = int(np.searchsorted(t, b + burst_ms / 1e3, side="right"))
        if stop > i + 1 and np.bincount(sid[i + 1:stop]).max() >= repeat:
            gaps.append((b - a) * 1e3)
    return {"n": len(gaps), "total_ms": float(math.fsum(gaps)), "max_ms": float(max(gaps, default=0.0))}


def run_costs(runs: Sequence[Run], valid_only: bool = True) -> pd.DataFrame:
    """The engine model fitted to each live run's own stream timings
    (``fairlib.analysis.fit_iteration_cost``: every tick's duration against its batch and the
    prompt tokens it started) beside the engine the simulator ran for it. Per run: engine,
    scenario, seed, and ``<parameter> (run)`` / ``<parameter> (fit)`` for iter_base, iter_slope and
    prefill, with the tick fit's R^2."""
    rows = []
    for r in runs:
        if valid_only and not r.summary.get("valid", True):
            continue
        f = an.fit_iteration_cost(r.records)
        sim = r.extra.get("sim_engine") or sim_spec(r).engine.to_dict()
        row = {"engine": r.extra.get("engine_kind"), "scenario": r.name, "seed": r.seed}
        for k, lab in PARAM_LABELS.items():
            row[f"{lab} (run)"], row[f"{lab} (fit)"] = f[k], sim[k]
        row["R2 (run)"] = f["r2"]
        rows.append(row)
    return pd.DataFrame(rows).set_index(["engine", "scenario", "seed"])


# --- chapter 8's tables and charts ----------------------------------------------------------------
#: One colour per engine in chapter 8's charts: none of the policy colours
#: (``fairlib.analysis.charts.POLICY_COLOURS``) nor the measured/simulated greys of chapter 7, so
#: that a colour names one thing across the book. Other categories of chapter 8's charts (the
#: decode context, the scaled parameter) are told apart by shape and dash, not by colour.
ENGINE_COLOURS = {"vllm": "#5e3c99", "llamacpp": "#b8860b"}
#: An engine outside :data:`ENGINE_COLOURS`.
OTHER_ENGINE_COLOUR = "#888888"
#: Dash patterns and point shapes for the categories drawn in one colour.
DASHES = ([1, 0], [6, 3], [2, 2], [8, 3, 2, 3])
SHAPES = ("circle", "square", "triangle-up", "diamond")


def _engine_scale(alt, kinds):
    kinds = list(kinds)
    return alt.Scale(domain=kinds, range=[ENGINE_COLOURS.get(k, OTHER_ENGINE_COLOUR) for k in kinds])


def fit_chart(fits: dict, alt):
    """The fitted lines against the measured iteration times, one panel per engine (in the
    engine's colour); the decode context by point shape and line dash."""
    pts = fit_points(fits)
    order = [f"{c:.0f} tokens" for c in sorted(pts["context"].unique())]
    pts["context"] = pts["context"].map(lambda c: f"{c:.0f} tokens")
    pts[["measured_ms", "fitted_ms"]] = pts[["measured_ms", "fitted_ms"]].round(3)
    kinds = list(dict.fromkeys(pts["engine"]))
    ctx = dict(sort=order, title="decode context")
    base = alt.Chart(pts).encode(
        x=alt.X("B:Q", title="running sequences B"),
        color=alt.Color("engine:N", scale=_engine_scale(alt, kinds), legend=None))
    y = alt.Y("measured_ms:Q", title="iteration (ms)")
    dots = base.mark_point(filled=True, size=45).encode(
        y=y, shape=alt.Shape("context:N", scale=alt.Scale(domain=order, range=list(SHAPES[:len(order)])), **ctx))
    lines = base.mark_line().encode(
        y="fitted_ms:Q", strokeDash=alt.StrokeDash(
            "context:N", scale=alt.Scale(domain=order, range=list(DASHES[:len(order)])), **ctx))
    chart = alt.layer(dots, lines).properties(width=260, height=200)
    return chart.facet(column=alt.Column("engine:N", title=None, sort=kinds)).properties(
        title="One iteration: measured (points) and the fitted line (lines)")


def crosscheck_table(fits: dict) -> pd.DataFrame:
    """The client's figures over each engine's own (per-token time, prefill slope) and the
    prefill's curvature (the quadratic's marginal cost at 256 and 768 prompt tokens)."""
    rows = []
    for k, d in fits.items():
        dec, pre = d["fit"]["decode"], d["fit"]["prefill"]
        hist = dec.get("server_histograms") or {}
        rows.append({"engine": k,
                     "per-token time, client / server (median)": dec["server"]["client_over_server_median"],
                     "server figure": dec["server"]["source"],
                     "prefill slope, client / server": pre["server"]["client_slope_over_server_slope"],
                     "prefill ms/token at P=256 (quadratic)": pre["quadratic"]["slope_at_256"],
                     "prefill ms/token at P=768 (quadratic)": pre["quadratic"]["slope_at_768"],
                     "vLLM /metrics mean ITL at B=16 (ms)":
                         (hist.get("mean_itl_ms_median_over_contexts") or [None])[-1]})
    return pd.DataFrame(rows).set_index("engine").T


def valid_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of :func:`compare_all` that come from valid runs."""
    return _valid(table, True)


def long_errors(table: pd.DataFrame, metrics: Sequence[str] = METRICS) -> pd.DataFrame:
    """The comparison table long: engine, scenario, seed, tenant, metric (display name), unit,
    measured, predicted, error, valid."""
    parts = []
    for k in metrics:
        part = table[[f"{k}_measured", f"{k}_predicted", f"{k}_err", "valid"]].reset_index()
        part.columns = ["engine", "scenario", "seed", "tenant", "measured", "predicted", "error", "valid"]
        parts.append(part.assign(metric=METRIC_LABELS[k], unit="points" if k == "share_pct" else "%"))
    return pd.concat(parts, ignore_index=True)


def scenario_errors(table: pd.DataFrame, metrics: Sequence[str] = ("e2e_p50_ms", "ttft_p50_ms"),
                    valid_only: bool = True) -> pd.DataFrame:
    """Median |error| over the tenants of each run: engine, scenario, seed, metric, value."""
    d = long_errors(_valid(table, valid_only), metrics).dropna(subset=["error"])
    d["abs"] = d["error"].abs()
    out = d.groupby(["engine", "scenario", "seed", "metric"], sort=False)["abs"].median()
    return out.rename("median |error|").reset_index()


def scenario_error_chart(table: pd.DataFrame, alt, metrics=("e2e_p50_ms", "ttft_p50_ms"),
                         valid_only: bool = True):
    """Per scenario and engine, the median |error| over tenants of each valid run (one point per
    random seed) and the median over seeds (a tick)."""
    d = scenario_errors(table, metrics, valid_only)
    d["median |error|"] = d["median |error|"].round(2)
    kinds = list(dict.fromkeys(d["engine"]))
    order = list(dict.fromkeys(d["scenario"]))
    enc = dict(y=alt.Y("scenario:N", sort=order, title=None),
               color=alt.Color("engine:N", scale=_engine_scale(alt, kinds), title="engine"),
               yOffset=alt.YOffset("engine:N", sort=kinds))
    pts = alt.Chart(d).mark_circle(size=38, opacity=0.75).encode(
        x=alt.X("median |error|:Q", title="median |error| over tenants (%)"), **enc)
    med = alt.Chart(d).mark_tick(thickness=2, size=12, color="black").encode(
        x="median(median |error|):Q", **enc)
    return alt.layer(pts, med).properties(width=250, height=alt.Step(11)).facet(
        column=alt.Column("metric:N", title=None, sort=[METRIC_LABELS[m] for m in metrics]))


def scatter_chart(table: pd.DataFrame, alt, metrics=("e2e_p50_ms", "ttft_p50_ms", "e2e_p99_ms"),
                  valid_only: bool = True):
    """Simulated against measured per tenant (valid runs), one panel per metric, log axes for
    latencies; the dashed diagonal is equality."""
    d = long_errors(_valid(table, valid_only), metrics).dropna(subset=["measured", "predicted"])
    d[["measured", "predicted"]] = d[["measured", "predicted"]].astype(float).round(2)
    kinds = list(dict.fromkeys(d["engine"]))
    panels = []
    for m in metrics:
        lab = METRIC_LABELS[m]
        x = d[d["metric"] == lab]
        share = m == "share_pct"
        lo = 0.0 if share else float(x[["measured", "predicted"]].min().min()) * 0.8
        hi = 100.0 if share else float(x[["measured", "predicted"]].max().max()) * 1.25
        sc = alt.Scale(type="linear" if share else "log", domain=[lo, hi], nice=False)
        ax = alt.Axis(tickCount=4, format="~s")
        unit = "(%)" if share else "(ms)" if m.endswith("_ms") else "(tokens/s)"
        pts = alt.Chart(x).mark_point(filled=True, size=30, opacity=0.7).encode(
            x=alt.X("measured:Q", scale=sc, axis=ax, title=f"measured {lab} {unit}"),
            y=alt.Y("predicted:Q", scale=sc, axis=ax, title="simulated"),
            color=alt.Color("engine:N", scale=_engine_scale(alt, kinds), title="engine"),
            shape=alt.Shape("scenario:N"))
        diag = alt.Chart(pd.DataFrame({"measured": [lo, hi]})).mark_line(
            color="gray", strokeDash=[4, 3]).encode(x=alt.X("measured:Q", scale=sc),
                                                     y=alt.Y("measured:Q", scale=sc))
        panels.append(alt.layer(diag, pts).properties(width=170, height=170))
    return alt.hconcat(*panels).properties(title="Simulated against measured, per tenant (dashed: equal)")


def sensitivity_table(sens: pd.DataFrame, engine: Optional[str] = None) -> pd.DataFrame:
    """:func:`sensitivity` as a grid: rows (engine, parameter, factor), columns the metrics
    (median |error|: share in points, the others in %)."""
    d = sens if engine is None else sens[sens["engine"] == engine]
    order = [METRIC_LABELS[m] for m in METRICS]
    t = d.pivot_table(index=["engine", "parameter", "factor"], columns="metric",
                      values="median |error|", sort=False)
    return t[[c for c in order if c in t.columns]]


def sensitivity_chart(sens: pd.DataFrame, alt):
    """Median |error| against the factor applied to each fitted parameter: one panel per metric
    (its own scale) and engine (in the engine's colour), one line per parameter (its own dash
    and point shape); factor 1 is the fit."""
    d = sens.copy()
    d["median |error|"] = d["median |error|"].astype(float).round(2)
    order = [METRIC_LABELS[m] for m in METRICS]
    params = list(dict.fromkeys(d["parameter"]))
    kinds = list(dict.fromkeys(d["engine"]))
    base = alt.Chart(d).encode(
        x=alt.X("factor:Q", title="parameter x factor", scale=alt.Scale(domain=[0.4, 2.1]),
                axis=alt.Axis(values=sorted(set(d["factor"])))),
        y=alt.Y("median |error|:Q", title="median |error|"),
        color=alt.Color("engine:N", scale=_engine_scale(alt, kinds), legend=None))
    key = dict(sort=params, title="scaled parameter")
    line = base.mark_line().encode(strokeDash=alt.StrokeDash(
        "parameter:N", scale=alt.Scale(domain=params, range=list(DASHES[:len(params)])), **key))
    pts = base.mark_point(filled=True, size=30).encode(shape=alt.Shape(
        "parameter:N", scale=alt.Scale(domain=params, range=list(SHAPES[:len(params)])), **key))
    return alt.layer(line, pts).properties(width=118, height=105).facet(
        column=alt.Column("metric:N", sort=order, title=None),
        row=alt.Row("engine:N", title=None, sort=kinds)
    ).resolve_scale(y="independent")


# --- chapter 1 on a real engine ------------------------------------------------------------------
def seed000_spec(fit, duration_s: float = 20.0) -> tuple:
    """``(spec, info)``: the blog post's scenario (``seed000``: prompts 387, geometric answers of
    23.7/48/177/353.8 tokens, equal offered machine time, 3x the replica together) on the fitted
    engine at its mean decode context: the rates scale with its capacity, the relative output lengths and the
    equal offered machine time stay."""
    return scenario_spec(fit, "seed000", duration_s)


def seed000_live(cfg, spec_info, seed: int, run_dir, *, kind: str, tokenizer=None, fit_info: Optional[dict] = None,
                 extra: Optional[dict] = None):
    """FCFS on a live engine: the schedule sent open-loop, each request cut ``duration_s`` after it
    was sent (at 3x overload FCFS never drains in a short run: a request cut at ``send +
    duration_s`` is cut after the load window, so the window is as if nothing were cut)."""

    spec, info = spec_info
    more = {"engine_kind": kind, **info, "fit": fit_info or {}, "cut_after_s": spec.duration_s,
            "loadavg_1m": loadavg(), **(extra or {})}
    return run_scenario(spec, seed, "http", run_dir=run_dir,
                        endpoint_config=replace(cfg, timeout_s=spec.duration_s),
                        tokenizer=tokenizer, server_policy="fcfs", config_extra=more, scrape_metrics=True)


def seed000_compare(run: Run) -> pd.DataFrame:
    """The residency split of a live run of ``seed000`` beside the simulator's on the same schedule
    with the fitted engine (FCFS, cut at the end of the load window), in %, inside the load window:
    rebuilt from the streams with prefill split equally (the definition) and with prefill priced
    by a cost fitted from the same streams (``fairlib.analysis.residency(..., prefill="fitted")``),
    and the simulator's exact residency charge (prefill charged to the request that caused it)."""
    spec = sim_spec(run)
    sim = simulate_run(spec, run.seed, "fcfs", horizon_ms=spec.duration_s * 1e3)
    names = run.tenant_names
    ms, ss = an.residency(run, "load"), an.residency(sim, "load")
    mf, sf = an.residency(run, "load", prefill="fitted"), an.residency(sim, "load", prefill="fitted")
    exact = sim.sim.tenants.set_index("name")["share"].reindex(names)
    out = pd.DataFrame({"measured, prefill split": 100 * ms["share"], "simulated, prefill split": 100 * ss["share"],
                        "measured, prefill priced": 100 * mf["share"], "simulated, prefill priced": 100 * sf["share"],
                        "simulator's exact charge": 100 * exact}, index=pd.Index(names, name="tenant"))
    out["difference, split (points)"] = out["measured, prefill split"] - out["simulated, prefill split"]
    out["difference, priced (points)"] = out["measured, prefill priced"] - out["simulated, prefill priced"]
    out.attrs["measured_prefill_fit"] = mf.attrs.get("fit")
    out.attrs["requests"] = len(run.records)
    return out


# --- recording the book's data ---------------------------------------------------------------------
#: What ``record`` measures by default: the five scenarios, ``prefill_mix`` and ``seed000``
#: (chapter 8's default on both backends: :data:`SAVED_SCENARIOS`), each for 30 s and seeds 0-2;
#: ``seed000`` keeps chapter 1's 20-s window.
RECORD_SCENARIOS = SCENARIOS + ("prefill_mix",)
SAVED_SCENARIOS = RECORD_SCENARIOS + ("seed000",)
RECORD_SEEDS = (0, 1, 2)
RECORD_DURATION_S = 30.0
RECORD_SEED000_S = 20.0


def _saved_run(root: Path, kind: str, name: str, seed: int) -> Optional[Run]:
    d = Path(root) / kind / name / f"seed{seed}"
    return load_run(d) if records_path(d).exists() and (d / "summary.json").exists() else None


def wait_quiet(max_load: Optional[float], max_wait_s: float, log) -> float:
    """Wait (up to ``max_wait_s``) until the machine's 1-minute load average is at most
    ``max_load``: on a shared machine a run started under a burst of other work is invalid (the
    client falls behind its schedule) or slowed. Returns the load when the run starts."""
    t0 = time.monotonic()
    load = os.getloadavg()[0]
    while max_load is not None and load > max_load and time.monotonic() - t0 < max_wait_s:
        time.sleep(5.0)
        load = os.getloadavg()[0]
    if max_load is not None and load > max_load:
        log(f"  load {load:.2f} still above {max_load:g} after {max_wait_s:g} s: measuring anyway")
    return load


def _wanted(root, kind, name, seeds, redo: str) -> list:
    """The seeds of ``name`` still to measure: ``redo="all"`` every one, ``"missing"`` those not
    saved, ``"invalid"`` those not saved or saved invalid."""
    out = []
    for s in seeds:
        r = None if redo == "all" else _saved_run(root, kind, name, s)
        if r is None or (redo == "invalid" and not r.summary.get("valid")):
            out.append(s)
    return out


def record(kind: str, *, refit: bool = True, duration_s: float = RECORD_DURATION_S,
           seeds: Sequence[int] = RECORD_SEEDS, names: Optional[Sequence[str]] = None,
           seed000_duration_s: float = RECORD_SEED000_S,
           seed000_seeds: Optional[Sequence[int]] = RECORD_SEEDS, redo: str = "all", work_dir=None,
           data_root: Optional[Path] = None, quiet_load: Optional[float] = 3.0, quiet_wait_s: float = 300.0,
           engine_nice: Optional[int] = None, fit_path=None, fit_settings: Optional[dict] = None,
           verbose: bool = True) -> dict:
    """Measure what the book keeps in ``data/`` for one engine: start it as the book does
    (``fairlib.calibrate.fit.start``), fit its cost model (``refit``; else use the saved fit
    ``data/engines/<kind>.json``), run the scenarios (default :data:`RECORD_SCENARIOS`) live for
    every seed and save their small files under ``data/runs/<kind>/<scenario>/seed<k>``; then the
    ``seed000`` runs (``seed000_seeds``, FCFS, cut ``seed000_duration_s`` after each send; chapter 1
    reads ``vllm/seed000/seed0``). ``redo``: ``"all"``, ``"missing"`` or ``"invalid"`` (measure
    again only the runs not saved, or saved invalid). ``data_root``: another ``runs`` folder.
    ``quiet_load``: before each run, wait up to ``quiet_wait_s`` for the 1-minute load average
    to fall to this (``None``: do not wait). ``engine_nice``: the engine runs this many nice
    steps below the client (default ``fairlib.calibrate.lifecycle.DEFAULT_NICE``; the nice value the kernel
    reports for the engine is recorded with each run as ``engine_nice``). The runs saved on
    2026-12-01 ran one step below the client.
    ``fit_path``: where the fit is read (and written with ``refit``) instead of
    ``data/engines/<kind>.json`` (the runs still name that file); ``fit_settings``: overrides of
    ``fairlib.calibrate.fit.DEFAULTS`` for the refit (e.g. more ``repeats`` on a noisy machine)."""

    log = print if verbose else (lambda *_: None)
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix=f"fairlib-record-{kind}-"))
    root = Path(data_root) if data_root is not None else runs_root()
    names = list(names or RECORD_SCENARIOS)
    out = {"kind": kind, "work_dir": str(work), "runs": []}
    todo = {n: _wanted(root, kind, n, seeds, redo) for n in names}
    todo0 = _wanted(root, kind, "seed000", seed000_seeds or (), redo)
    kept = sum(len(seeds) - len(v) for v in todo.values()) + len(seed000_seeds or ()) - len(todo0)
    if refit and kept:
        log(f"{kind}: refitting, but {kept} saved runs are kept: they were measured with the "
            "previous fit (use --no-refit with --redo missing|invalid)")
    if not any(todo.values()) and not todo0 and not refit:
        log(f"{kind}: nothing to measure")
        return out
    with fitmod.start(kind, nice=engine_nice) as eng:
        nice_now = nice_of(eng.pid)
        log(f"{kind} started in {eng.startup_s:.1f} s, at nice {nice_now}")
        ffile = Path(fit_path) if fit_path is not None else fitmod.data_path(kind)
        if refit:
            res = fitmod.fit_engine(eng, out=ffile, verbose=verbose, **(fit_settings or {}))
            log(f"fit: {json.dumps(res['fit']['summary'])}")
        fit = fitmod.load_fit(ffile)
        info = {"file": f"data/engines/{kind}.json", "date": fit.get("date")}
        cfg, tok = eng.endpoint_config(), eng.tokenizer()
        extra = {"engine_nice": nice_now, "engine_sched": sched_of(eng.pid)}
        for n in names:
            if not todo[n]:
                continue
            specs = load_specs(fit, [n], duration_s)
            for s in todo[n]:
                load = wait_quiet(quiet_load, quiet_wait_s, log)
                r = run_live(specs, [s], cfg, work / "runs", kind=kind, tokenizer=tok, fit_info=info,
                             extra=extra)[0]
                out["runs"] += [str(p) for p in save_runs([r], kind, root)]
                log(f"{kind} {n} seed {s} (load {load:.2f}): {r.summary['valid_reason']}, "
                    f"{r.summary['n_ok']}/{r.summary['n_planned']} ok")
        if todo0:
            s0 = seed000_spec(fit, seed000_duration_s)
            for s in todo0:
                load = wait_quiet(quiet_load, quiet_wait_s, log)
                r = seed000_live(cfg, s0, s, work / "seed000" / f"seed{s}", kind=kind, tokenizer=tok,
                                 fit_info=info, extra=extra)
                out["runs"] += [str(p) for p in save_runs([r], kind, root)]
                log(f"{kind} seed000 seed {s} (load {load:.2f}): {r.summary['valid_reason']}")
    return out


def main(argv=None) -> int:
    """``python -m fairlib.chapters.fidelity record vllm|llamacpp [--no-refit] [--duration-s 30]
    [--seeds 0 1 2] [--redo all|missing|invalid]``: what the book keeps in ``data/`` (the fit,
    then every scenario and seed000 live, 30 s windows, seeds 0-2)."""
    ap = argparse.ArgumentParser(prog="python -m fairlib.chapters.fidelity", description=main.__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="record the scenarios' live runs into data/runs (and refit)")
    r.add_argument("kind", choices=list(KINDS))
    r.add_argument("--no-refit", dest="refit", action="store_false",
                   help="keep data/engines/<kind>.json (default: fit it again first)")
    r.add_argument("--duration-s", type=float, default=RECORD_DURATION_S)
    r.add_argument("--seeds", type=int, nargs="+", default=list(RECORD_SEEDS))
    r.add_argument("--names", nargs="+", default=None, help=f"default: {' '.join(RECORD_SCENARIOS)}")
    r.add_argument("--seed000-seeds", type=int, nargs="*", default=list(RECORD_SEEDS))
    r.add_argument("--seed000-duration-s", type=float, default=RECORD_SEED000_S)
    r.add_argument("--redo", choices=["all", "missing", "invalid"], default="all")
    r.add_argument("--data-root", default=None, help="another runs folder (default data/runs)")
    r.add_argument("--quiet-load", type=float, default=3.0,
                   help="before each run, wait for the 1-minute load average to fall to this")
    r.add_argument("--quiet-wait-s", type=float, default=300.0)
    r.add_argument("--engine-nice", type=int, default=None,
                   help="run the engine this many nice steps below the client "
                        "(default: fairlib.calibrate.lifecycle.DEFAULT_NICE, 10)")
    r.add_argument("--fit-path", default=None, help="read (and, refitting, write) the fit here")
    r.add_argument("--fit-repeats", type=int, default=None, help="repeats of the refit's decode sweep")
    r.add_argument("--work-dir", default=None,
                   help="where the full run directories are written first (e.g. under /dev/shm)")
    a = ap.parse_args(argv)
    res = record(a.kind, refit=a.refit, duration_s=a.duration_s, seeds=a.seeds, names=a.names,
                 seed000_seeds=a.seed000_seeds, seed000_duration_s=a.seed000_duration_s, redo=a.redo,
                 data_root=a.data_root, quiet_load=a.quiet_load, quiet_wait_s=a.quiet_wait_s,
                 engine_nice=a.engine_nice, fit_path=a.fit_path,
                 fit_settings={"repeats": a.fit_repeats} if a.fit_repeats else None,
                 work_dir=a.work_dir)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
