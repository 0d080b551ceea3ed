"""Chapter 6 live: both token-pool experiments through ``fairlib gateway`` in front of two real
engines (two llama.cpp servers with the tiny model, one compute thread each, on this machine).

The gateway runs the same compiled ``token_pool`` policy as the simulator (``PolicyGate``), its
capacity and prices from the engines' fit (``--cost-model``: ``p`` ms per prompt token,
``u = dt(B)/B`` per output token at a full replica of ``B`` slots), its tenants' classes, shares
and SLOs from a tenants file, each request's reservation from the ``x-fairlib-est-output-tokens``
header (the tenant's mean output, what chapter 5's corrected estimator converges to, or
``max_tokens``). The workloads are chapter 6's, scaled to what the tiny model serves in a short
run (shorter prompts and answers, the same offered machine time ``rho`` per tenant):

- **experiment 1** (:data:`LIVE_FLOOD`): guaranteed and elastic tenants at their entitlements, a
  spot tenant flooding (2x the pool), without admission control (the gateway's ``fcfs``) and with
  the pool reserving the estimate or ``max_tokens``;
- **experiment 2** (:data:`LIVE_LOSS`): three elastic workloads (TTFT SLOs 500 ms, 5 s, 30 s) at
  90 % of the two replicas; replica 1 is drained (``POST /admin/upstreams``: it takes no new
  request, those in it run to their end) from :data:`LOSS_DOWN_S` to :data:`LOSS_UP_S`.

What a run shows, beside the same schedule simulated on the fitted engine model
(:func:`fairlib.sim.cluster.simulate_gateway`: the gateway's policy in front of two model
replicas, the replica taken out at the instants the live gateway logged):

- from the client's records: TTFT per request, the requests answered 429, the work served within
  the load window (prompt tokens of the requests that started answering and the output tokens
  that arrived by the window's end, priced ``p P + u O``: :func:`fairlib.chapters.token_pools.served_work_ms`);
- from the gateway's event log replayed (:func:`fairlib.sim.gate.replay_samples`): per tenant and
  second, the machine time charged (the service), the reservations and the debts.

Saved runs: ``data/runs/pools/<engine>/<experiment>/<variant>/seed<k>``
(``python -m fairlib.chapters.token_pools_live record``). The experiments' definitions and their
measuring: :mod:`fairlib.chapters.token_pools_measure`.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time
import urllib.request
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from fairlib import paths
from fairlib.calibrate import fit as fitmod
from fairlib.calibrate.lifecycle import nice_of, sched_of
from fairlib.chapters import fidelity as fd
from fairlib.chapters import gateway_live as gl
from fairlib.chapters.token_pools import served_work_ms
from fairlib.chapters.token_pools_measure import (EST_HEADER, EXPERIMENTS, FLOOD_S, LIVE_FLOOD, LIVE_KIND, LIVE_LOSS,
                                                 LOSS_DOWN_S, LOSS_END_S, LOSS_UP_S, REPLICAS, SEED, VARIANT_LABELS,
                                                 live_engine, measure, requests_of, tenants_toml)
from fairlib.client.env import fetch_json
from fairlib.kinds import EngineKind
from fairlib.pools import kv_capacity_from_metrics
from fairlib.records import load_run
from fairlib.sim.cluster import simulate_gateway
from fairlib.sim.engine import Engine
from fairlib.sim.gate import replay_samples

__all__ = ["LIVE_KIND", "REPLICAS", "LIVE_FLOOD", "LIVE_LOSS", "FLOOD_S", "LOSS_DOWN_S", "LOSS_UP_S", "LOSS_END_S",
           "EXPERIMENTS", "live_engine", "tenants_toml", "live_table", "measure", "save_runs", "saved_runs",
           "replicas_events", "flood_live_table", "loss_live_table", "loss_live_series", "simulated", "record",
           "EST_HEADER", "fit_path_of", "start_replicas", "VARIANT_LABELS", "chapter_runs", "step_ratio", "outage", "record_kv", "kv_path"]


# --- saved runs --------------------------------------------------------------------------------------
def _root(kind: str, root=None) -> Path:
    return (Path(root) if root is not None else fd.runs_root()) / "pools" / kind


def save_runs(runs: Sequence, kind: str = LIVE_KIND, root=None) -> list:
    """The runs' small files under ``data/runs/pools/<kind>/<experiment>/<variant>/seed<k>``."""
    out = []
    for r in runs:
        p = r.extra["pools"]
        dst = _root(kind, root) / p["experiment"] / p["variant"] / f"seed{p['seed']}"
        gl.store_run_files(r, dst)
        out.append(dst)
    return out


