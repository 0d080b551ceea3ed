"""A run of either backend in memory (``Run``) and on disk (the run directory).

A measured run (``fairlib.client.measure``) writes a run directory whose ``records.jsonl`` holds one
record per request (``fairlib.records.schema.RECORD_FIELDS``); ``load_records`` reads it back.
The simulator's records (``fairlib.records.from_sim``) have the SAME columns, so the analysis has
one code path for both backends:

    write_run_dir(run.records, "runs/x", run.config, run.summary)   # the client's files
    run = load_run("runs/x")                              # either backend's run directory
"""
from __future__ import annotations

import math
import os
import platform
import socket
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

import numpy as np
import pandas as pd

from fairlib.records.rundir import RunDir, load_records, read_json, records_path
from fairlib.records.schema import RECORD_FIELDS
from fairlib.records.summary import MAX_ERROR_RATE, error_messages, summarize
from fairlib.sim.simulate import SimResult

__all__ = ["RECORD_COLUMNS", "Run", "backend_of", "default_label", "write_run_dir", "load_run", "records_summary",
           "directory_of"]

#: The columns of a run's records, either backend (``load_records``, ``from_simulation``): the record fields.
RECORD_COLUMNS = tuple(RECORD_FIELDS)


def backend_of(config: Optional[dict], summary: Optional[dict] = None, has_sim: bool = False) -> str:
    """The backend a run records, first found of: ``config["extra"]["backend"]``,
    ``config["backend"]``, ``summary["backend"]``, ``"sim"`` for a run holding the simulator's
    result (``has_sim``), ``"http"`` for a config naming the client's ``endpoint``; else
    ``"unknown"`` (never a guess)."""
    config = config or {}
    for b in ((config.get("extra") or {}).get("backend"), config.get("backend"), (summary or {}).get("backend")):
        if b and b != "unknown":
            return str(b)
    if has_sim:
        return "sim"
    if config.get("endpoint"):
        return "http"
    return "unknown"


def default_label(backend: str, policy: Optional[str] = None, endpoint: Optional[str] = None) -> str:
    """The setup a run measured, when it names none (``--label``): ``<backend>:<policy>`` (the
    simulator's policy, or the ``--server-policy`` a measured run was told), else for a measured
    run ``http:<host:port>`` of its endpoint (a gateway and the engine behind it differ there),
    else the backend alone."""
    if policy:
        return f"{backend}:{policy}"
    if endpoint:
        host = urlsplit(str(endpoint)).netloc.rpartition("@")[2]
        if host:
            return f"{backend}:{host}"
    return str(backend)


@dataclass
class Run:
    """One run of either backend: its records, resolved configuration and summary.

    ``config["extra"]["scenario"]`` holds the scenario (``ScenarioSpec.to_dict()``: SLOs, tenant
    names, duration, victim); ``config["extra"]["backend"]`` is ``"sim"`` or ``"http"``
    (:attr:`backend` reads it, or whatever else the run records: :func:`backend_of`). The
    properties read the config: ``name``, ``seed``, ``label``, ``tenant_names``, ``slos``
    (tenant -> ``(ttft_ms, tpot_ms)``) and ``duration_s`` (the load window, s).

    Parameters
    ----------
    records : pandas.DataFrame
        One row per request, the columns :data:`RECORD_COLUMNS` (``load_records``,
        ``from_simulation``).
    config : dict, optional
        The run's ``config.json`` (default empty).
    summary : dict, optional
        The run's ``summary.json`` (default empty; :func:`records_summary` makes one).
    path : str, optional
        The run directory it was read from or written to; ``None`` for a run only in memory.
    sim : SimResult, optional
        The simulator's own result, for a simulated run in memory.
    """

    records: pd.DataFrame
    config: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
    path: Optional[str] = None
    sim: Optional[SimResult] = None   # the simulator's own result, for a simulated run in memory

    @property
    def dir(self) -> Path:
        """The run directory (``ValueError`` for a run only in memory): :func:`directory_of`."""
        return directory_of(self)

    @property
    def sim_result(self) -> SimResult:
        """The simulator's own result (``ValueError`` for a measured or a reloaded run)."""
        if self.sim is None:
            raise ValueError(f"run {self.name!r} carries no SimResult (only a simulated run in memory does)")
        return self.sim

    @property
    def extra(self) -> dict:
        return self.config.get("extra") or {}

    @property
    def scenario(self) -> dict:
        return self.extra.get("scenario") or {}

    @property
    def name(self) -> str:
        return self.scenario.get("name") or (Path(self.path).name if self.path else "run")

    @property
    def seed(self):
        return self.extra.get("seed", (self.config.get("schedule") or {}).get("meta", {}).get("seed"))

    @property
    def backend(self) -> str:
        """``"sim"``, ``"http"`` (or another name the config gives), ``"unknown"`` when the run
        records none: :func:`backend_of`."""
        return backend_of(self.config, self.summary, self.sim is not None)

    @property
    def label(self) -> str:
        """The setup this run measured: ``config.json``'s ``extra.label`` (``--label``), else
        :func:`default_label` of its backend, policy and endpoint (runs made before labels)."""
        if self.extra.get("label"):
            return str(self.extra["label"])
        pol = self.config.get("policy")
        pol = self.extra.get("policy") or (pol.get("name") if isinstance(pol, dict) else pol)
        return default_label(self.backend, pol, (self.config.get("endpoint") or {}).get("base_url"))

    @property
    def tenant_names(self) -> list:
        if self.scenario.get("tenants"):
            return [t["name"] for t in self.scenario["tenants"]]
        meta = (self.config.get("schedule") or {}).get("meta") or {}
        if meta.get("tenant_names"):
            return list(meta["tenant_names"])
        r = self.records
        pairs = r[["tenant", "tenant_name"]].drop_duplicates().sort_values("tenant")
        return [str(n) for n in pairs["tenant_name"]]

    @property
    def slos(self) -> dict:
        """tenant name -> (ttft_ms, tpot_ms); empty when the config carries no scenario."""
        return {t["name"]: (float(t["ttft_slo_ms"]), float(t["tpot_slo_ms"]))
                for t in self.scenario.get("tenants", []) if t.get("ttft_slo_ms") is not None}

    @property
    def duration_s(self) -> float:
        """The load window (the scenario's duration), else the span of intended sends."""
        d = self.scenario.get("duration_s")
        if d:
            return float(d)
        s = pd.to_numeric(self.records["intended_send_s"], errors="coerce")
        return float(s.max()) if len(s) and s.max() > 0 else float("nan")


