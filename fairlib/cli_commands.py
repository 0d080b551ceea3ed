"""The command line's measurement ends and the catalogue commands: the console summary after
``fairlib run`` and ``fairlib simulate``, ``fairlib scenarios`` and ``fairlib sweep``.

The summary is ``fairlib.analysis.console``'s, over the run just written (the numbers the report
of ``fairlib analyze --run DIR`` shows). Errors are ``ValueError`` (a usage error) for the command
line to print as one line.
"""
from __future__ import annotations

import math
from typing import Optional

import pandas as pd

from fairlib import scenarios
from fairlib.analysis.console import messages_text, outcome_line, setup_summary, table_text
from fairlib.analysis.setups import build_setups
from fairlib.progress import Progress
from fairlib.records import Run
from fairlib.sweep import ScenarioPoint, scenario_policy, sweep

__all__ = ["run_summary", "scenario_lines", "sweep_table", "SWEEP_COLUMNS", "SWEEP_HEADINGS"]

SUMMARY_BOOT = 50   # the summary shows estimates only (plain percentiles): few resamples suffice


def run_summary(run: Run, cmd: str) -> str:
    """What ``cmd`` prints when its run is written: the setup summary, its warnings, the path."""
    try:
        text = setup_summary(build_setups([run], n_boot=SUMMARY_BOOT)[0], cmd)
    except Exception as e:   # noqa: BLE001 - the run is written whatever the summary's fate: say why, go on
        text = "\n".join([f"{cmd}: {run.name} seed {run.seed} [{run.label}]: {outcome_line(run.summary)}",
                          *messages_text(run.summary), f"(no summary table: {type(e).__name__}: {e})"])
    lines = [text] + [f"WARNING: {w}" for w in run.summary.get("warnings") or []]
    if run.path:
        lines.append(f"{cmd}: run directory {run.path}")
    return "\n".join(lines)


def scenario_lines() -> list:
    """One line per shipped scenario: name, load, tenants, run length, the first sentence of its
    description."""
    rows = []
    for name in scenarios.SCENARIOS:
        s = scenarios.load(name)
        first = s.description.split(". ")[0].rstrip(".") + "."
        load = f"{s.offered_load:.2f}" + ("" if s.offered_load == s.rho else f" (of rho {s.rho:g})")
        rows.append({"scenario": name, "load": load, "tenants": str(len(s.tenant_names)),
                     "duration s": f"{s.duration_s:g}", "description": first})
    return table_text(pd.DataFrame(rows).set_index("scenario"), left=("load", "description")).splitlines()


#: The sweep's console columns: means over seeds of fairlib.sweep's rows.
SWEEP_COLUMNS = ("jain", "max_min", "ttft_p50", "ttft_p99", "e2e_p99", "rejected", "finished")
SWEEP_HEADINGS = {"jain": "Jain (residency)", "max_min": "max/min", "ttft_p50": "TTFT p50 ms",
                  "ttft_p99": "TTFT p99 ms", "e2e_p99": "E2E p99 ms", "rejected": "rejected", "finished": "finished"}


def sweep_table(name: str, policies: list, seeds: list, rhos: Optional[list], prog: Progress, *,
                capacity_file: Optional[str] = None, duration_s: Optional[float] = None,
                workers: Optional[int] = None) -> tuple:
    """``(rows, console table)``: ``fairlib.sweep.sweep`` of scenario ``name`` over ``rhos`` (the
    file's when ``None``) x ``seeds`` x ``policies`` (names; the scenario's own parameters go with
    its own policy, the tenants' weights with every weighted one) in ``workers`` processes
    (default: the CPU count; 1: this process)."""
    spec = scenarios.load(name, capacity=capacity_file, duration_s=duration_s)
    specs = [scenario_policy(p, spec.policy_params if p == spec.policy else {}) for p in policies]
    grid = {"rho": list(rhos)} if rhos else {}
    n = len(specs) * len(seeds) * (len(rhos) if rhos else 1)
    prog.stage(f"{name}: {n} runs ({len(specs)} policies x {len(seeds)} seeds"
               + (f" x {len(rhos)} loads" if rhos else "") + ")")
    prog.compile_notice("sweep")
    rows = sweep(ScenarioPoint(name, capacity_file, duration_s), grid, specs, seeds, progress=prog.live,
                 executor="serial" if workers == 1 else None, max_workers=workers)
    keys = (["rho"] if rhos else []) + ["policy"]
    mean = rows.groupby(keys, sort=False)[list(SWEEP_COLUMNS)].mean()

    def cell(col, v):
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return "-"
        if col in ("jain", "max_min"):
            return f"{v:.3f}"
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}"
    shown = pd.DataFrame({c: [cell(c, v) for v in mean[c]] for c in SWEEP_COLUMNS}, index=mean.index)
    shown.columns = [SWEEP_HEADINGS[c] for c in SWEEP_COLUMNS]
    return rows, table_text(shown) + f"\n(means over seeds {', '.join(str(s) for s in seeds)}; the rows: {len(rows)} " \
                                     f"runs, one per policy, seed and load)"
