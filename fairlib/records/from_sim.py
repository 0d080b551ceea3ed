"""The simulator's records: the same columns, config and summary as a measured run.

How a simulated request maps onto the record of a streamed HTTP request:

- sent at its arrival (``intended_send_s = actual_send_s = arrival_ms / 1000``, lag 0) on the
  same run clock (seconds from the run's start);
- every token is one chunk, emitted at the end of the iteration that produced it
  (``chunk_times_s``, ``chunk_tokens`` all 1): the iteration end times come from replaying the
  run one iteration at a time with ``fairlib.sim.online.OnlineEngine``, the compiled step that
  ``simulate`` drives, which reproduces ``simulate`` exactly (checked on every call);
- TTFT, TPOT and E2E by the client's definitions (first token - send, (E2E - TTFT) / (n - 1),
  last token - send); ``completion_tokens`` = tokens generated; ``usage`` as vLLM reports it;
- a policy's rejection at arrival (admission control, e.g. a quota) is ``http_429``, a request
  the engine could never run (over ``max_prefill_tokens`` or the KV capacity) ``http_4xx``
  (vLLM answers 400), a request cut off by a horizon ``interrupted``;
- ``server_timings`` keeps what only the simulator knows: ``queue_time_ms`` (admission - arrival,
  like vLLM's per-request metrics), ``charged_ms`` (residency charge) and ``preemptions``.

By default a simulation runs until every request finished (``horizon_ms=None``), as the client
waits for every response of its schedule.

    recs = simulate_records(spec, seed=0)                 # a DataFrame, columns RECORD_COLUMNS
    run = simulate_run(spec, seed=0)                      # records + config + summary (a Run)
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pandas as pd

from fairlib.records.run import Run, records_summary
from fairlib.records.schema import RECORD_FIELDS
from fairlib.scenarios import ScenarioSpec
from fairlib.sim import loop
from fairlib.sim.engine import Engine
from fairlib.sim.online import OnlineEngine
from fairlib.sim.policies import Policy, make_policy
from fairlib.sim.simulate import SimResult, collect, prepare

__all__ = ["trace_simulation", "from_simulation", "simulate_records", "simulate_run", "sim_config"]



# --- the simulator, one iteration at a time ---------------------------------------------------
def trace_simulation(requests, engine: Optional[Engine] = None, policy="fcfs", horizon_ms: Optional[float] = None,
                     n_tenants: Optional[int] = None, tenant_names=None, **params):
    """Run ``requests`` exactly as ``fairlib.simulate`` does, one iteration at a time, and record
    when every token was emitted.

    Returns ``(result, token_times)``: ``result`` is the ``SimResult`` (the same tables
    ``simulate`` returns, from the same compiled step); ``token_times[r]`` is the float64 array of
    the end times (ms) of the iterations in which request ``r`` emitted a token."""
    engine, pol, horizon_ms, cols, n_tenants = prepare(requests, engine, policy, horizon_ms, n_tenants, tenant_names,
                                                       params)
    n = len(cols["arrival_ms"])
    klass = cols["klass"].astype(np.int64) if "klass" in cols else np.zeros(n, np.int64)
    prio = cols["priority"].astype(np.int64) if "priority" in cols else klass
    est = cols["est_output_tokens"].astype(np.int64) if "est_output_tokens" in cols else np.zeros(n, np.int64)
    lo = min(-32, int(prio.min()) if n else 0)
    hi = max(32, int(prio.max()) if n else 0)
    eng = OnlineEngine(engine, pol, n_tenants=n_tenants, n_classes=max(4, int(klass.max()) + 1 if n else 1),
                       priority_levels=range(lo, hi + 1), capacity=max(n, 1))
    arr = cols["arrival_ms"].astype(float)
    ten = cols["tenant"].astype(np.int64)
    pr = cols["prompt_tokens"].astype(np.int64)
    out = cols["output_tokens"].astype(np.int64)
    for r in range(n):
        eng.submit(int(ten[r]), int(pr[r]), int(out[r]), float(arr[r]), est_output_tokens=int(est[r]),
                   klass=int(klass[r]), priority=int(prio[r]))
    ends, ids = [], []
    while eng.now_ms < horizon_ms:
        it = eng.step()
        if it.code == loop.ENDED:
            break
        if it.code == loop.RAN:
            ends.append(np.full(len(it.ran), it.end_ms))
            ids.append(it.ran)
    result = collect(cols, eng.S, n, engine, pol, eng.pf, horizon_ms, tenant_names)
    if ids:
        ids_a, ends_a = np.concatenate(ids), np.concatenate(ends)
        order = np.lexsort((ends_a, ids_a))
        ids_a, ends_a = ids_a[order], ends_a[order]
        cuts = np.searchsorted(ids_a, np.arange(n + 1))
        token_times = [ends_a[cuts[r]:cuts[r + 1]] for r in range(n)]
    else:
        token_times = [np.zeros(0) for _ in range(n)]
    return result, token_times


def _check_trace(result: SimResult, token_times) -> None:
    """The token times must agree with the result's own first-token, finish and token counts."""
    req = result.requests
    gen = req["generated"].to_numpy()
    counts = np.array([len(t) for t in token_times])
    if not np.array_equal(counts, gen):
        raise AssertionError("token trace disagrees with the simulation's token counts")
    first = np.array([t[0] if len(t) else np.nan for t in token_times])
    if not np.allclose(first, req["first_token_ms"].to_numpy(float), rtol=0, atol=1e-9, equal_nan=True):
        raise AssertionError("token trace disagrees with the simulation's first-token times")
    fin = req["finish_ms"].to_numpy(float)
    done = ~np.isnan(fin)
    last = np.array([t[-1] if len(t) else np.nan for t in token_times])
    if not np.allclose(last[done], fin[done], rtol=0, atol=1e-9):
        raise AssertionError("token trace disagrees with the simulation's finish times")


