"""Chapter 6 live, the experiments and their measuring: the live workloads (:data:`LIVE_FLOOD`,
:data:`LIVE_LOSS`, :data:`EXPERIMENTS`), the gateway's tenants file, and :func:`measure`: each
experiment x variant x seed through one ``fairlib gateway`` in front of two engine replicas, the
replica drained and restored at its instants. What the runs show, the saved runs and the recorder
are :mod:`fairlib.chapters.token_pools_live`'s.
"""
from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional, Sequence

import pandas as pd

from fairlib.calibrate import fit as fitmod
from fairlib.chapters import fidelity as fd
from fairlib.chapters import gateway_live as gl
from fairlib.chapters.token_pools import TenantLoad, workload
from fairlib.client import run as client_run
from fairlib.client.schedule import build_schedule
from fairlib.gateway import FAIRNESS_HEADERS, GatewayProcess
from fairlib.kinds import FIT_KINDS
from fairlib.records import load_run
from fairlib.sim.engine import Engine

__all__ = ["LIVE_KIND", "REPLICAS", "LIVE_FLOOD", "LIVE_LOSS", "FLOOD_S", "LOSS_DOWN_S", "LOSS_UP_S", "LOSS_END_S",
           "EXPERIMENTS", "EST_HEADER", "SEED", "VARIANT_LABELS", "live_engine", "tenants_toml", "requests_of",
           "measure"]


LIVE_KIND = "llamacpp"
REPLICAS = 2
EST_HEADER = "x-fairlib-est-output-tokens"
SEED = 0

#: experiment 1 live: chapter 6's classes, shares and SLOs, offered machine time per tenant in
#: replicas (0.6 + 1.0 = the guaranteed and elastic entitlements of a two-replica pool, 2.4 the
#: spot flood: 2x the pool in all), prompts and answers a quarter of the simulated ones
LIVE_FLOOD = (
    TenantLoad("interactive", "guaranteed", 0.3, 1000.0, 100, 30, 64, 0.6),
    TenantLoad("team", "elastic", 0.5, 5000.0, 200, 60, 128, 1.0),
    TenantLoad("flood", "spot", 0.0, 60000.0, 80, 80, 256, 2.4),
)
FLOOD_S = 40.0
#: experiment 2 live: three elastic workloads at 0.6 of a replica each (90 % of the pool)
LIVE_LOSS = (
    TenantLoad("coding", "elastic", 1 / 3, 500.0, 150, 20, 64, 0.6),
    TenantLoad("reports", "elastic", 1 / 3, 5000.0, 250, 75, 192, 0.6),
    TenantLoad("batch", "elastic", 1 / 3, 30000.0, 100, 100, 256, 0.6),
)
LOSS_DOWN_S, LOSS_UP_S, LOSS_END_S = 25.0, 55.0, 90.0
#: per experiment: its tenants, load window (s), the replica events (s into the run), and the
#: variants: (policy, params, what the reservation uses)
EXPERIMENTS: dict[str, dict[str, Any]] = {
    "flood": {"tenants": LIVE_FLOOD, "duration_s": FLOOD_S, "events": (),
              "variants": {"fcfs": ("fcfs", {}, "estimate"),
                           "pool_estimate": ("token_pool", {}, "estimate"),
                           "pool_max_tokens": ("token_pool", {}, "max_tokens")}},
    "loss": {"tenants": LIVE_LOSS, "duration_s": LOSS_END_S,
             "events": ((LOSS_DOWN_S, 1, "down"), (LOSS_UP_S, 1, "up")),
             "variants": {"fcfs": ("fcfs", {}, "estimate"),
                          "pool": ("token_pool", {"debt_weight": 0.25}, "estimate")}},
}
VARIANT_LABELS = {"fcfs": "no admission (FCFS)", "pool_estimate": "pool, mean answer (oracle)",
                  "pool_max_tokens": "pool, max_tokens", "pool": "pool"}


