"""Recording chapters 1-4's saved runs (``data/runs/gateway/<engine>``): the engine started as the
book starts it, fitted on this machine, the policies measured through a gateway in front of it
(:mod:`fairlib.chapters.gateway_live` holds the measuring and the tables the chapters read).

``python scripts/record.py 1-4 vllm`` (or ``python -m fairlib.chapters.gateway_record record vllm``).
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from fairlib.calibrate import fit as fitmod
from fairlib.calibrate.lifecycle import nice_of, sched_of
from fairlib.chapters import fidelity as fd
from fairlib.chapters.gateway_live import (POLICY_KEYS, RECORD_DURATION_S, RECORD_SEEDS, LiveGateway,
                                           experiment_spec, fit_path_of, policies_for, run_policy, save_runs,
                                           saved_root)
from fairlib.progress import progress_line

__all__ = ["record", "main"]


def record(kind: str = "vllm", *, seeds: Sequence[int] = RECORD_SEEDS, duration_s: float = RECORD_DURATION_S,
           keys: Sequence[str] = POLICY_KEYS, data_root: Optional[Path] = None, refit: bool = True,
           redo: str = "all", quiet_load: Optional[float] = 3.0, work_dir=None, verbose: bool = True) -> list:
    """Start the engine as the book does (``fairlib.calibrate.fit.start``), fit its cost model on
    this machine (``refit``; else reuse :func:`fit_path_of`), put a gateway in front of it, measure
    every policy x seed and save the runs under :func:`saved_root` and the fit beside them.
    ``redo="missing"``: measure only the runs not saved yet (with the saved fit: no refit)."""
    if redo not in ("all", "missing"):
        raise ValueError(f"redo must be 'all' or 'missing', got {redo!r}")
    log = progress_line if verbose else (lambda *_: None)
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix=f"fairlib-gateway-{kind}-"))
    ffile = fit_path_of(kind, data_root)
    saved = []
    with fitmod.start(kind) as eng:
        log(f"{kind} started in {eng.startup_s:.1f} s")
        if refit:
            ffile.parent.mkdir(parents=True, exist_ok=True)
            res = fitmod.fit_engine(eng, out=ffile, verbose=verbose)
            log(f"fit: {json.dumps(res['fit']['summary'])}")
        fit = fitmod.load_fit(ffile)
        info = {"file": f"data/runs/gateway/{kind}/fit.json" if data_root is None else str(ffile),
                "date": fit.get("date")}
        cfg, tok = eng.endpoint_config(), eng.tokenizer()
        spec_info = experiment_spec(fit, duration_s)
        pols = policies_for(spec_info[0], keys)
        extra = {"engine_nice": nice_of(eng.pid), "engine_sched": sched_of(eng.pid)}
        with LiveGateway(cfg.base_url, ffile) as gw:
            for key, (pol, params) in pols.items():
                for s in seeds:
                    if redo == "missing" and (saved_root(kind, data_root) / key / f"seed{s}" / "gateway.json").exists():
                        continue
                    load = fd.wait_quiet(quiet_load, 300.0, log)
                    r = run_policy(gw, spec_info, s, key, pol, params, cfg, work / key / f"seed{s}", kind=kind,
                                   tokenizer=tok, fit_info=info, extra=extra)
                    saved += save_runs([r], kind, data_root)
                    log(f"{kind} {key} {params} seed {s} (load {load:.2f}): {r.summary['valid_reason']}; "
                        f"lag p99 {r.summary['schedule_lag_ms']['p99']:.2f} ms")
    return saved


def main(argv=None) -> int:
    """``python -m fairlib.chapters.gateway_record record vllm [--seeds 0 1 2] [--duration-s 30]``."""
    ap = argparse.ArgumentParser(prog="python -m fairlib.chapters.gateway_record", description=main.__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="measure the policies through the gateway into data/runs/gateway")
    r.add_argument("kind", choices=list(fd.KINDS))
    r.add_argument("--seeds", type=int, nargs="+", default=list(RECORD_SEEDS))
    r.add_argument("--duration-s", type=float, default=RECORD_DURATION_S)
    r.add_argument("--policies", nargs="+", default=list(POLICY_KEYS), choices=list(POLICY_KEYS))
    r.add_argument("--data-root", default=None)
    r.add_argument("--no-refit", dest="refit", action="store_false", help="reuse the saved fit.json")
    r.add_argument("--redo", choices=["all", "missing"], default="all",
                   help="missing: only the runs not saved yet (implies --no-refit)")
    r.add_argument("--quiet-load", type=float, default=3.0)
    a = ap.parse_args(argv)
    record(a.kind, seeds=a.seeds, duration_s=a.duration_s, keys=a.policies,
           data_root=Path(a.data_root) if a.data_root else None, refit=a.refit and a.redo == "all",
           redo=a.redo, quiet_load=a.quiet_load)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
