"""The book's policies measured on a real engine through the fairness gateway (chapters 1-4).

A real engine schedules first come, first served (or by priority). ``fairlib gateway`` in front of
it holds the waiting lines and lets the simulator's own policy code decide who enters the batch,
so every scheduler of chapters 1-4 runs live. One experiment serves the four chapters: the blog
post's scenario (``seed000``) on the engine, its rates scaled to the engine's fitted capacity
(chapter 8's ``scenario_spec``), under each policy of :func:`policies_for`:

- ``fcfs``, ``rpm_quota`` (the operator's equal quota for this engine), ``vtc`` (1/2) and
  ``residency`` (charge dt/B): chapter 1's table; fcfs and the quota: chapter 2's inversion;
- ``vtc``: chapter 3's counter split against the machine split;
- ``slot_cap`` (``max_batch / tenants`` slots each): chapter 4's decode split against the whole.

Each run sends the schedule open-loop through the gateway (tenants by the
``x-llm-d-inference-fairness-id`` header), each request cut one load window after it was sent
(at 3x overload nothing drains in a short run), and keeps the gateway's event log and state
beside the client's records (``gateway_events.jsonl``, ``gateway.json``). What each table shows,
per tenant, inside the load window ``[0, duration_s)``:

- **measured**: the machine share rebuilt from the client's stream timings, prefill priced
  (``fairlib.analysis.residency(..., prefill="fitted")``, the reconstruction chapter 1 checks);
- **gateway**: what the gateway charged while the runs went (prefill at the fitted price at
  admission, ``dt/B`` of every decode step it rebuilt from the token arrivals), replayed from its
  log up to the window's end (``fairlib.sim.gate.replay``): the same charges, and the policy's
  counters there;
- **simulated**: the same schedule on the fitted engine model under the same policy, the
  simulator's exact residency charge over the window.

Saved runs: ``data/runs/gateway/<engine>/seed000/<policy>/seed<k>``
(``python scripts/record.py 1-4 vllm``: :mod:`fairlib.chapters.gateway_record`).
"""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from fairlib import analysis as an
from fairlib.backend import HttpOptions, run_scenario
from fairlib.calibrate import fit as fitmod
from fairlib.chapters import fidelity as fd
from fairlib.chapters import presets
from fairlib.chapters import fidelity_runs
from fairlib.gateway import FAIRNESS_HEADERS, GatewayProcess
from fairlib.records import Run, load_run, simulate_run
from fairlib.records.run import directory_of
from fairlib.records.rundir import read_jsonl
from fairlib.sim.engine import Engine
from fairlib.sim.gate import replay
from fairlib.kinds import DATA_PLANES

__all__ = ["EXPERIMENT", "POLICY_KEYS", "RECORD_SEEDS", "RECORD_DURATION_S", "SHARE_PTS", "used_rows", "policies_for", "experiment_spec",
           "DATA_PLANES", "check_data_plane", "valid_of", "LiveGateway", "run_policy", "measure", "save_runs", "load_saved", "saved_root", "simulate_measured_run", "gate_at",
           "window_ms", "run_steps", "full_batch_step", "fit_path_of", "share_rows", "share_table", "validity_table", "keep_gateway_files", "store_run_files", "wait_idle", "chapter_runs", "share_chart", "quota_cost_table", "noise", "counter_table", "slot_cap_table"]

EXPERIMENT = "seed000"
#: the policies of chapters 1-4, in the order the chapters show them
POLICY_KEYS = ("fcfs", "rpm_quota", "vtc", "residency", "slot_cap")
RECORD_SEEDS = (0, 1, 2)
RECORD_DURATION_S = 30.0
#: What chapter 1 asserts on the saved runs: every (policy, tenant) mean over the seeds of
#: measured minus simulated share within this many points. Set from the saved runs' own noise
#: (vLLM-CPU, 5 policies x 3 seeds of 30 s, 2026-12-01): the standard deviation over seeds of one
#: tenant's difference is 0.34 points at the median and 1.66 at most, the largest mean 1.58
#: (slot cap, classify), the largest single run 2.65; 3 points is about twice the largest sd.
SHARE_PTS = 3.0


def experiment_spec(fit, duration_s: float) -> tuple:
    """``(spec, info)``: the blog post's scenario on the fitted engine (chapter 8's
    :func:`fairlib.chapters.fidelity.scenario_spec`)."""
    return fd.scenario_spec(fit, EXPERIMENT, duration_s)