def live_engine(fit, requests: pd.DataFrame) -> Engine:
    """The fitted engine at the workload's mean decode context (prompt plus half the answer,
    weighted by answer tokens: :func:`fairlib.calibrate.fit.mean_decode_context`'s definition)."""
    o = requests["output_tokens"].to_numpy(float)
    ctx = float(((requests["prompt_tokens"].to_numpy(float) + o / 2.0) * o).sum() / o.sum())
    return fitmod.engine_at(fit, ctx)


def tenants_toml(tenants: Sequence[TenantLoad]) -> str:
    """The gateway's tenants file: each tenant's pool class, share and TTFT SLO."""
    return "".join(f'[[tenant]]\nname = "{t.name}"\npool_class = "{t.klass}"\nshare = {t.share!r}\n'
                   f"ttft_slo_ms = {t.slo_ms!r}\n" for t in tenants)


def requests_of(exp: str, fit, seed: int, reserve: str) -> tuple:
    """``(table, engine)``: the experiment's requests (rates from the fitted engine at the
    workload's context, found by two fixed-point steps: the context sets the prices, the prices
    the rates) and that engine."""
    e = EXPERIMENTS[exp]
    eng = fitmod.engine_at(fit, fitmod.REFERENCE_CONTEXT)
    for _ in range(2):
        df = workload(e["tenants"], eng, e["duration_s"], seed, reserve)
        eng = live_engine(fit, df)
    return workload(e["tenants"], eng, e["duration_s"], seed, reserve), eng


def _client_table(df: pd.DataFrame) -> pd.DataFrame:
    """The client's workload: answers forced to their length, the reservation as a header."""
    return pd.DataFrame({"arrival_ms": df["arrival_ms"], "tenant": df["tenant"], "prompt_tokens": df["prompt_tokens"],
                         "output_tokens": df["output_tokens"],
                         "headers": [{EST_HEADER: str(int(v))} for v in df["est_output_tokens"]]})


@contextlib.contextmanager
def _timed_events(gw, events: Sequence, t0: float):
    """Drain and restore upstreams at their instants (s after ``t0``, monotonic) in a thread."""
    stop = threading.Event()
    errors: list = []

    def go():
        for t, k, what in events:
            if stop.wait(max(0.0, t0 + t - time.monotonic())):
                return
            try:
                gw.drain(int(k), what == "down")
            except Exception as e:          # noqa: BLE001 - reported after the run
                errors.append(f"{what} {k} at {t:g} s: {e}")
    th = threading.Thread(target=go, name="fairlib-replica-events", daemon=True)
    th.start()
    try:
        yield errors
    finally:
        stop.set()
        th.join(5.0)
        for k in sorted({int(k) for _, k, _ in events}):     # every replica back for the next run
            with contextlib.suppress(Exception):
                gw.drain(k, False)