def directory_of(run) -> Path:
    """The directory of ``run`` (a :class:`Run`, or anything with a ``path``); ``ValueError`` for a
    run only in memory."""
    if run.path is None:
        raise ValueError("the run is only in memory: it has no run directory")
    return Path(run.path)


def records_summary(records: pd.DataFrame, config: Optional[dict] = None, finished: bool = True) -> dict:
    """``summary.json`` for records (the client's own ``summarize``): outcome counts, schedule
    lag, validity, requested vs achieved rate, and the backend the config records
    (:func:`backend_of`: ``"unknown"`` when it records none).

    The planned count is ``config["schedule"]["n_requests"]`` when the config has it, else the
    number of records. ``finished=False``: the run never wrote its summary (a client killed
    mid-run), so it is summarised as interrupted, never valid, and ``valid_reason`` says so."""
    config = config or {}
    sched = config.get("schedule") or {}
    rows = list(zip(records["intended_send_s"], [None if (x is None or (isinstance(x, float) and math.isnan(x))) else x
                                                 for x in records["actual_send_s"]], records["error_class"]))
    requested = sched.get("requested_rate_rps")
    if requested is None and len(records) > 1:
        s = records["intended_send_s"].astype(float)
        requested = (len(s) - 1) / (s.max() - s.min()) if s.max() > s.min() else None
    n_planned = sched.get("n_requests", len(records))
    out = summarize(rows, n_planned=n_planned, requested_rate_rps=requested,
                    lag_threshold_ms=float(config.get("lag_threshold_ms", 10.0)), interrupted=not finished,
                    max_error_rate=float(config.get("max_error_rate", MAX_ERROR_RATE)),
                    messages=error_messages(zip(records["error_class"], records["error_message"])))
    if not finished:
        out["valid_reason"] = "no summary.json (the run did not finish): " + out["valid_reason"]
    out["backend"] = backend_of(config)
    return out


# --- run directories ---------------------------------------------------------------------------
def jsonable(v):
    if v is None:
        return None
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return None if math.isnan(v) or math.isinf(v) else float(v)
    if isinstance(v, np.ndarray):
        return [jsonable(x) for x in v.tolist()]
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    if isinstance(v, (np.bool_,)):
        return bool(v)
    return v


def _local_env(backend: str) -> dict:
    pk: dict = {}
    for name in ("numpy", "pandas", "numba", "fairlib"):
        try:
            pk[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pk[name] = None
    return {"collected_wall": time.time(), "python": sys.version, "platform": platform.platform(),
            "machine": platform.machine(), "hostname": socket.gethostname(), "cpu_count": os.cpu_count(),
            "packages": pk, "endpoint": None, "backend": backend}


def write_run_dir(records: pd.DataFrame, run_dir, config: dict, summary: Optional[dict] = None,
                  env: Optional[dict] = None, overwrite: bool = False) -> Path:
    """Write a run directory with the client's files: ``config.json``, ``env.json``,
    ``records.jsonl`` (one line per record, the fields ``RECORD_FIELDS``) and ``summary.json``
    (written last; computed with :func:`records_summary` when not given). Refuses a directory
    that already holds records unless ``overwrite``. ``load_records`` reads it back."""
    rd = RunDir(run_dir, overwrite=overwrite)
    rd.write_json("config.json", jsonable(config))
    rd.write_json("env.json", jsonable(env if env is not None else _local_env(backend_of(config, summary))))
    writer = rd.records_writer()
    try:
        fields = list(RECORD_FIELDS)
        for rec in records[fields].to_dict("records"):
            writer.write(jsonable(rec))
    finally:
        writer.close()
    rd.write_json("summary.json", jsonable(summary if summary is not None else records_summary(records, config)))
    return rd.path


def load_run(run_dir) -> Run:
    """A run directory of either backend as a :class:`Run` (records via ``load_records``).

    Without ``summary.json`` (a client killed before writing it) the summary is rebuilt from the
    records as an unfinished run: planned count from ``config.json``, interrupted, not valid.

    Parameters
    ----------
    run_dir : str or pathlib.Path
        A directory holding ``records.jsonl`` (or ``records.jsonl.gz``; usually also
        ``config.json`` and ``summary.json``).

    Returns
    -------
    Run
        Its records, config (empty without ``config.json``), summary and ``path``.

    Raises
    ------
    ValueError
        When ``run_dir`` holds no records, or one of its files is damaged (not JSON: the
        message names the file and line).
    """
    p = Path(run_dir)
    if not records_path(p).exists():
        raise ValueError(f"{p} is not a run directory (no records.jsonl)")
    config = read_json(p / "config.json") if (p / "config.json").exists() else {}
    records = load_records(p)
    summary = (read_json(p / "summary.json") if (p / "summary.json").exists()
               else records_summary(records, config, finished=False))
    return Run(records, config, summary, path=str(p))