def policies_for(spec, keys: Sequence[str] = POLICY_KEYS) -> dict:
    """``{key: (policy, params)}`` on this engine: the equal quota an operator sets for it
    (``presets.operator_rpm_limit``: the per-tenant capacity rounded up to ten a minute), VTC's
    shipped weights 1 and 2, charge dt/B, and the slot cap ``max_batch / tenants``."""
    sc = spec.scenario
    table = {"fcfs": ("fcfs", {}),
             "rpm_quota": ("rpm_quota", {"limit": presets.operator_rpm_limit(sc)}),
             "vtc": ("vtc", {"wp": 1.0, "wq": 2.0}),
             "residency": ("residency", {}),
             "slot_cap": ("slot_cap", {"cap": max(1, sc.engine.max_batch // len(sc.tenants))})}
    unknown = [k for k in keys if k not in table]
    if unknown:
        raise ValueError(f"policies: unknown key(s) {unknown}; allowed: {', '.join(table)}")
    return {k: table[k] for k in keys}


def check_data_plane(data_plane: str) -> str:
    """``data_plane`` if it is one of :data:`DATA_PLANES`; a ValueError naming them otherwise."""
    if data_plane not in DATA_PLANES:
        raise ValueError(f"data_plane: {data_plane!r} is not one of {', '.join(DATA_PLANES)}")
    return data_plane


class LiveGateway:
    """A gateway (child process) in front of ``endpoint``: the fit's ``max_batch`` slots (the
    engine's ``max_num_seqs``) and prefill price (``--cost-model``), on ``data_plane``."""

    def __init__(self, endpoint: str, fit_path, max_inflight: Optional[int] = None, api_key: Optional[str] = None,
                 data_plane: str = "python"):
        fit = fitmod.load_fit(fit_path)
        slots = int(max_inflight or fit["engine"]["max_batch"])
        args = ["--upstream", endpoint.rstrip("/"), "--cost-model", str(fit_path), "--max-inflight", str(slots),
                "--events", "--access-log", "off",     # the replay reads the log; the records say the rest
                "--tenant-max-share", "1",              # the policies as the chapters study them: no share cap
                "--data-plane", check_data_plane(data_plane)]
        if api_key:
            args += ["--upstream-api-key", api_key]
        self.proc = GatewayProcess(args)
        self.slots = slots

    def __enter__(self) -> GatewayProcess:
        return self.proc.start()

    def __exit__(self, *exc):
        self.proc.stop()


def wait_idle(gw: GatewayProcess, timeout_s: float) -> dict:
    """Wait until nothing waits, runs or is pending in the gateway; its state."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = gw.state()
        if st["in_flight"] == 0 and st["waiting"] == 0 and st["pending"] == 0:
            return st
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gateway did not drain within {timeout_s:g} s: {st['in_flight']} in flight, "
                               f"{st['waiting']} waiting")
        time.sleep(0.2)


def _round(obj, digits: int = 4):
    if isinstance(obj, float):
        return round(obj, digits)
    if isinstance(obj, list):
        return [_round(v, digits) for v in obj]
    return obj


def run_policy(gw: GatewayProcess, spec_info, seed: int, key: str, policy: str, params: dict, cfg, run_dir, *,
               kind: str, tokenizer=None, fit_info: Optional[dict] = None, extra: Optional[dict] = None) -> Run:
    """One run of the experiment through ``gw`` under ``policy``: the policy set between runs (fresh
    counters and log), the schedule sent with the fairness header, each request cut one load
    window after it was sent; the gateway's log and state written into the run directory."""
    spec, info = spec_info
    deadline = time.monotonic() + 60
    while True:
        try:
            gw.set_policy(policy, params)
            break
        except OSError:                  # 409: the last run's cut requests are still leaving
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    more = {"engine_kind": kind, **info, "fit": fit_info or {}, "cut_after_s": spec.duration_s,
            "loadavg_1m": fd.loadavg(),
            "gateway": {"key": key, "policy": policy, "params": params, "slots": gw.state()["gate"]["slots"],
                        "data_plane": "python" if gw.control_port is None else "envoy"},
            **(extra or {})}
    c = replace(cfg, base_url=gw.base_url, tenant_header=FAIRNESS_HEADERS[0], timeout_s=spec.duration_s)
    # The experiment overloads the engine and cuts every request one window after it was sent:
    # a cut (class "timeout") is the design, not a failure, so the 1% rule cannot judge these
    # runs (most of an overloaded window is cut). Their validity is completeness and the
    # client's schedule lag; any other failure class raises (fidelity.check_cut_run).
    run = run_scenario(spec, seed, HttpOptions(run_dir=run_dir, endpoint_config=c, tokenizer=tokenizer,
                                               server_policy=policy, config_extra=more, scrape_metrics=False,
                                               max_error_rate=1.0))
    fd.check_cut_run(run)
    wait_idle(gw, 2 * spec.duration_s + 30)
    keep_gateway_files(gw, run_dir)
    return load_run(run_dir)


def store_run_files(r: Run, dst) -> Path:
    """A gateway run's small files in ``dst`` (``fidelity_runs.store_run_files``, the one copy
    every recorder keeps), its event log and state required."""
    return fidelity_runs.store_run_files(r, dst, gateway=True)


def keep_gateway_files(gw: GatewayProcess, run_dir) -> None:
    """The gateway's event log (floats to 0.1 us) and state, beside a run's records;
    ``RuntimeError`` when the gateway kept no log of a run that admitted requests (started without
    ``--events``: the chapters' replays, run steps and replica events would read nothing)."""
    head, events = gw.events()
    if not events and sum(u["dispatched"] for u in gw.state()["upstreams"]):
        raise RuntimeError("the gateway kept no event log (start it with --events): the chapter reads its "
                           "decisions and steps from it")
    rd = Path(run_dir)
    with open(rd / "gateway_events.jsonl", "w") as f:
        f.write(json.dumps(head) + "\n")
        for e in events:
            f.write(json.dumps(_round(e)) + "\n")
    (rd / "gateway.json").write_text(json.dumps(gw.state(), indent=1) + "\n")


def measure(endpoint: str, kind: str, fit_path, seeds: Sequence[int], duration_s: float, runs_dir, *,
            keys: Sequence[str] = POLICY_KEYS, model: Optional[str] = None, cfg=None, tokenizer=None,
            fit_info: Optional[dict] = None, extra: Optional[dict] = None, log=print,
            data_plane: str = "python") -> list:
    """Every policy of ``keys`` x seed through one gateway in front of ``endpoint`` on
    ``data_plane`` (:data:`DATA_PLANES`; recorded in each run's ``extra["gateway"]``); run
    directories ``runs_dir/<policy>/seed<k>``."""
    check_data_plane(data_plane)
    fit = fitmod.load_fit(fit_path)
    spec_info = experiment_spec(fit, duration_s)
    pols = policies_for(spec_info[0], keys)
    cfg = cfg if cfg is not None else fd.endpoint_config(kind, endpoint, model, priority=False)
    tok = tokenizer if tokenizer is not None else fd.model_tokenizer(kind)
    out = []
    with LiveGateway(endpoint, fit_path, data_plane=data_plane) as gw:
        for key, (pol, params) in pols.items():
            for s in seeds:
                r = run_policy(gw, spec_info, s, key, pol, params, cfg, Path(runs_dir) / key / f"seed{s}",
                               kind=kind, tokenizer=tok, fit_info=fit_info or {"file": str(fit_path)}, extra=extra)
                log(f"{kind} {key} seed {s}: {r.summary['valid_reason']}, {r.summary['n_ok']}/{r.summary['n_planned']}"
                    f" ok (cut at the window: {r.summary['n_planned'] - r.summary['n_ok']})")
                out.append(r)
    return out


# --- saved runs --------------------------------------------------------------------------------------
def saved_root(kind: str, root: Optional[Path] = None) -> Path:
    return (Path(root) if root is not None else fd.runs_root()) / "gateway" / kind / EXPERIMENT


def save_runs(runs: Sequence[Run], kind: str, root: Optional[Path] = None) -> list:
    """The small files of each run (and the gateway's) under :func:`saved_root` ``/<policy>/seed<k>``;
    the records (chunk times rounded to a microsecond) and the event log gzip-compressed."""
    out = []
    for r in runs:
        key = r.extra["gateway"]["key"]
        out.append(store_run_files(r, saved_root(kind, root) / key / f"seed{r.seed}"))
    return out


def load_saved(kind: str, keys: Sequence[str] = POLICY_KEYS, seeds: Optional[Sequence[int]] = None,
               root: Optional[Path] = None) -> list:
    """The saved runs of ``keys`` (every seed found, or ``seeds``), in ``keys``' order."""
    base = saved_root(kind, root)
    out = []
    for k in keys:
        d = base / k
        if not d.is_dir():
            raise FileNotFoundError(f"no saved gateway runs of policy {k!r} on {kind} under {d}")
        for p in sorted(d.glob("seed*"), key=lambda p: int(p.name[4:])):
            if seeds is None or int(p.name[4:]) in [int(s) for s in seeds]:
                out.append(load_run(p))
    return out


# --- what a run shows --------------------------------------------------------------------------------
def _events(run: Run) -> tuple:
    p = directory_of(run) / "gateway_events.jsonl"
    rows = read_jsonl(p if p.exists() else p.with_name(p.name + ".gz"))
    return rows[0], rows[1:]


def run_steps(run) -> pd.DataFrame:
    """The decode steps the gateway rebuilt from the run's streams (its event log): per step its
    time ``t_ms``, duration ``dt_ms`` and batch ``B`` (the sequences that emitted in it)."""
    _, events = _events(run)
    st = [e for e in events if e[0] == "step"]
    return pd.DataFrame({"t_ms": [e[1] for e in st], "dt_ms": [e[2] for e in st], "B": [len(e[3]) for e in st]})


def full_batch_step(run, steps: Optional[pd.DataFrame] = None) -> tuple:
    """``(fitted, measured)``: the run's fitted engine (``extra["sim_engine"]``) at a full batch
    and the median step the gateway rebuilt at that batch (ms; NaN if it saw none)."""
    eng = Engine(**run.extra["sim_engine"])
    st = run_steps(run) if steps is None else steps
    full = st.loc[st["B"] == eng.max_batch, "dt_ms"]
    return float(eng.iteration_ms(eng.max_batch)), float(full.median()) if len(full) else float("nan")


def window_ms(run: Run) -> tuple:
    """The run's load window on the gateway's clock (ms): ``[start, start + duration)``."""
    st = json.loads((directory_of(run) / "gateway.json").read_text())
    start = (run.summary["start_wall"] - st["t0_wall"]) * 1e3
    return start, start + run.duration_s * 1e3


def gate_at(run: Run, t_ms: Optional[float] = None):
    """The gateway's policy state at ``t_ms`` on its clock (default: the end of the load window),
    from its event log: a ``PolicyGate`` fed every event before then."""
    head, events = _events(run)
    t = window_ms(run)[1] if t_ms is None else t_ms
    return replay(head["spec"], [e for e in events if e[1] < t]), head["tenants"]


def simulate_measured_run(run: Run) -> Run:
    """The run's schedule on the fitted engine model under the run's policy, over its load window."""
    spec = fd.sim_spec(run)
    g = run.extra["gateway"]
    fd.check_same_schedule(run, spec)
    return simulate_run(spec, run.seed, g["policy"], horizon_ms=spec.duration_s * 1e3, **g["params"])


def _by_name(values, names_from: list, names: list) -> np.ndarray:
    m = dict(zip(names_from, values))
    return np.array([float(m.get(n, 0.0)) for n in names])


def share_rows(runs: Sequence[Run]) -> pd.DataFrame:
    """Per run and tenant: the machine share (%) measured, charged by the gateway and simulated
    (the module's docstring), the policy key and seed, and whether the run is valid."""
    rows = []
    for r in runs:
        names = list(r.tenant_names)
        meas = an.residency(r, "load", prefill="fitted")["share"].reindex(names).to_numpy(float)
        gate, gnames = gate_at(r)
        gm = _by_name(gate.tenant_state()["machine_ms"], gnames, names)
        sim = simulate_measured_run(r)
        sm = sim.sim_result.tenants.set_index("name")["share"].reindex(names).to_numpy(float)
        for i, n in enumerate(names):
            rows.append({"policy": r.extra["gateway"]["key"], "seed": r.seed, "tenant": n,
                         "measured": 100 * meas[i], "gateway": 100 * gm[i] / gm.sum(),
                         "simulated": 100 * sm[i], "valid": bool(r.summary.get("valid"))})
    out = pd.DataFrame(rows)
    out["difference"] = out["measured"] - out["simulated"]
    return out


def used_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows a chapter's tables use: per policy, those of its valid runs, or all of its rows
    when none of its runs is valid (the chapter's validity table says so), so that one policy's
    invalid runs neither enter the others' means nor remove the policy from the table."""
    keep = rows.groupby("policy", sort=False)["valid"].transform("any")
    return rows[rows["valid"] | ~keep]


def share_table(rows: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """Per policy and tenant, then per policy its max/min: the share (%) measured, charged by the
    gateway and simulated (means over the runs in ``rows``) and measured minus simulated."""
    parts = []
    for key, g in rows.groupby("policy", sort=False):
        m = g.groupby("tenant")[["measured", "gateway", "simulated"]].mean().reindex(list(names))
        mm = m.max() / m.min()
        m.loc["max/min"] = mm
        m["measured - simulated"] = m["measured"] - m["simulated"]
        m.index = pd.MultiIndex.from_product([[key], m.index], names=["policy", "tenant"])
        parts.append(m)
    return pd.concat(parts)


def validity_table(runs: Sequence[Run]) -> pd.DataFrame:
    """Per run: policy, seed, its validity (the client's schedule lag), and how many requests were
    answered, cut at the end of the window, or turned away (429) of those planned."""
    rows = []
    for r in runs:
        s, ec = r.summary, r.records["error_class"].value_counts()
        rows.append({"policy": r.extra["gateway"]["key"], "seed": r.seed, "valid": bool(s.get("valid")),
                     "lag p99 (ms)": (s.get("schedule_lag_ms") or {}).get("p99"), "planned": s["n_planned"],
                     "answered": int(ec.get("none", 0)), "cut at the window": int(ec.get("timeout", 0)),
                     "turned away (429)": int(ec.get("http_429", 0))})
    return pd.DataFrame(rows).set_index(["policy", "seed"])


def chapter_runs(backend: str, keys: Sequence[str], *, engine_kind: str = "vllm", endpoint: Optional[str] = None,
                 model: Optional[str] = None, fit_file=None, seeds: Sequence[int] = (0,),
                 duration_s: float = RECORD_DURATION_S, runs_dir="runs/gateway", log=print,
                 data_plane: str = "python") -> list:
    """What a chapter shows of the experiment: on ``sim`` the saved runs of ``keys``; on ``http``
    the policies measured now through a gateway on ``data_plane`` (:data:`DATA_PLANES`) in front of
    ``endpoint``, with a fit that describes it (``fairlib.calibrate.fit.fit_for_endpoint`` refuses
    one made for another engine, model, version or machine)."""
    check_data_plane(data_plane)
    if backend != "http":
        return load_saved(engine_kind, keys)
    if not endpoint:
        raise ValueError("backend='http' needs endpoint (the OpenAI base URL of the engine, e.g. http://127.0.0.1:8000/v1)")
    fitmod.fit_for_endpoint(fit_file, endpoint, engine_kind, model)
    path = fit_file or fitmod.fit_data_path(engine_kind)
    return measure(endpoint, engine_kind, path, seeds, duration_s, Path(runs_dir) / engine_kind, keys=keys,
                   model=model, log=log, data_plane=data_plane)


def share_chart(table: pd.DataFrame, alt, labels: dict, names: Sequence[str], title: str):
    """Measured, gateway and simulated share per tenant (dots), one row of panels per policy."""
    d = table.drop(index="max/min", level="tenant")[["measured", "gateway", "simulated"]]
    d = d.stack().rename("share").reset_index().rename(columns={"level_2": "source"})
    d["policy"] = d["policy"].map(labels)
    scale = alt.Scale(domain=["measured", "gateway", "simulated"], range=["#1a1a1a", "#6f6f6f", "#b0b0b0"])
    return alt.Chart(d, title=title).mark_point(filled=True, size=60).encode(
        x=alt.X("share:Q", title="share of the machine (%)", scale=alt.Scale(zero=False)),
        y=alt.Y("tenant:N", sort=list(names), title=None),
        color=alt.Color("source:N", scale=scale, title=None),
        shape=alt.Shape("source:N", scale=alt.Scale(domain=["measured", "gateway", "simulated"],
                                                    range=["circle", "square", "diamond"]), title=None),
        row=alt.Row("policy:N", sort=[labels[k] for k in table.index.unique("policy")], title=None),
    ).properties(width=420, height=90)


def noise(rows: pd.DataFrame) -> dict:
    """How much the measured-minus-simulated difference moves from seed to seed: the standard
    deviation over seeds of each (policy, tenant) difference, their median and max (points), and
    the largest |difference| of any single run."""
    sd = rows.groupby(["policy", "tenant"])["difference"].std(ddof=1)
    return {"sd_median": float(sd.median()), "sd_max": float(sd.max()),
            "abs_max": float(rows["difference"].abs().max()), "runs": int(rows[["policy", "seed"]]
                                                                      .drop_duplicates().shape[0])}


def counter_table(runs: Sequence[Run]) -> pd.DataFrame:
    """VTC runs: per run, at the end of the load window, the max/min of the policy's counters and
    of the machine split, from the gateway's log, beside the simulated ones."""
    rows = []
    for r in runs:
        names = list(r.tenant_names)
        gate, gnames = gate_at(r)
        c = _by_name(gate.counters(), gnames, names)
        m = _by_name(gate.tenant_state()["machine_ms"], gnames, names)
        sim = simulate_measured_run(r)
        sc = np.asarray(sim.sim_result.counters, float)
        st = sim.sim_result.tenants.set_index("name").reindex(names)
        rows.append({"seed": r.seed, "counter max/min (gateway)": c.max() / c.min(),
                     "machine max/min (gateway)": m.max() / m.min(),
                     "counter max/min (simulated)": sc.max() / sc.min(),
                     "machine max/min (simulated)": float(st["machine_ms"].max() / st["machine_ms"].min())})
    return pd.DataFrame(rows).set_index("seed")


def slot_cap_table(runs: Sequence[Run]) -> pd.DataFrame:
    """Slot-cap runs: per tenant, the share of decode time, of prefill time and of the whole machine
    (%), from the gateway's charges in the load window and simulated (means over the runs)."""
    parts = []
    for r in runs:
        names = list(r.tenant_names)
        gate, gnames = gate_at(r)
        ts = gate.tenant_state()
        d, p = _by_name(ts["decode_ms"], gnames, names), _by_name(ts["prefill_ms"], gnames, names)
        st = simulate_measured_run(r).sim_result.tenants.set_index("name").reindex(names)
        sd, sp = st["decode_ms"].to_numpy(float), st["prefill_ms"].to_numpy(float)
        parts.append(pd.DataFrame({
            "decode (gateway)": 100 * d / d.sum(), "decode (simulated)": 100 * sd / sd.sum(),
            "machine (gateway)": 100 * (d + p) / (d + p).sum(),
            "machine (simulated)": 100 * (sd + sp) / (sd + sp).sum(),
            "own prefill of machine (gateway)": 100 * p / (d + p).sum(),
            "own prefill of machine (simulated)": 100 * sp / (sd + sp).sum()}, index=pd.Index(names, name="tenant")))
    return pd.concat(parts).groupby(level="tenant", sort=False).mean()


def valid_of(runs: Sequence[Run], key: str) -> list:
    """The valid runs of the policy ``key``, or all of its runs when none is valid (a chapter then
    still shows them; its validity table says they are not)."""
    mine = [r for r in runs if r.extra["gateway"]["key"] == key]
    return [r for r in mine if r.summary.get("valid")] or mine


def quota_cost_table(runs: Sequence[Run]) -> pd.DataFrame:
    """Equal-quota runs, per tenant (means over the runs), from the gateway's log at the end of
    the load window: requests admitted, machine ms per admitted request, the share an equal count
    of such requests predicts (``cost_i / sum_j cost_j``, chapter 2's derivation) and the share
    the gateway charged, in %."""
    parts = []
    for r in runs:
        names = list(r.tenant_names)
        gate, gnames = gate_at(r)
        ts = gate.tenant_state()
        adm = _by_name(ts["admitted"], gnames, names)
        mach = _by_name(ts["machine_ms"], gnames, names)
        cost = np.divide(mach, adm, out=np.full(len(names), np.nan), where=adm > 0)
        parts.append(pd.DataFrame({"admitted": adm, "ms per request": cost,
                                   "cost-predicted share (%)": 100 * cost / np.nansum(cost),
                                   "gateway share (%)": 100 * mach / mach.sum()},
                                  index=pd.Index(names, name="tenant")))
    return pd.concat(parts).groupby(level="tenant", sort=False).mean()


# --- recording the book's data ------------------------------------------------------------------------
def fit_path_of(kind: str, root: Optional[Path] = None) -> Path:
    """The fit the saved runs of ``kind`` were measured with (made on their machine, just before)."""
    return saved_root(kind, root).parent / "fit.json"
