"""Recording chapter 8's data: the live runs of every scenario and seed on a real engine, on a quiet
machine, saved under data/runs/<engine> (``python -m fairlib.chapters.fidelity record KIND``)."""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence


from fairlib.calibrate import fit as fitmod
from fairlib.calibrate.lifecycle import nice_of, sched_of
from fairlib.records import Run, load_run
from fairlib.records.rundir import records_path
from fairlib.progress import progress_line
from fairlib.chapters.fidelity_runs import (SCENARIOS, load_specs, run_live, runs_root, save_runs, seed000_live,
                                           seed000_spec)

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

    log = progress_line if verbose else (lambda *_: None)
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix=f"fairlib-record-{kind}-"))
    root = Path(data_root) if data_root is not None else runs_root()
    names = list(names or RECORD_SCENARIOS)
    out: dict = {"kind": kind, "work_dir": str(work), "runs": []}
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
        ffile = Path(fit_path) if fit_path is not None else fitmod.fit_data_path(kind)
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