def saved_runs(kind: str = LIVE_KIND, root=None) -> list:
    """The saved live runs, in :data:`EXPERIMENTS` order."""
    base = _root(kind, root)
    if not base.is_dir():
        raise FileNotFoundError(f"no saved chapter-6 live runs under {base}")
    out = []
    for exp, e in EXPERIMENTS.items():
        for key in e["variants"]:
            for p in sorted((base / exp / key).glob("seed*"), key=lambda p: int(p.name[4:])):
                out.append(load_run(p))
    return out


# --- what a run shows --------------------------------------------------------------------------------
def _gateway(run) -> tuple:
    head, events = gl._events(run)
    start, end = gl.window_ms(run)
    return head, events, start, end


def replicas_events(run) -> list:
    """The replica changes the gateway logged: ``(t_s into the run, replicas taking requests)``."""
    head, events, start, _ = _gateway(run)
    return [((ev[1] - start) / 1e3, int(ev[2])) for ev in events if ev[0] == "replicas"]


def _sim_events(run) -> list:
    """The logged replica counts as ``simulate_gateway`` events: with ``n`` taking requests the
    model's replicas ``n..R-1`` are out (the live replica that left is not logged, only the count)."""
    out, prev = [], run.extra["pools"]["replicas"]
    for t_s, n in replicas_events(run):
        t = max(0.0, t_s * 1e3)
        if n < prev:
            out += [(t, k, "down") for k in range(prev - 1, n - 1, -1)]
        elif n > prev:
            out += [(t, k, "up") for k in range(prev, n)]
        prev = n
    return out


def _table(run) -> pd.DataFrame:
    """The run's request table, rebuilt from its seed and fit (as :func:`~fairlib.chapters.token_pools_measure.measure` built it)."""
    p = run.extra["pools"]
    df, _ = requests_of(p["experiment"], _fit_of(run), p["seed"], p["reserve"])
    return df[df["arrival_ms"] < p["duration_s"] * 1e3].reset_index(drop=True)


def _fit_of(run) -> dict:
    """The fit a run was measured with (a path relative to the repository for a saved run)."""
    f = Path(run.extra["fit"]["file"])
    return fitmod.load_fit(f if f.is_absolute() else paths.repo_root() / f)


def simulated(run):
    """The run's schedule on the fitted engine model: the gateway's policy with the parameters
    it ran with, in front of two model replicas, replica 1 out when the live one was."""
    p = run.extra["pools"]
    st = json.loads((Path(run.path) / "gateway.json").read_text())
    df = _table(run)
    rec = run.records.sort_values("request_id")
    same = (len(df) == len(rec) and (df["prompt_tokens"].to_numpy() == rec["prompt_tokens"].to_numpy()).all()
            and (df["output_tokens"].to_numpy() == rec["max_tokens"].to_numpy()).all())
    if not same:
        raise ValueError(f"{run.path}: the schedule rebuilt from its seed and fit ({run.extra['fit']['file']}) is "
                         f"not the one the run sent ({len(df)} requests against {len(rec)}, or other lengths): "
                         f"was the fit file changed after the run?")
    eng = Engine(**run.extra["sim_engine"])
    params = st["policy_params"] if p["policy"] != "fcfs" else {}
    return simulate_gateway(df, eng, p["replicas"], p["policy"], params, _sim_events(run),
                            horizon_ms=None, n_tenants=len(p["tenants"]), sample_ms=1000.0)


