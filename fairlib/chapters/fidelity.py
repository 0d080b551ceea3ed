"""Simulator fidelity on real engines (chapter 8): the same scenarios measured live and simulated
with the engine's fitted cost model, compared per tenant.

    from fairlib.chapters import fidelity as fd
    runs = fd.load_saved("vllm")                           # data/runs/vllm/<scenario>/seed<k>
    pairs = fd.simulate_pairs(runs)                        # (measured, simulated) per run
    table = fd.compare_all(pairs)                          # per tenant: measured, predicted, error
    fd.error_summary(table, valid_only=True)               # the error table, valid runs only
    fd.sensitivity(runs)                                   # each error with one parameter scaled

**One schedule.** A live run records the scenario it ran (``config.json``: the scenario, its seed,
the fitted engine that set its load, the engine the simulator runs and the policy the endpoint
ran). The fitted engine is the one at the scenario's mean decode context (:func:`scenario_spec`;
``fairlib.calibrate.fit.engine_at``). The simulation reloads the same scenario file with the recorded
engines, checks that the schedule is the one that was sent (every intended send time equal), and
runs it with the endpoint's policy (FCFS, or priority for vLLM started with
``--scheduling-policy priority``).

**Compared per tenant** (``fairlib.analysis``, one code path for both): the machine share (the
residency rebuilt from the stream timings, equal split, inside the load window), TTFT and E2E
p50/p99 over the completed requests, and the output throughput (tokens emitted in the load window
per second). Errors: share in percentage points, latencies and throughput relative to the
measured value, ``(predicted - measured) / measured``. A run is valid when the client kept its
schedule (p99 send lag within the threshold); the chapter's figures use the valid runs only
(``valid_only=True``; the default keeps every row). ``seed000`` runs (the blog post's scenario) are
cut after their window, so they are compared on share and throughput only.

**Sensitivity** (:func:`sensitivity`): every run simulated again with one fitted parameter scaled
(``iter_base``, ``iter_slope``, ``prefill``), to show which errors test the cost model.

**Live runs** sample ``/metrics`` from a child process (``fairlib.client.prom``: the raw text saved
as it comes, parsed after the run) and keep connections alive. The saved runs predate that: the
scraper then parsed on the send loop and stalled it against vLLM by up to 1.3 s, so they were
recorded without sampling (``scrape_metrics`` false in their ``config.json``). Recorded runs
(:func:`record`, ``python -m fairlib.chapters.fidelity record KIND``) also wait for a quiet machine, run
the engine a few nice steps below the client, and save the machine's load average with each run. They use an
engine's own request settings (:func:`endpoint_config`: vLLM's
``return_token_ids`` and priorities, llama.cpp's ``cache_prompt: false``) and token-id prompts
of exact length in the tiny model's vocabulary (:func:`model_tokenizer`).
"""
from __future__ import annotations

import argparse
import json
import sys

# chapter 8's jobs, each a module of its own, re-exported here (the names the notebooks use)
from fairlib.chapters.fidelity_runs import (CHECKS, CUT_RUN_CLASSES, GOALS, KINDS, SAVED_FILES, SCENARIOS,
                                            SEED000_SHARE_PTS, STORED_FILES, check_cut_run,
                                            check_same_schedule, compact_records, endpoint_config, fit_file,
                                            fitted_engine, load_saved, load_specs, loadavg, model_tokenizer,
                                            run_live, runs_root, save_runs, scenario_spec, seed000_compare,
                                            seed000_live, seed000_spec, sim_spec, simulate_live, store_run_files,
                                            simulate_pairs)
from fairlib.chapters.fidelity_compare import (LATENCY_METRICS, LIVE_VALIDITY_COLUMNS, METRICS,
                                               METRIC_LABELS, PARAM_LABELS, SENSITIVITY_FACTORS,
                                               SENSITIVITY_PARAMS, STALL_BURST_MS, STALL_GAP_MS,
                                               STALL_REPEAT, both_ways, check, compare, compare_all,
                                               error_summary, fit_points, goal_table, idle_ttft,
                                               live_validity_table, published_table, run_costs,
                                               scenario_table, sensitivity, stalls, valid_only_rows)
from fairlib.chapters.fidelity_charts import (ENGINE_COLOURS, OTHER_ENGINE_COLOUR, crosscheck_table,
                                              fit_chart, long_errors, scatter_chart, scenario_error_chart,
                                              scenario_errors, sensitivity_chart, sensitivity_table,
                                              valid_rows)
from fairlib.chapters.fidelity_record import (RECORD_DURATION_S, RECORD_SCENARIOS, RECORD_SEED000_S,
                                              RECORD_SEEDS, SAVED_SCENARIOS, record, wait_quiet)