def measure(endpoints: Sequence[str], kind: str, fit_path, *, experiments: Sequence[str] = tuple(EXPERIMENTS),
            variants: Optional[dict] = None, seeds: Sequence[int] = (SEED,), scale_s: float = 1.0,
            runs_dir=None, model: Optional[str] = None, extra: Optional[dict] = None,
            fit_label: Optional[str] = None, log=print) -> list:
    """Each experiment x variant x seed through one gateway in front of ``endpoints`` (one per
    replica); run directories ``runs_dir/<experiment>/<variant>/seed<k>``. ``variants``: per
    experiment the keys to run (default all). ``scale_s``: every duration and replica instant
    multiplied by it (the test's short version). ``fit_label``: how the runs name the fit file
    (default its path)."""
    if len(endpoints) < 2:
        raise ValueError(f"endpoints: the experiments need two replicas (two base URLs), got {list(endpoints)}")
    if isinstance(endpoints, str) or isinstance(experiments, str):
        raise ValueError("endpoints and experiments: lists (of base URLs, of experiment names), not one string")
    unknown = [x for x in experiments if x not in EXPERIMENTS]
    if unknown:
        raise ValueError(f"experiments: unknown {unknown}; allowed: {', '.join(EXPERIMENTS)}")
    if kind not in FIT_KINDS:
        raise ValueError(f"kind must be one of {', '.join(FIT_KINDS)}, got {kind!r}")
    for exp, keys in (variants or {}).items():
        if exp not in EXPERIMENTS:
            raise ValueError(f"variants: unknown experiment {exp!r}; allowed: {', '.join(EXPERIMENTS)}")
        if isinstance(keys, str):
            raise ValueError(f"variants[{exp!r}]: a list of variants, not one string, e.g. [{keys!r}]")
        bad = [k for k in keys if k not in EXPERIMENTS[exp]["variants"]]
        if bad:
            raise ValueError(f"variants[{exp!r}]: unknown {bad}; allowed: {', '.join(EXPERIMENTS[exp]['variants'])}")
    fit = fitmod.load_fit(fit_path)
    slots = int(fit["engine"]["max_batch"])
    runs_dir = Path(runs_dir) if runs_dir is not None else Path(tempfile.mkdtemp(prefix="fairlib-ch06-"))
    cfg = fd.endpoint_config(kind, endpoints[0], model, priority=False)
    tok = fd.model_tokenizer(kind)
    out = []
    for exp in experiments:
        e = EXPERIMENTS[exp]
        keys = list((variants or {}).get(exp, e["variants"]))
        tfile = runs_dir / f"{exp}-tenants.toml"
        tfile.parent.mkdir(parents=True, exist_ok=True)
        tfile.write_text(tenants_toml(e["tenants"]))
        args = [a for u in endpoints for a in ("--upstream", u.rstrip("/"))]
        args += ["--cost-model", str(fit_path), "--max-inflight", str(slots), "--tenants", str(tfile),
                 "--health-interval-s", "0.5", "--events", "--access-log", "off", "--tenant-max-share", "1"]
        names = [t.name for t in e["tenants"]]
        duration = e["duration_s"] * scale_s
        events = [(t * scale_s, k, w) for t, k, w in e["events"]]
        with GatewayProcess(args) as gw:
            for key in keys:
                pol, params, reserve = e["variants"][key]
                for s in seeds:
                    df, eng = requests_of(exp, fit, s, reserve)
                    df = df[df["arrival_ms"] < duration * 1e3].reset_index(drop=True)
                    sched = build_schedule(_client_table(df), s, tenant_names=names, tokenizer=tok,
                                           token_id_prompts=tok is not None)
                    gw.set_policy(pol, params)
                    rd = runs_dir / exp / key / f"seed{s}"
                    more = {"engine_kind": kind, "fit": {"file": fit_label or str(Path(fit_path).resolve()),
                                                         "date": fit.get("date")},
                            "sim_engine": eng.to_dict(), "loadavg_1m": fd.loadavg(),
                            "pools": {"experiment": exp, "variant": key, "policy": pol, "params": params,
                                      "reserve": reserve, "seed": int(s), "duration_s": duration,
                                      "events": events, "replicas": len(endpoints), "slots": slots,
                                      "tenants": [vars(t) for t in e["tenants"]]},
                            **(extra or {})}
                    # every answer waits as long as it takes: a run without admission control
                    # serves its whole backlog (TTFT of what the pool would have refused)
                    c = replace(cfg, base_url=gw.base_url, tenant_header=FAIRNESS_HEADERS[0],
                                timeout_s=max(600.0, 10 * duration))
                    with _timed_events(gw, events, time.monotonic() + 0.2) as errors:
                        client_run(sched, c, rd, config_extra=more, overwrite=True, scrape_metrics=False)
                    if errors:
                        raise RuntimeError(f"{exp} {key} seed {s}: the replica events failed: {errors}")
                    gl.wait_idle(gw, 900)
                    gl.keep_gateway_files(gw, rd)
                    r = load_run(rd)
                    log(f"{kind} ch06 {exp} {key} seed {s} ({len(df)} requests): {r.summary['valid_reason']}")
                    if not r.summary.get("n_ok"):
                        raise RuntimeError(f"{exp} {key} seed {s}: no request was answered ({r.summary['valid_reason']}; "
                                           f"the run directory {rd}): are the endpoints up?")
                    out.append(r)
    return out