def _measured_requests(run) -> pd.DataFrame:
    """Per request (the client's): tenant, send time (s into the run), TTFT (s), answered 429,
    the prompt and the output tokens that arrived within the load window."""
    rec = run.records.sort_values("request_id").reset_index(drop=True)
    dur = run.extra["pools"]["duration_s"]
    send = rec["actual_send_s"].astype(float).to_numpy()
    out_in = [int(sum(k for t, k in zip(ts or [], ks or []) if t <= dur))
              for ts, ks in zip(rec["chunk_times_s"], rec["chunk_tokens"])]
    first = rec["first_token_s"].astype(float).to_numpy()
    return pd.DataFrame({"tenant": rec["tenant"].to_numpy(), "send_s": send,
                         "ttft_s": rec["ttft_s"].astype(float).to_numpy(),
                         "rejected": (rec["error_class"] == "http_429").to_numpy(),
                         "ok": (rec["error_class"] == "none").to_numpy(),
                         "prompt_in_window": np.where(first <= dur, rec["prompt_tokens"].to_numpy(), 0),
                         "output_in_window": np.asarray(out_in)})


def _simulated_requests(run, sim) -> pd.DataFrame:
    req = sim.requests
    dur_ms = run.extra["pools"]["duration_s"] * 1e3
    first = req["first_token_ms"].to_numpy(float)
    gen_in = [0] * len(req)
    # output tokens by the window's end on the model: the requests finished by then gave all of
    # theirs, those running at the end a share by time (first token to finish, linear)
    fin = req["finish_ms"].to_numpy(float)
    gen = req["generated"].to_numpy(float)
    for i in range(len(req)):
        if not np.isfinite(first[i]) or first[i] > dur_ms:
            continue
        if fin[i] <= dur_ms:
            gen_in[i] = gen[i]
        else:
            gen_in[i] = 1 + (gen[i] - 1) * (dur_ms - first[i]) / max(fin[i] - first[i], 1e-9)
    return pd.DataFrame({"tenant": req["tenant"].to_numpy(), "send_s": req["arrival_ms"].to_numpy(float) / 1e3,
                         "ttft_s": (first - req["arrival_ms"].to_numpy(float)) / 1e3,
                         "rejected": req["rejected"].to_numpy(bool),
                         "ok": ~req["rejected"].to_numpy(bool),
                         "prompt_in_window": np.where(first <= dur_ms, req["prompt_tokens"].to_numpy(), 0),
                         "output_in_window": np.asarray(gen_in, float)})


def _p99(x) -> float:
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    return float(np.percentile(x, 99)) if x.size else float("nan")


def flood_live_table(runs: Sequence) -> pd.DataFrame:
    """Experiment 1 live, per variant, measured and simulated: each class's p99 TTFT (s) and its
    requests answered 429 (%), the work served in the load window relative to FCFS (%)."""
    runs = [r for r in runs if r.extra["pools"]["experiment"] == "flood"]
    rows, base = [], {}
    for r in runs:
        p = r.extra["pools"]
        eng = Engine(**r.extra["sim_engine"])
        sim = simulated(r)
        for src, q in (("measured", _measured_requests(r)), ("simulated", _simulated_requests(r, sim))):
            work = served_work_ms(eng, int(q["prompt_in_window"].sum()), float(q["output_in_window"].sum()))
            row = {"variant": VARIANT_LABELS[p["variant"]], "seed": p["seed"], "source": src,
                   "valid": bool(r.summary.get("valid")), "requests": len(q), "work_ms": work}
            for j, t in enumerate(p["tenants"]):
                mine = q[q["tenant"] == j]
                row[f"{t['klass']} p99 TTFT (s)"] = _p99(mine.loc[mine["ok"], "ttft_s"])
                row[f"{t['klass']} 429 (%)"] = 100.0 * float(mine["rejected"].mean()) if len(mine) else np.nan
            if p["variant"] == "fcfs":
                base[(p["seed"], src)] = work
            rows.append(row)
    if not rows:
        return pd.DataFrame()
    out = pd.DataFrame(rows)
    out["work served vs FCFS (%)"] = [100.0 * w / base[(s, src)] if (s, src) in base else np.nan
                                      for w, s, src in zip(out["work_ms"], out["seed"], out["source"])]
    return out.drop(columns=["work_ms"]).set_index(["variant", "seed", "source"])