# --- records -----------------------------------------------------------------------------------
def _names_of(scenario, result: SimResult, n_tenants: int) -> list:
    if scenario is not None:
        names = getattr(scenario, "tenant_names", None)
        if names:
            return [str(x) for x in names]
    if result.tenant_names:
        return [str(x) for x in result.tenant_names]
    return [f"tenant{i}" for i in range(n_tenants)]


def _engine_rejects(engine: Engine, prompt, output) -> np.ndarray:
    too_long = np.zeros(len(prompt), dtype=bool)
    if engine.max_prefill_tokens is not None:
        too_long |= prompt > engine.max_prefill_tokens
    if engine.kv_capacity_tokens is not None:
        too_long |= prompt + output > engine.kv_capacity_tokens
    return too_long


def from_simulation(result: SimResult, scenario=None, seed: Optional[int] = None, token_times=None,
                    api: str = "completions") -> pd.DataFrame:
    """The records of a simulated run, with exactly the columns of a measured run
    (``RECORD_COLUMNS``; see the module docstring for the mapping).

    ``scenario``: a ``ScenarioSpec`` or ``Scenario`` (tenant names); ``seed`` is recorded in
    nothing here but kept for symmetry with the run's config. ``token_times``: per-request token
    emission times (ms) from :func:`trace_simulation`; when omitted the run is replayed to get
    them (it must reproduce ``result`` exactly, or this raises)."""
    if token_times is None:
        horizon = result.run.get("horizon_ms", math.inf)
        again, token_times = trace_simulation(result.requests[[c for c in result.requests.columns
                                                               if c in ("arrival_ms", "tenant", "prompt_tokens",
                                                                        "output_tokens", "est_output_tokens",
                                                                        "klass", "priority")]],
                                              result.engine, result.policy, None if math.isinf(horizon) else horizon,
                                              n_tenants=len(result.tenants), tenant_names=list(result.tenant_names))
    _check_trace(result, token_times)
    req = result.requests
    n = len(req)
    names = _names_of(scenario, result, len(result.tenants))
    arr = req["arrival_ms"].to_numpy(float)
    tenant = req["tenant"].to_numpy(np.int64)
    prompt = req["prompt_tokens"].to_numpy(np.int64)
    output = req["output_tokens"].to_numpy(np.int64)
    prio = req["priority"].to_numpy(np.int64) if "priority" in req else np.zeros(n, np.int64)
    rejected = req["rejected"].to_numpy(bool)
    engine_rej = rejected & _engine_rejects(result.engine, prompt, output)
    admitted = req["admitted_ms"].to_numpy(float)
    fin = req["finish_ms"].to_numpy(float)
    gen = req["generated"].to_numpy(np.int64)
    charged = req["charged_ms"].to_numpy(float)
    pre = req["preemptions"].to_numpy(np.int64)
    rows = []
    for r in range(n):
        send_s = float(arr[r]) / 1e3
        times = [float(x) / 1e3 for x in token_times[r]]
        finished = not np.isnan(fin[r])
        rec = dict.fromkeys(RECORD_FIELDS)
        rec.update(request_id=r, worker=0, tenant=int(tenant[r]), tenant_name=names[tenant[r]], priority=int(prio[r]),
                   api=api, prompt_tokens=int(prompt[r]), max_tokens=int(output[r]), intended_send_s=send_s,
                   actual_send_s=send_s, send_lag_ms=0.0, chunk_times_s=times, chunk_tokens=[1] * len(times),
                   n_token_chunks=len(times), done=False, tokens_source=None)
        if rejected[r]:
            if engine_rej[r]:
                rec.update(http_status=400, error_class="http_4xx",
                           error_message="HTTP 400: the engine can never run this request (prompt over "
                                         "max_prefill_tokens, or prompt + output over the KV capacity)")
            else:
                rec.update(http_status=429, error_class="http_429",
                           error_message=f"HTTP 429: rejected at arrival by policy {result.policy!r}")
            rec["end_s"] = send_s
        elif finished:
            rec.update(http_status=200, error_class="none", finish_reason="length", done=True,
                       completion_tokens=int(gen[r]), tokens_source="sim",
                       usage={"prompt_tokens": int(prompt[r]), "completion_tokens": int(gen[r]),
                              "total_tokens": int(prompt[r] + gen[r])})
        else:
            rec.update(http_status=200 if times else None, error_class="interrupted",
                       error_message="the simulation's horizon ended while the request was in flight")
        if not rejected[r]:
            rec["server_timings"] = {"queue_time_ms": None if np.isnan(admitted[r]) else float(admitted[r] - arr[r]),
                                     "charged_ms": float(charged[r]), "preemptions": int(pre[r])}
        if times:
            rec["first_token_s"], rec["last_token_s"] = times[0], times[-1]
            ttft = rec["ttft_s"] = times[0] - send_s
            rec["end_s"] = times[-1]
            if finished:
                e2e = rec["e2e_s"] = times[-1] - send_s
                if gen[r] > 1:
                    rec["tpot_s"] = (e2e - ttft) / (int(gen[r]) - 1)
        rows.append(rec)
    df = pd.DataFrame.from_records(rows, columns=list(RECORD_FIELDS)) if rows else pd.DataFrame(columns=list(RECORD_FIELDS))
    return df


