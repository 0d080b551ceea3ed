"""One run of a scenario on either backend: the single fork the command line and the chapters call.

    run = run_scenario(spec, seed=0)                                   # the engine model
    run = run_scenario(spec, 0, SimOptions(policy="vtc"))              # ... under another policy
    run = run_scenario(spec, 0, HttpOptions(endpoint="http://127.0.0.1:8000/v1",
                                            run_dir="runs/x"))         # a live endpoint

The options say which backend runs it (:class:`SimOptions`: the engine model; :class:`HttpOptions`:
a live OpenAI-compatible endpoint), each field commented and checked once, when the options are
made. Both backends get the same requests (``spec.requests(seed)``: arrivals, prompt and forced
output lengths) and return a ``fairlib.records.Run`` with the scenario in ``config["extra"]``, so
every metric (``fairlib.analysis``) is computed one way.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from fairlib.client import EndpointConfig, build_schedule
from fairlib.client import run as client_run
from fairlib.client.endpoint import resolve_model
from fairlib.client.measure import RunOptions
from fairlib.client.schedule import APIS
from fairlib.records import Run, load_run, simulate_run, write_run_dir
from fairlib.records.run import default_label
from fairlib.records.summary import MAX_ERROR_RATE
from fairlib.scenarios import ScenarioSpec, check_name
from fairlib.sim.policies import POLICIES

__all__ = ["Backend", "BACKENDS", "SimOptions", "HttpOptions", "run_scenario", "resolve_model",
           "default_run_dir", "options_for"]


class Backend(str, Enum):
    """Where a run happens: ``sim``, the engine model; ``http``, a live OpenAI-compatible endpoint."""

    SIM = "sim"
    HTTP = "http"


BACKENDS = tuple(b.value for b in Backend)
PathLike = Union[str, "os.PathLike[str]"]


def _api(owner: str, api: str) -> None:
    if api not in APIS:
        raise ValueError(f"{owner}.api must be one of {APIS}, got {api!r}")


@dataclass(frozen=True)
class SimOptions:
    """A run on the engine model (``fairlib.records.simulate_run``); records in memory."""

    #: a policy of ``fairlib.sim.policies.POLICIES``; ``None``: the scenario's own
    policy: Optional[str] = None
    #: with ``policy``: its parameters alone; without: updates to the scenario's own parameters
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    #: the API the records name (``"completions"`` or ``"chat"``)
    api: str = "completions"
    #: also written to this run directory when given
    run_dir: Optional[PathLike] = None
    #: replace a run directory that exists
    overwrite: bool = True
    #: more for ``config.json``'s ``extra`` (a ``"label"`` names the setup; default ``sim:<policy>``)
    config_extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.policy is not None and self.policy not in POLICIES:
            raise ValueError(f"SimOptions.policy must be one of {sorted(POLICIES)} (or None: the scenario's "
                             f"own), got {self.policy!r}")
        if not isinstance(self.policy_params, Mapping):
            raise ValueError(f"SimOptions.policy_params must be a mapping, got {self.policy_params!r}")
        _api("SimOptions", self.api)


@dataclass(frozen=True)
class HttpOptions:
    """A run against a live endpoint (``fairlib.client.run``): the schedule sent open-loop, the
    run directory written as the run goes."""

    #: the run directory (required: nothing measured is kept only in memory)
    run_dir: PathLike
    #: the OpenAI base URL (``http://HOST:PORT/v1``); or give ``endpoint_config``
    endpoint: Optional[str] = None
    #: the served model; default: the first the endpoint lists
    model: Optional[str] = None
    #: ``"completions"`` or ``"chat"``
    api: str = "completions"
    #: send with this ``fairlib.client.EndpointConfig`` instead of one built from the fields here
    #: (an engine's own request settings: ``EngineProcess.endpoint_config``); its api is set to ``api``
    endpoint_config: Optional[EndpointConfig] = None
    #: send each tenant's priority (vLLM: only with ``--scheduling-policy priority``)
    send_priority: bool = False
    #: ask the engine to ignore end-of-sequence, so each answer has its planned length
    ignore_eos: bool = True
    #: send ``min_tokens`` equal to ``max_tokens`` as well
    send_min_tokens: bool = False
    #: a request's whole deadline (s), without ``endpoint_config``
    timeout_s: float = 600.0
    #: what the server is known to run: a label only (default label ``http:<server_policy>``)
    server_policy: Optional[str] = None
    #: the served model's tokenizer, for prompts of exact token length
    tokenizer: Any = None
    #: client processes (1: in this process)
    workers: int = 1
    #: the p99 schedule lag (ms) above which the run is invalid (the client fell behind)
    lag_threshold_ms: float = 10.0
    #: the share of failed answers (0 to 1) above which the run is invalid
    max_error_rate: float = MAX_ERROR_RATE
    #: sample the endpoint's /metrics through the run
    scrape_metrics: bool = True
    #: SIGINT, SIGTERM, SIGHUP and SIGQUIT stop the run cleanly, its summary saying so (the command
    #: line; a notebook kernel keeps its own handler)
    handle_sigint: bool = False
    #: replace a run directory that exists
    overwrite: bool = True
    #: more for ``config.json``'s ``extra``
    config_extra: Mapping[str, Any] = field(default_factory=dict)
    #: the client's preflight and progress (``fairlib.client.measure.RunOptions``)
    client: RunOptions = field(default_factory=RunOptions)

    def __post_init__(self):
        if self.run_dir is None:
            raise ValueError("HttpOptions.run_dir is required (the run directory to write)")
        if not self.endpoint and self.endpoint_config is None:
            raise ValueError("HttpOptions needs endpoint (the OpenAI base URL, e.g. http://127.0.0.1:8000/v1) "
                             "or endpoint_config")
        _api("HttpOptions", self.api)
        for name in ("timeout_s", "lag_threshold_ms"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"HttpOptions.{name} must be a number > 0, got {v!r}")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"HttpOptions.workers must be an integer >= 1, got {self.workers!r}")
        if not 0.0 <= float(self.max_error_rate) <= 1.0:
            raise ValueError(f"HttpOptions.max_error_rate must be between 0 and 1, got {self.max_error_rate!r}")


def options_for(backend: str, **fields) -> Union[SimOptions, HttpOptions]:
    """The options of ``backend`` (``"sim"`` or ``"http"``) from keyword fields (a chapter's
    parameters); an unknown field is a ``TypeError`` naming it."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return SimOptions(**fields) if backend == Backend.SIM.value else HttpOptions(**fields)


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