def outage(run) -> Optional[tuple]:
    """``(down_s, up_s)``: the first time the gateway logged fewer replicas taking requests than
    the run has, and the next time all of them again (``up_s`` the run's end if never); None if it
    never lost one. Changes in between (a health check that flapped) are inside the outage."""
    full = run.extra["pools"]["replicas"]
    down = None
    for t_s, n in replicas_events(run):
        if down is None and n < full:
            down = max(0.0, t_s)
        elif down is not None and n >= full:
            return down, t_s
    return None if down is None else (down, run.extra["pools"]["duration_s"])


def _phases(run) -> list:
    """The run's phases around its outage (s into the run); the whole run if it had none."""
    dur = run.extra["pools"]["duration_s"]
    o = outage(run)
    if o is None:
        return [("whole run", 0.0, dur)]
    a, b = o
    return [("before", 0.0, a), ("one replica", a, b), ("after", b, dur)]


def loss_live_series(run, sample_s: float = 1.0, sim=None) -> pd.DataFrame:
    """Experiment 2 live, per tenant and second: the gateway's charges and pool state replayed
    from its log (machine ms, reserved, debt, replicas) beside the simulated run's samples;
    ``source`` measured / simulated, ``t_s`` into the run, ``service`` over the last 5 s.
    ``sim``: the run's :func:`simulated` result, when the caller has it already."""
    head, events, start, end = _gateway(run)
    _, meas = replay_samples(head["spec"], events, sample_s * 1e3, start_ms=start,
                             end_ms=start + run.extra["pools"]["duration_s"] * 1e3,
                             replicas=run.extra["pools"]["replicas"])
    meas["t_ms"] = meas["t_ms"] - start
    sim = (simulated(run) if sim is None else sim).samples
    sim = sim[sim["t_ms"] <= run.extra["pools"]["duration_s"] * 1e3]
    names = [t["name"] for t in run.extra["pools"]["tenants"]]
    parts = []
    for src, smp in (("measured", meas), ("simulated", sim)):
        s = smp.copy()
        s["source"], s["t_s"] = src, (s["t_ms"] / 1e3).round(6)
        s["tenant"] = [names[j] for j in s["tenant"]]
        s = s.sort_values(["tenant", "t_ms"])
        k = int(round(5.0 / sample_s))
        s["service"] = s.groupby("tenant")["machine_ms"].diff(k) / (k * sample_s * 1e3)
        parts.append(s)
    return pd.concat(parts, ignore_index=True)


