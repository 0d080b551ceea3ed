"""One run of a scenario on either backend: the single fork the command line and the chapters call.

    run = run_scenario(spec, seed=0)                                   # the engine model
    run = run_scenario(spec, seed=0, backend="http", endpoint="http://127.0.0.1:8000/v1",
                       run_dir="runs/x")                               # a live endpoint

Both backends get the same requests (``spec.requests(seed)``: arrivals, prompt and forced output
lengths) and return a ``fairlib.records.Run`` with the scenario in ``config["extra"]``, so every
metric (``fairlib.analysis``) is computed one way.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

from fairlib.client import EndpointConfig, build_schedule
from fairlib.client import run as client_run
from fairlib.client.endpoint import resolve_model
from fairlib.records import Run, load_run, simulate_run, write_run_dir
from fairlib.records.summary import MAX_ERROR_RATE
from fairlib.scenarios import ScenarioSpec, check_name

__all__ = ["BACKENDS", "run_scenario", "resolve_model", "default_run_dir"]

BACKENDS = ("sim", "http")


def default_run_dir(spec: ScenarioSpec, backend: str, seed: int) -> Path:
    """``runs/<scenario>/<backend>/seed<seed>``; ``ValueError`` for a scenario name that is not a
    plain name (``scenarios.check_name``) or a path that resolves outside ``runs/``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    check_name(spec.name, "scenario name")
    root = Path("runs")
    out = root / spec.name / backend / f"seed{seed}"
    if not out.resolve().is_relative_to(root.resolve()):
        raise ValueError(f"scenario name {spec.name!r}: the run directory {out} resolves to {out.resolve()}, "
                         f"outside {root.resolve()}")
    return out


def run_scenario(spec: ScenarioSpec, seed: int, backend: str = "sim", *, policy: Optional[str] = None,
                 policy_params: Optional[dict] = None, endpoint: Optional[str] = None, model: Optional[str] = None,
                 api: str = "completions", run_dir=None, send_priority: bool = False, ignore_eos: bool = True,
                 send_min_tokens: bool = False, server_policy: Optional[str] = None, lag_threshold_ms: float = 10.0,
                 workers: int = 1, timeout_s: float = 600.0, overwrite: bool = True, endpoint_config=None,
                 tokenizer=None, config_extra: Optional[dict] = None, scrape_metrics: bool = True,
                 handle_sigint: bool = False, max_error_rate: float = MAX_ERROR_RATE) -> Run:
    """One run of ``spec`` with ``seed``.

    ``sim``: the engine model under ``policy`` (default: the scenario's own, with its parameters
    updated by ``policy_params``; another policy gets ``policy_params`` only), records in memory,
    also written to ``run_dir`` when given. ``http``: the schedule sent open-loop to ``endpoint``
    (``model`` default: the first the endpoint lists), written to ``run_dir`` (required) as the
    run goes; ``server_policy`` is a label only (what the server is known to run);
    ``send_priority`` sends each tenant's priority (vLLM: only with ``--scheduling-policy
    priority``). ``endpoint_config``: a ``fairlib.client.EndpointConfig`` to send with instead of
    the one built from the arguments (an engine's own request settings:
    ``fairlib.calibrate.lifecycle.EngineProcess.endpoint_config``); ``tokenizer``: the served
    model's tokenizer, for prompts of exact token length; ``config_extra``: more to record in
    ``config.json``'s ``extra``; ``handle_sigint``: SIGINT (Ctrl-C), SIGTERM, SIGHUP and SIGQUIT
    stop the run cleanly, its summary.json saying so (the command line; a notebook kernel keeps
    its own handler); ``max_error_rate``: the share of failed answers above which the summary
    warns and ``fairlib run`` exits 3 (``fairlib.records.summary``)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "sim":
        pol = policy or spec.policy
        params = {**spec.policy_params, **(policy_params or {})} if policy is None else dict(policy_params or {})
        run = simulate_run(spec, seed, pol, api=api, **params)
        run.config["extra"] = {**(config_extra or {}), **run.config["extra"], "policy": pol}
        if run_dir is not None:
            write_run_dir(run.records, run_dir, run.config, run.summary, overwrite=overwrite)
            run.path = str(run_dir)
        return run
    if not endpoint and endpoint_config is None:
        raise ValueError("backend='http' needs endpoint= (the OpenAI base URL, e.g. http://127.0.0.1:8000/v1)")
    if run_dir is None:
        raise ValueError("backend='http' needs run_dir= (the run directory to write)")
    if endpoint_config is not None:
        cfg = replace(endpoint_config, api=api)
    else:
        cfg = EndpointConfig(base_url=endpoint, model=model or resolve_model(endpoint), api=api,
                             ignore_eos=ignore_eos, send_min_tokens=send_min_tokens, send_priority=send_priority,
                             timeout_s=timeout_s)
    schedule = build_schedule(spec.requests(seed), seed, api=api, tenant_names=list(spec.tenant_names),
                              tokenizer=tokenizer)
    extra = {**(config_extra or {}), "scenario": spec.to_dict(), "seed": int(seed), "backend": "http",
             "policy": server_policy}
    client_run(schedule, cfg, run_dir, workers=workers, lag_threshold_ms=lag_threshold_ms, config_extra=extra,
               overwrite=overwrite, handle_sigint=handle_sigint, scrape_metrics=scrape_metrics,
               max_error_rate=max_error_rate)
    return load_run(run_dir)
