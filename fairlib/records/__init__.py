"""Records: the seam between the backends and the analysis, owned by neither backend.

A run of either backend is a table of records (one row per request, the columns
``RECORD_COLUMNS``), its configuration and its summary; on disk, a run directory (``config.json``,
``env.json``, ``records.jsonl``, ``summary.json``). The HTTP client writes them as it measures;
the simulator's records are made from its result (``from_sim``); the analysis reads only these.

Modules: ``schema`` (the record fields, error classes, one record's timing), ``summary`` (schedule
lag and validity), ``rundir`` (the run directory writer and loader), ``run`` (``Run``,
``write_run_dir``, ``load_run``), ``from_sim`` (the simulator's records).
"""
from fairlib.records.from_sim import from_simulation, sim_config, simulate_records, simulate_run, trace_simulation
from fairlib.records.rundir import load_records, load_server_metrics, load_summary
from fairlib.records.run import (RECORD_COLUMNS, Run, backend_of, jsonable, load_run, records_summary,
                                 write_run_dir)
from fairlib.records.schema import ERROR_CLASSES, RECORD_FIELDS
from fairlib.records.summary import summarize

__all__ = ["RECORD_COLUMNS", "RECORD_FIELDS", "ERROR_CLASSES", "Run", "load_run", "write_run_dir",
           "records_summary", "backend_of", "jsonable", "load_records", "load_summary", "load_server_metrics", "summarize",
           "trace_simulation", "from_simulation", "simulate_records", "simulate_run", "sim_config"]