def loss_live_table(runs: Sequence) -> pd.DataFrame:
    """Experiment 2 live, per variant, phase, tenant and source: the service (machine ms per ms
    the gateway charged it in the phase), requests answered 429 (%), TTFT p50 (s) and the share of
    its requests answered within its SLO (%), by send time in the phase."""
    rows = []
    for r in runs:
        p = r.extra["pools"]
        if p["experiment"] != "loss":
            continue
        sim = simulated(r)
        ser = loss_live_series(r, sim=sim)
        for src, q in (("measured", _measured_requests(r)), ("simulated", _simulated_requests(r, sim))):
            smp = ser[ser["source"] == src]
            for ph, a, b in _phases(r):
                ta, tb = np.floor(a), np.floor(b)
                inph = (q["send_s"] >= a) & (q["send_s"] < b)
                for j, t in enumerate(p["tenants"]):
                    m = smp[smp["tenant"] == t["name"]].set_index("t_s")["machine_ms"].sort_index()
                    # the state at a second the samples lack (a simulation that ended earlier) is its last
                    at = m.reindex(m.index.union([ta, tb])).ffill().fillna(0.0)
                    served = (at.loc[tb] - at.loc[ta]) / ((tb - ta) * 1e3) if tb > ta else np.nan
                    mine = q[inph & (q["tenant"] == j)]
                    tt = mine.loc[mine["ok"], "ttft_s"].to_numpy(float)
                    rows.append({"variant": VARIANT_LABELS[p["variant"]], "seed": p["seed"], "phase": ph,
                                 "tenant": t["name"], "source": src, "service": served,
                                 "429 (%)": 100.0 * float(mine["rejected"].mean()) if len(mine) else np.nan,
                                 "TTFT p50 (s)": float(np.median(tt)) if tt.size else np.nan,
                                 "within SLO (%)": 100.0 * float((tt <= t["slo_ms"] / 1e3).sum() / max(1, len(mine)))})
    if not rows:
        return pd.DataFrame()
    return pd.DataFrame(rows).set_index(["variant", "seed", "phase", "tenant", "source"])


def live_table(runs: Sequence) -> pd.DataFrame:
    """Per run: experiment, variant, seed, validity (the client's schedule lag), requests planned,
    answered, answered 429, and the replica changes the gateway logged."""
    rows = []
    for r in runs:
        p, s = r.extra["pools"], r.summary
        ec = r.records["error_class"].value_counts()
        rows.append({"experiment": p["experiment"], "variant": VARIANT_LABELS[p["variant"]], "seed": p["seed"],
                     "valid": bool(s.get("valid")), "lag p99 (ms)": (s.get("schedule_lag_ms") or {}).get("p99"),
                     "planned": s["n_planned"], "answered": int(ec.get("none", 0)), "429": int(ec.get("http_429", 0)),
                     "other errors": int(s["n_planned"] - ec.get("none", 0) - ec.get("http_429", 0)),
                     "replicas (t s: n)": ", ".join(f"{t:.1f}: {n}" for t, n in replicas_events(r)) or "-"})
    return pd.DataFrame(rows)


def chapter_runs(backend: str, *, engine_kind: str = LIVE_KIND, endpoints: Sequence[str] = (),
                 model: Optional[str] = None, fit_file=None, variants: Optional[dict] = None,
                 seeds: Sequence[int] = (SEED,), scale_s: float = 1.0, runs_dir="runs/ch06", log=print) -> list:
    """What the chapter's live section shows: on ``sim`` the saved runs; on ``http`` both
    experiments measured now through a gateway in front of ``endpoints`` (two replicas of one
    engine), with a fit that describes them (``fairlib.calibrate.fit.fit_for_endpoint`` refuses
    one made for another engine or machine)."""
    if backend != "http":
        return saved_runs(engine_kind)
    if len(endpoints) != REPLICAS:
        raise ValueError(f"endpoints: backend 'http' needs the {REPLICAS} replicas' base URLs, got {list(endpoints)}")
    for e in endpoints:
        fitmod.fit_for_endpoint(fit_file, e, engine_kind, model)
    return measure(endpoints, engine_kind, fit_file or fitmod.fit_data_path(engine_kind), variants=variants,
                   seeds=seeds, scale_s=scale_s, runs_dir=runs_dir, model=model, log=log)


def step_ratio(run) -> float:
    """The median decode step the gateway rebuilt at a full batch over the fitted one (how much
    slower the engine ran in the run than its fit says: ``gateway_live.full_batch_step``)."""
    fitted, measured = gl.full_batch_step(run)
    return measured / fitted


