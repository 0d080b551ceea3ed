"""Chapter 8's live runs and their simulations: the engines' request settings and fitted models, the
scenarios at capacity-relative load, running and saving live runs, the simulation of a live run on
the same schedule, and chapter 1 (seed 000) on a real engine."""
from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from fairlib import analysis as an
from fairlib import paths
from fairlib.kinds import REAL_ENGINES, EngineKind
from fairlib.backend import HttpOptions, resolve_model, run_scenario
from fairlib.calibrate import fit as fitmod
from fairlib.calibrate.fit import engine_at, mean_decode_context
from fairlib.calibrate.identity import EXTRA_BODY
from fairlib.calibrate.lifecycle import ModelTokenizer, default_model
from fairlib.client import EndpointConfig
from fairlib.records import Run, load_run, simulate_run
from fairlib.records.rundir import write_gzip
from fairlib.scenarios import load
from fairlib.sim.engine import Engine
from fairlib.sim.policies import POLICIES


#: the engines the chapter measures (``fairlib.kinds.REAL_ENGINES``; ``fd.KINDS`` to the notebooks)
KINDS = REAL_ENGINES
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
    extra = dict(EXTRA_BODY.get(kind, {}))
    return EndpointConfig(base_url=base_url, model=model, ignore_eos=True,
                          send_priority=bool(priority and kind == EngineKind.VLLM), extra_body=extra,
                          timeout_s=timeout_s)


def model_tokenizer(kind: str):
    """The tiny model's tokenizer (exact token-id prompts), or ``None`` when it is not set up here."""
    m = default_model(kind)
    if m is None:
        return None
    folder = m if m.is_dir() else m.parent / m.stem
    return ModelTokenizer(folder) if (folder / "tokenizer.json").exists() else None


def fit_file(kind: str) -> Path:
    return fitmod.fit_data_path(kind)


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
            out.append(run_scenario(spec, seed, HttpOptions(run_dir=rd, endpoint_config=cfg, tokenizer=tokenizer,
                                                            server_policy=server_policy, config_extra=more)))
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


def store_run_files(r: Run, dst, gateway: bool = False) -> Path:
    """A live run's small files in ``dst``, what every chapter's recorder keeps: config, env,
    summary, the records (chunk times rounded to a microsecond, gzip-compressed:
    ``records.jsonl.gz``) and, for a run through the gateway, its event log (gzip-compressed) and
    state (``gateway.json``): required with ``gateway`` (``FileNotFoundError`` naming what is
    missing), kept when present otherwise."""
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for f in SAVED_FILES:
        src = r.dir / f
        if src.exists() and f == "records.jsonl":       # compacted, then compressed
            compact_records(src, dst / f)
            write_gzip(dst / f, dst / (f + ".gz"))
            (dst / f).unlink()
        elif src.exists():
            shutil.copyfile(src, dst / f)
    events, state = r.dir / "gateway_events.jsonl", r.dir / "gateway.json"
    missing = [p.name for p in (events, state) if not p.exists()]
    if gateway and missing:
        raise FileNotFoundError(f"{r.dir}: a run through the gateway without {', '.join(missing)}")
    if events.exists():
        write_gzip(events, dst / "gateway_events.jsonl.gz")
    if state.exists():
        shutil.copyfile(state, dst / "gateway.json")
    return dst


def save_runs(runs, kind: str, root: Optional[Path] = None) -> list:
    """The small files of live runs (:func:`store_run_files`) under
    ``data/runs/<kind>/<scenario>/seed<k>``."""
    root = Path(root) if root is not None else runs_root()
    return [store_run_files(r, root / kind / r.name / f"seed{r.seed}") for r in runs]


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
    # a cut (class "timeout") is the design here, so the 1% rule cannot judge the run; any other
    # failure raises (check_cut_run)
    run = run_scenario(spec, seed, HttpOptions(run_dir=run_dir, endpoint_config=replace(cfg, timeout_s=spec.duration_s),
                                               tokenizer=tokenizer, server_policy="fcfs", config_extra=more,
                                               max_error_rate=1.0))
    check_cut_run(run)
    return run


#: What a request of a run cut at its window may end as: answered, cut at the window, or turned
#: away by a policy's admission (429)
CUT_RUN_CLASSES = ("none", "timeout", "http_429")


def check_cut_run(run: Run) -> None:
    """Raise when a request of ``run`` (cut one window after it was sent, the 1% bound lifted)
    failed other than by the window's cut or a 429: an error answer or a broken stream, which the
    lifted bound must not hide. An engine that stalls shows as cuts and is not caught here (the
    records' first tokens per tenant show it)."""
    ec = run.records["error_class"]
    bad = ec[~ec.isin(CUT_RUN_CLASSES)]
    if len(bad):
        msgs = run.records.loc[bad.index, "error_message"].dropna().unique()[:3]
        raise RuntimeError(f"{run.path}: {len(bad)} request(s) failed other than by the window's cut "
                           f"({dict(bad.value_counts())}): {list(msgs)}")


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
    assert sim.sim is not None   # a simulated run carries its SimResult
    exact = sim.sim.tenants.set_index("name")["share"].reindex(names)
    out = pd.DataFrame({"measured, prefill split": 100 * ms["share"], "simulated, prefill split": 100 * ss["share"],
                        "measured, prefill priced": 100 * mf["share"], "simulated, prefill priced": 100 * sf["share"],
                        "simulator's exact charge": 100 * exact}, index=pd.Index(names, name="tenant"))
    out["difference, split (points)"] = out["measured, prefill split"] - out["simulated, prefill split"]
    out["difference, priced (points)"] = out["measured, prefill priced"] - out["simulated, prefill priced"]
    out.attrs["measured_prefill_fit"] = mf.attrs.get("fit")
    out.attrs["requests"] = len(run.records)
    return out