def _resolve(scenario, policy, params):
    """(Scenario, ScenarioSpec or None, policy, params); params get the tenants' weights where the
    policy takes weights and params give none (``Scenario.policy_params``)."""
    spec = scenario if isinstance(scenario, ScenarioSpec) else None
    sc = spec.scenario if spec is not None else scenario
    if policy is None:
        if spec is not None:
            policy, params = spec.policy, {**spec.policy_params, **params}
        else:
            policy = "fcfs"
    return sc, spec, policy, sc.policy_params(policy, params)


def simulate_records(scenario, seed: int, policy=None, horizon_ms: Optional[float] = None, api: str = "completions",
                     **params) -> pd.DataFrame:
    """Simulate ``scenario`` (a ``ScenarioSpec`` or ``Scenario``) for ``seed`` under ``policy``
    (default: the spec's own policy, else FCFS) and return its records (``RECORD_COLUMNS``).
    ``horizon_ms=None`` runs until every request finished."""
    return simulate_run(scenario, seed, policy, horizon_ms=horizon_ms, api=api, **params).records


def simulate_run(scenario, seed: int, policy=None, horizon_ms: Optional[float] = None, api: str = "completions",
                 **params) -> Run:
    """Simulate one run of ``scenario`` for ``seed``: a :class:`Run` (records, config, summary and
    the ``SimResult``), ready for ``fairlib.analysis`` or :func:`write_run_dir`.

    The requests are ``scenario.requests(seed)``; ``fairlib.simulate`` runs them with a token
    trace, so that every record has the same fields as a measured one (``from_simulation``). A
    policy taking weights gets the tenants' ``weight`` fields when ``params`` give none
    (``Scenario.policy_params``).

    Parameters
    ----------
    scenario : ScenarioSpec or Scenario
        What to run (``fairlib.scenarios.load``, or a bare ``fairlib.workload.Scenario``).
    seed : int
        The seed of its requests.
    policy : str or Policy, optional
        The simulator's policy (``make_policy``); ``None`` is the spec's own policy (with its
        ``policy_params`` under ``params``), else ``"fcfs"``.
    horizon_ms : float, optional
        Simulated time (ms, > 0) at which the run stops; ``None`` runs until every request
        finished (those in flight at the horizon are recorded ``interrupted``).
    api : {"completions", "chat"}, default "completions"
        The ``api`` the records name (what a measured run would have sent).
    **params
        The policy's parameters.

    Returns
    -------
    Run
        ``records`` (``RECORD_COLUMNS``; requests a policy rejected are ``http_429``, those the
        engine can never run ``http_4xx``), ``config`` (``sim_config``: ``backend="sim"``, the
        engine, the policy, the scenario in ``extra``), ``summary`` (``records_summary``),
        ``path=None`` and ``sim``.

    Raises
    ------
    ValueError
        For what ``fairlib.simulate`` refuses (an unknown policy or parameter, a bad horizon).
    """
    sc, spec, policy, params = _resolve(scenario, policy, params)
    req = sc.requests(seed)
    result, times = trace_simulation(req, sc.engine, policy, horizon_ms, tenant_names=list(sc.tenant_names), **params)
    records = from_simulation(result, spec or sc, seed, token_times=times, api=api)
    a = req["arrival_ms"].to_numpy(float)
    requested = (len(a) - 1) / ((a[-1] - a[0]) / 1e3) if len(a) > 1 and a[-1] > a[0] else None
    config = sim_config(spec or sc, seed, result.policy, horizon_ms, len(records), api=api,
                        requested_rate_rps=requested)
    return Run(records, config, records_summary(records, config), path=None, sim=result)


