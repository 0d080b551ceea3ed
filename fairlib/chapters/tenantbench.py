"""Run the tenantbench scenarios on either backend and tabulate them (chapter 7's engine room).

    from fairlib.chapters import tenantbench
    specs = tenantbench.load_scenarios(["fair_share", "noisy_neighbor", "victim_baseline"], duration_s=30)
    runs = tenantbench.run_all(specs, seeds=[0, 1], backend="sim")              # the engine model
    runs = tenantbench.run_all(specs, seeds=[0], backend="http", endpoint="http://127.0.0.1:8000/v1",
                               runs_dir="runs/ch07")                              # a live endpoint
    results = tenantbench.analyze_all(runs)                                       # fairlib.analysis

One schedule per (scenario, seed) whichever the backend: ``spec.requests(seed)`` is what the
simulator runs and what ``fairlib.client.build_schedule`` turns into HTTP requests (same arrivals,
same lengths, forced output lengths). A simulated run gives its records in memory
(``fairlib.records.simulate_run``); a measured run writes a run directory (``fairlib.client.measure``)
that is read back (``fairlib.records.load_run``). Both carry the scenario in
``config["extra"]["scenario"]``, so ``fairlib.analysis`` computes every number the same way.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from fairlib import analysis as an
from fairlib.backend import HttpOptions, SimOptions, run_scenario
from fairlib.calibrate import fit as fitmod
from fairlib.chapters import fidelity as fd
from fairlib.client.endpoint import server_root
from fairlib.client.env import fetch_json
from fairlib.kinds import EngineKind
from fairlib.records import Run
from fairlib.scenarios import ScenarioSpec, available, load

__all__ = ["as_list", "load_scenarios", "endpoint_specs", "scenario_overview", "run_all", "analyze_all",
           "per_tenant", "fairness_overview", "goodput_overview", "validity_overview", "victim_overview",
           "exact_vs_reconstructed", "label"]


def as_list(value, name: str = "value"):
    """A list parameter as papermill may deliver it: a list, ``None``, or its text (papermill's
    ``-p`` passes ``"[0, 1]"`` as a string; ``-y`` passes YAML): ``"[0, 1]"``, ``"0,1"``, ``"a"``."""
    if value is None or isinstance(value, (list, tuple)):
        return None if value is None else list(value)
    if isinstance(value, (int, float)):
        return [value]
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                return list(ast.literal_eval(text))
            except (ValueError, SyntaxError):
                raise ValueError(f"{name}: cannot read {value!r} as a list") from None
        items = [x.strip().strip("'\"") for x in text.split(",") if x.strip()]
        return [int(x) if x.lstrip("-").isdigit() else x for x in items]
    raise ValueError(f"{name} must be a list, got {value!r}")


def load_scenarios(names: Optional[Sequence[str]] = None, duration_s: Optional[float] = None, rho=None,
                   capacity=None, engine=None) -> list:
    """The scenario files (all shipped ones by default) as ``ScenarioSpec``s, with one run length."""
    names = list(available() if names is None else names)
    return [load(n, engine=engine, rho=rho, capacity=capacity, duration_s=duration_s) for n in names]


def _served_engine(base: str) -> Optional[dict]:
    """The engine model ``fairlib serve`` runs, as it reports it (``GET /fairlib/stats``)."""
    st = fetch_json(server_root(base) + "/fairlib/stats")
    body = st.get("body")
    eng = ((body.get("config") or {}).get("engine") if isinstance(body, dict) else None)
    return eng if isinstance(eng, dict) else None


def endpoint_specs(names: Optional[Sequence[str]], endpoint: str, *, duration_s: Optional[float] = None,
                   fit_file=None, engine_kind: Optional[str] = None, model: Optional[str] = None,
                   capacity=None) -> tuple:
    """``(specs, fit_info)``: the scenarios (all shipped ones by default) for a live endpoint, each
    load relative to *that* engine's capacity. The engine is the fit of the endpoint
    (``fit_file``, default the committed ``data/engines/<kind>.json``), checked by
    ``fairlib.calibrate.fit.fit_for_endpoint``: a fit made for another engine kind, model, server
    version or (the committed default) machine is refused with the command that fits the endpoint.
    Each scenario takes the fitted engine at its own mean decode context, as chapter 8 does
    (``fairlib.chapters.fidelity.scenario_spec``). ``fairlib serve`` (a test double) reports the
    engine model it runs, which is then used without a fit (unless ``fit_file`` is given).
    ``capacity`` belongs to the simulator: on a live endpoint anything but ``None`` is refused, so
    that no load is set relative to an engine the endpoint was not checked against."""
    base = fitmod.normalise_url(endpoint)
    if capacity is not None:
        raise ValueError(
            f"backend='http': `capacity` ({capacity!r}) is for backend='sim'; on a live endpoint the "
            "load is relative to the endpoint's own fitted cost model, checked against it: pass "
            "fit_file (papermill -r fit_file PATH), made by\n    "
            + fitmod.fit_command(base, kind=engine_kind, model=model))
    names = list(available() if names is None else names)
    ident = fitmod.server_identity(base, model)
    if fit_file is None and ident["kind"] == EngineKind.FAIRLIB and engine_kind in (None, EngineKind.FAIRLIB):
        eng = _served_engine(base)
        if eng is not None:
            specs = load_scenarios(names, duration_s, capacity={"engine": eng})
            return specs, {"file": None, "engine": eng, "source": f"GET {server_root(base)}/fairlib/stats",
                           "date": None}
    fit = fitmod.fit_for_endpoint(fit_file, base, engine_kind, model)
    specs = [fd.scenario_spec(fit, n, duration_s)[0] for n in names]
    path = fit_file or fitmod.fit_data_path(fit.get("engine_kind") or engine_kind or ident["kind"])
    return specs, {"file": str(path), "date": fit.get("date"), "source": "fit_file"}


def scenario_overview(specs: Sequence[ScenarioSpec]) -> pd.DataFrame:
    """One row per (scenario, tenant): offered load, request rate, mean lengths, SLOs, priority."""
    rows = []
    for s in specs:
        d = s.to_dict()
        for t in d["tenants"]:
            rows.append({"scenario": s.name, "tenant": t["name"], "offered load (rho share)": t["offered_load"],
                         "requests/s": t["rate_rps"], "mean prompt": t["mean_prompt"],
                         "mean output": t["mean_output"], "arrivals": t["arrival"].split("(")[0],
                         "TTFT SLO (ms)": t["ttft_slo_ms"], "TPOT SLO (ms)": t["tpot_slo_ms"],
                         "priority": t["priority"]})
    return pd.DataFrame(rows).set_index(["scenario", "tenant"])


def label(policy: Optional[str]) -> str:
    return policy or "server"


def run_all(specs: Sequence[ScenarioSpec], seeds: Sequence[int], backend: str = "sim", *,
            runs_dir: Optional[str] = None, extra_policies: Optional[dict] = None, **kw) -> list:
    """Every scenario x seed (``fairlib.backend.run_scenario``); on ``sim`` also each scenario under the extra
    policies ``extra_policies[name]`` (a list of policy names). Run directories go to
    ``runs_dir/<scenario>/<policy>/seed<k>`` (``http``: required)."""
    if backend == "http" and runs_dir is None:
        raise ValueError("run_all: backend='http' needs runs_dir (the measured runs are written as they go)")
    runs = []
    for spec in specs:
        pols = [None]
        if backend == "sim" and extra_policies and spec.name in extra_policies:
            pols += list(extra_policies[spec.name])
        for pol in pols:
            for seed in seeds:
                rd: Optional[Path] = None
                if runs_dir is not None:
                    tag = pol or (spec.policy if backend == "sim" else label(kw.get("server_policy")))
                    rd = Path(runs_dir) / spec.name / tag / f"seed{seed}"
                opts = (SimOptions(policy=pol, run_dir=rd, **kw) if backend == "sim" or rd is None
                        else HttpOptions(run_dir=rd, **kw))
                runs.append(run_scenario(spec, seed, opts))
    return runs


def _policy_of(run: Run) -> str:
    return label(run.extra.get("policy"))


def analyze_all(runs: Sequence[Run], n_boot: int = 500, window_s: float = 10.0) -> dict:
    """``{(scenario, policy): [RunAnalysis per seed]}``, in the order the runs came."""
    out: dict = {}
    for r in runs:
        out.setdefault((r.name, _policy_of(r)), []).append(an.analyze_run(r, n_boot=n_boot, window_s=window_s))
    return out


def per_tenant(results: dict, columns: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """The per-tenant tables (means over seeds), stacked: index (scenario, policy, tenant)."""
    parts = []
    for (name, pol), analyses in results.items():
        t = an.combine(analyses)
        t.index = pd.MultiIndex.from_product([[name], [pol], list(t.index)], names=["scenario", "policy", "tenant"])
        parts.append(t)
    out = pd.concat(parts)
    return out[list(columns)] if columns is not None else out


def goodput_overview(results: dict) -> pd.DataFrame:
    """SLO attainment, goodput and starvation per (scenario, policy, tenant), means over seeds."""
    return per_tenant(results, ["requests", "completed", "goodput_rps", "slo_attainment_pct", "starved_pct"])


def fairness_overview(results: dict) -> pd.DataFrame:
    """Jain (raw and demand-normalised) and max/min over token-weighted service and residency,
    means over seeds; the lowest windowed Jain seen."""
    rows = []
    for (name, pol), analyses in results.items():
        f = an.fairness_table(analyses)
        num = f.drop(columns=["scenario", "seed", "backend"]).mean()
        rows.append({"scenario": name, "policy": pol, **num.to_dict()})
    return pd.DataFrame(rows).set_index(["scenario", "policy"])


def validity_overview(results: dict) -> pd.DataFrame:
    """Every run's validity: schedule lag, requested vs achieved rate, errors."""
    parts = []
    for (_name, pol), analyses in results.items():
        v = an.validity_table(analyses)
        v.insert(1, "policy", pol)
        parts.append(v)
    cols = ["scenario", "policy", "seed", "backend", "valid", "lag_p50_ms", "lag_p99_ms", "threshold_ms",
            "requested_rps", "achieved_rps", "n_planned", "n_ok", "errors"]
    return pd.concat(parts, ignore_index=True)[cols].set_index(["scenario", "policy", "seed"])