def run_scenario(spec: ScenarioSpec, seed: int, options: Union[SimOptions, HttpOptions, None] = None) -> Run:
    """One run of ``spec`` with ``seed``, on the backend ``options`` names (default: the engine
    model under the scenario's own policy).

    Parameters
    ----------
    spec : ScenarioSpec
        The scenario (``fairlib.scenarios.load``).
    seed : int
        The seed of its requests (``spec.requests(seed)``).
    options : SimOptions or HttpOptions, optional
        How and where it runs; ``None`` is ``SimOptions()``.

    Returns
    -------
    Run
        The records, config and summary. Every run records a ``label`` in ``config.json``'s
        ``extra``, the setup it measured, which ``fairlib analyze`` groups by:
        ``config_extra["label"]`` when given, else ``fairlib.records.run.default_label``.

    Raises
    ------
    ValueError
        For options of neither kind (their own fields are checked when they are made).
    """
    opts = SimOptions() if options is None else options
    if isinstance(opts, SimOptions):
        return _simulate(spec, seed, opts)
    if isinstance(opts, HttpOptions):
        return _measure(spec, seed, opts)
    raise ValueError(f"options must be SimOptions or HttpOptions, got {type(options).__name__}")


def _simulate(spec: ScenarioSpec, seed: int, o: SimOptions) -> Run:
    pol = o.policy or spec.policy
    params = {**spec.policy_params, **o.policy_params} if o.policy is None else dict(o.policy_params)
    run = simulate_run(spec, seed, pol, api=o.api, **params)
    run.config["extra"] = {**o.config_extra, **run.config["extra"], "policy": pol}
    run.config["extra"].setdefault("label", default_label("sim", pol))
    if o.run_dir is not None:
        write_run_dir(run.records, o.run_dir, run.config, run.summary, overwrite=o.overwrite)
        run.path = str(o.run_dir)
    return run


def _measure(spec: ScenarioSpec, seed: int, o: HttpOptions) -> Run:
    if o.endpoint_config is not None:
        cfg = replace(o.endpoint_config, api=o.api)
    else:
        assert o.endpoint is not None   # HttpOptions: endpoint or endpoint_config
        cfg = EndpointConfig(base_url=o.endpoint, model=o.model or resolve_model(o.endpoint), api=o.api,
                             ignore_eos=o.ignore_eos, send_min_tokens=o.send_min_tokens,
                             send_priority=o.send_priority, timeout_s=o.timeout_s)
    schedule = build_schedule(spec.requests(seed), seed, api=o.api, tenant_names=list(spec.tenant_names),
                              tokenizer=o.tokenizer)
    extra = {**o.config_extra, "scenario": spec.to_dict(), "seed": int(seed), "backend": "http",
             "policy": o.server_policy}
    extra.setdefault("label", default_label("http", o.server_policy, cfg.plain_base_url))
    client_run(schedule, cfg, o.run_dir, workers=o.workers, lag_threshold_ms=o.lag_threshold_ms,
               config_extra=extra, overwrite=o.overwrite, handle_sigint=o.handle_sigint,
               scrape_metrics=o.scrape_metrics, max_error_rate=o.max_error_rate, options=o.client)
    return load_run(o.run_dir)