__all__ = ['KINDS', 'SCENARIOS', 'GOALS', 'CHECKS', 'runs_root', 'endpoint_config', 'model_tokenizer', 'fit_file',
           'fitted_engine', 'scenario_spec', 'load_specs', 'run_live', 'save_runs', 'load_saved',
           'sim_spec', 'simulate_pairs', 'compare', 'compare_all', 'error_summary', 'goal_table',
           'check', 'published_table', 'seed000_spec', 'seed000_live', 'seed000_compare',
           'SEED000_SHARE_PTS', 'SAVED_FILES', 'STORED_FILES', 'record', 'fit_points', 'scenario_table',
           'live_validity_table', 'LIVE_VALIDITY_COLUMNS', 'RECORD_SCENARIOS', 'SAVED_SCENARIOS',
           'RECORD_SEEDS', 'RECORD_DURATION_S', 'RECORD_SEED000_S', 'simulate_live', 'STALL_GAP_MS',
           'STALL_REPEAT', 'STALL_BURST_MS', 'loadavg', 'compact_records', 'check_same_schedule',
           'wait_quiet', 'METRICS', 'LATENCY_METRICS', 'METRIC_LABELS', 'both_ways', 'sensitivity',
           'SENSITIVITY_PARAMS', 'SENSITIVITY_FACTORS', 'PARAM_LABELS', 'idle_ttft', 'ENGINE_COLOURS',
           'OTHER_ENGINE_COLOUR', 'fit_chart', 'crosscheck_table', 'valid_rows', 'long_errors',
           'scenario_errors', 'scenario_error_chart', 'scatter_chart', 'sensitivity_table',
           'sensitivity_chart', 'stalls', 'run_costs', 'check_cut_run', 'CUT_RUN_CLASSES',
           'valid_only_rows', 'store_run_files']


def main(argv=None) -> int:
    """``python -m fairlib.chapters.fidelity record vllm|llamacpp [--no-refit] [--duration-s 30]
    [--seeds 0 1 2] [--redo all|missing|invalid]``: what the book keeps in ``data/`` (the fit,
    then every scenario and seed000 live, 30 s windows, seeds 0-2)."""
    ap = argparse.ArgumentParser(prog="python -m fairlib.chapters.fidelity", description=main.__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="record the scenarios' live runs into data/runs (and refit)")
    r.add_argument("kind", choices=list(KINDS))
    r.add_argument("--no-refit", dest="refit", action="store_false",
                   help="keep data/engines/<kind>.json (default: fit it again first)")
    r.add_argument("--duration-s", type=float, default=RECORD_DURATION_S)
    r.add_argument("--seeds", type=int, nargs="+", default=list(RECORD_SEEDS))
    r.add_argument("--names", nargs="+", default=None, help=f"default: {' '.join(RECORD_SCENARIOS)}")
    r.add_argument("--seed000-seeds", type=int, nargs="*", default=list(RECORD_SEEDS))
    r.add_argument("--seed000-duration-s", type=float, default=RECORD_SEED000_S)
    r.add_argument("--redo", choices=["all", "missing", "invalid"], default="all")
    r.add_argument("--data-root", default=None, help="another runs folder (default data/runs)")
    r.add_argument("--quiet-load", type=float, default=3.0,
                   help="before each run, wait for the 1-minute load average to fall to this")
    r.add_argument("--quiet-wait-s", type=float, default=300.0)
    r.add_argument("--engine-nice", type=int, default=None,
                   help="run the engine this many nice steps below the client "
                        "(default: fairlib.calibrate.lifecycle.DEFAULT_NICE, 10)")
    r.add_argument("--fit-path", default=None, help="read (and, refitting, write) the fit here")
    r.add_argument("--fit-repeats", type=int, default=None, help="repeats of the refit's decode sweep")
    r.add_argument("--work-dir", default=None,
                   help="where the full run directories are written first (e.g. under /dev/shm)")
    a = ap.parse_args(argv)
    res = record(a.kind, refit=a.refit, duration_s=a.duration_s, seeds=a.seeds, names=a.names,
                 seed000_seeds=a.seed000_seeds, seed000_duration_s=a.seed000_duration_s, redo=a.redo,
                 data_root=a.data_root, quiet_load=a.quiet_load, quiet_wait_s=a.quiet_wait_s,
                 engine_nice=a.engine_nice, fit_path=a.fit_path,
                 fit_settings={"repeats": a.fit_repeats} if a.fit_repeats else None,
                 work_dir=a.work_dir)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