def victim_overview(results: dict, n_boot: int = 500) -> Optional[pd.DataFrame]:
    """Victim degradation for every scenario that names a victim and whose baseline ran."""
    parts = []
    by_name: dict = {}
    for (name, _pol), analyses in results.items():
        by_name.setdefault(name, []).extend(a.run for a in analyses)
    for (name, pol), analyses in results.items():
        scen = analyses[0].run.scenario
        base = scen.get("baseline")
        if scen.get("victim") and base in by_name:
            vd = an.victim_degradation([a.run for a in analyses], by_name[base], scen["victim"], n_boot=n_boot)
            vd.index = pd.MultiIndex.from_product([[name], [pol], [scen["victim"]], list(vd.index)],
                                                  names=["scenario", "policy", "victim", "metric"])
            parts.append(vd)
    return pd.concat(parts) if parts else None


def exact_vs_reconstructed(results: dict) -> Optional[pd.DataFrame]:
    """Simulated runs only: each tenant's residency share rebuilt from the stream timings over the
    whole run, with prefill split equally and with prefill priced by the fitted iteration cost
    (``fairlib.analysis.residency``), next to the simulator's exact residency charge
    (``machine_ms``: prefill charged to the request that caused it) and its decode part; means
    over seeds (%)."""
    rows = []
    for (name, pol), analyses in results.items():
        for a in analyses:
            if a.run.sim is None:
                continue
            iv = an.build_intervals(a.run.records, a.run.tenant_names)          # built once for both
            rec = an.residency(a.run, window="all", intervals=iv)
            fit = an.residency(a.run, window="all", prefill="fitted", intervals=iv)
            ten = a.run.sim.tenants.set_index("name")
            dec = ten["decode_ms"] / ten["decode_ms"].sum()
            for t in rec.index:
                rows.append({"scenario": name, "policy": pol, "tenant": t, "seed": a.seed,
                             "exact (machine_ms)": 100 * ten.loc[t, "share"],
                             "exact, decode part": 100 * dec.loc[t],
                             "equal split": 100 * rec.loc[t, "share"],
                             "prefill fitted": 100 * fit.loc[t, "share"]})
    if not rows:
        return None
    d = pd.DataFrame(rows)
    cols = ["exact (machine_ms)", "exact, decode part", "equal split", "prefill fitted"]
    out = d.groupby(["scenario", "policy", "tenant"], sort=False)[cols].mean()
    out["equal split - exact"] = out["equal split"] - out["exact (machine_ms)"]
    out["fitted - exact"] = out["prefill fitted"] - out["exact (machine_ms)"]
    return out