def sim_config(scenario, seed: int, policy, horizon_ms, n_requests: int, api: str = "completions",
               requested_rate_rps: Optional[float] = None) -> dict:
    """The ``config.json`` of a simulated run: shaped like the client's (``schedule``,
    ``lag_threshold_ms``, ``extra``) plus the engine and the policy. ``requested_rate_rps``: as
    the client computes it, ``(n - 1) / span`` of the planned send times (default: the
    scenario's nominal total rate)."""
    if isinstance(scenario, ScenarioSpec):
        scen = scenario.to_dict()
        sc = scenario.scenario
    else:
        sc = scenario
        scen = {"name": sc.name, "description": sc.description, "duration_s": sc.duration_s,
                "engine": sc.engine.to_dict(),
                "tenants": [{"name": t.name, "rate_rps": float(r)} for t, r in zip(sc.tenants, sc.rates_rps())]}
    pol = policy if isinstance(policy, Policy) else make_policy(policy)
    if requested_rate_rps is None:
        requested_rate_rps = float(sum(t["rate_rps"] for t in scen["tenants"]))
    return {
        "backend": "sim",
        "engine": sc.engine.to_dict(),
        "policy": {"name": pol.name, "params": {k: (list(v) if isinstance(v, (tuple, np.ndarray)) else v)
                                                for k, v in pol.values.items()}},
        "horizon_ms": None if horizon_ms is None or math.isinf(horizon_ms) else float(horizon_ms),
        "lag_threshold_ms": 10.0,
        "schedule": {"n_requests": int(n_requests), "duration_s": sc.duration_s, "requested_rate_rps": requested_rate_rps,
                     "meta": {"seed": int(seed), "api": api, "tenant_names": list(sc.tenant_names)}},
        "extra": {"backend": "sim", "seed": int(seed), "scenario": scen, "policy": pol.name},
    }