# --- recording ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def start_replicas(kind: str = LIVE_KIND, n: int = REPLICAS):
    """``n`` engines started as the book starts them (:data:`fairlib.calibrate.fit.ENGINE_FLAGS`)."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(fitmod.start(kind)) for _ in range(n)]


def fit_path_of(kind: str = LIVE_KIND, root=None) -> Path:
    """The fit the saved runs were measured with: replica 0, fitted just before, beside them."""
    return _root(kind, root) / "fit.json"


def record(kind: str = LIVE_KIND, *, seeds: Sequence[int] = (SEED,), root=None, refit: bool = True,
           quiet_load: Optional[float] = 3.5, verbose: bool = True) -> list:
    """Start two engines as the book does, fit replica 0 on this machine with replica 1 started
    (``refit``; else reuse :func:`fit_path_of`), run both experiments through the gateway and save
    the runs and the fit under ``data/runs/pools/<kind>``."""
    ffile = fit_path_of(kind, root)
    label = str(ffile.relative_to(paths.repo_root())) if root is None else str(ffile)
    saved = []
    with start_replicas(kind) as engines:
        extra = {"engine_nice": nice_of(engines[0].pid), "engine_sched": sched_of(engines[0].pid)}
        if refit or not ffile.exists():
            fd.wait_quiet(quiet_load, 300.0, print)
            fitmod.fit_engine(engines[0], out=ffile, verbose=verbose,
                              note="chapter 6 live: replica 0 of two, the other started and idle")
        for exp in EXPERIMENTS:
            fd.wait_quiet(quiet_load, 300.0, print)
            runs = measure([e.base_url for e in engines], kind, ffile, experiments=[exp], seeds=seeds,
                           model=engines[0].model, extra=extra, fit_label=label)
            saved += save_runs(runs, kind, root)
    return saved


def kv_path(kind: str = "vllm") -> Path:
    """Where :func:`record_kv` writes the engine's KV capacity: ``data/engines/<kind>_kv.json``."""
    return paths.data_path("engines", f"{kind}_kv.json")


def record_kv(kind: str = "vllm", out=None) -> dict:
    """Start vLLM as the book does and read its KV capacity from ``/metrics``
    (:func:`fairlib.pools.kv_capacity_from_metrics`: ``num_gpu_blocks x block_size``); written with
    the server's version, its settings, the machine and the date."""
    if kind != EngineKind.VLLM:
        raise ValueError(f"kind: only vllm states its KV capacity in /metrics, got {kind!r}")
    with fitmod.start(kind) as eng:
        with urllib.request.urlopen(eng.metrics_url, timeout=10) as r:
            kv = kv_capacity_from_metrics(r.read().decode())
        body = fetch_json(eng.server_root + "/version").get("body")
        version = body.get("version") if isinstance(body, dict) else None
        res = {**kv, "engine_kind": kind, "version": version, "settings": {k: v for k, v in eng.settings.items()
                                                                             if isinstance(v, (int, float, str))},
               "flags": {k: (list(v) if isinstance(v, tuple) else v) for k, v in fitmod.ENGINE_FLAGS[kind].items()},
               "machine": fitmod.machine_info(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
               "source": "vllm:cache_config_info labels num_gpu_blocks and block_size, GET /metrics"}
    path = Path(out) if out is not None else kv_path(kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1) + "\n")
    return res


def main(argv=None) -> int:
    """``python -m fairlib.chapters.token_pools_live record [--seeds 0]`` | ``... kv``."""
    ap = argparse.ArgumentParser(prog="python -m fairlib.chapters.token_pools_live", description=main.__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="measure both experiments through the gateway into data/runs/pools")
    r.add_argument("--seeds", type=int, nargs="+", default=[SEED])
    r.add_argument("--no-refit", action="store_true", help="reuse the saved fit")
    sub.add_parser("kv", help="start vLLM and save its KV capacity (data/engines/vllm_kv.json)")
    a = ap.parse_args(argv)
    if a.cmd == "kv":
        print(record_kv())
    else:
        record(seeds=a.seeds, refit=not a.no_refit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
