"""The Markdown report of one or more runs, and ``fairlib analyze``.

    fairlib analyze RUN_DIR [RUN_DIR ...] --out report.md [--plots DIR] [--baseline DIR ...]

Per run: validity (schedule lag p50/p99 against the run's threshold, requested vs achieved rate),
latency per tenant with bootstrap intervals, SLO goodput, starvation, token-weighted and residency
fairness (raw and demand-normalised, windowed), and victim degradation against a baseline run.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from fairlib.analysis.charts import latency_chart, share_chart, windowed_chart
from fairlib.analysis.common import DECODE_WEIGHT, PREFILL_WEIGHT, STARVATION_FACTOR, as_run
from fairlib.analysis.run import (
    analyze_run,
    ci_table,
    combine,
    fairness_table,
    pooled_latency,
    validity_table,
    victim_degradation,
)
from fairlib.records import Run, load_run

__all__ = ["report", "main"]



# --- report --------------------------------------------------------------------------------------
def _md(df: pd.DataFrame, digits: int = 2) -> str:
    return df.round(digits).to_markdown()


def _with_slos(run: Run, default_slo: Optional[tuple]) -> Run:
    """``run`` itself when its config names SLOs; else a new Run (the same records and summary)
    whose scenario gives every tenant ``default_slo`` = ``(ttft_ms, tpot_ms)``. ``run`` is left as it is."""
    if run.slos:
        return run
    if default_slo is None:
        raise ValueError(f"run {run.path or run.name}: its config names no SLOs (no scenario); "
                         "give them with --slo TTFT_MS,TPOT_MS")
    tenants = [{"name": n, "ttft_slo_ms": float(default_slo[0]), "tpot_slo_ms": float(default_slo[1])}
               for n in run.tenant_names]
    sc = {"name": run.name, **run.scenario, "tenants": tenants}
    return replace(run, config={**run.config, "extra": {**run.extra, "scenario": sc}})


def _group(runs: Sequence[Run]) -> dict:
    groups: dict = {}
    runs = sorted(runs, key=lambda r: (str(r.name), str(r.backend), str(r.seed)))
    for r in runs:
        groups.setdefault((r.name, r.backend), []).append(r)
    return groups


def report(runs: Sequence, baselines: Sequence = (), plots_dir: Optional[Path] = None, window_s: float = 10.0,
           n_boot: int = 1000, default_slo: Optional[tuple] = None) -> str:
    """The markdown report of several runs (grouped by scenario and backend). Victim degradation
    is reported for a scenario that names a victim and a baseline when runs of that baseline are
    among ``runs`` or ``baselines``. With ``plots_dir``, SVG charts are written there and linked.
    ``default_slo`` = ``(ttft_ms, tpot_ms)`` for every tenant of a run whose config names no SLOs
    (a run made without a scenario file). The runs given are left unchanged."""
    runs = [_with_slos(as_run(r), default_slo) for r in runs]
    base_runs = [_with_slos(as_run(r), default_slo) for r in baselines]
    groups = _group(runs)
    by_name: dict = {}
    for r in runs + base_runs:
        by_name.setdefault((r.name, r.backend), []).append(r)
    lines = ["# fairlib analyze report", ""]
    lines += [f"{len(runs)} run(s): " + ", ".join(f"{n} ({b}, {len(v)} seed(s))" for (n, b), v in groups.items()), ""]
    lines += ["Definitions: `fairlib.analysis` (TTFT to the first token chunk, TPOT = (E2E - TTFT) / (tokens - 1), "
              "E2E to the last token chunk; goodput = completed requests/s meeting both SLOs; starvation = TTFT > "
              f"{STARVATION_FACTOR:g}x the TTFT SLO; service weights: prompt {PREFILL_WEIGHT:g}, output "
              f"{DECODE_WEIGHT:g}). Latencies in ms.", ""]
    for (name, backend), rs in groups.items():
        analyses = [analyze_run(r, window_s=window_s, n_boot=n_boot) for r in rs]
        scen = rs[0].scenario
        lines += [f"## {name} ({backend})", ""]
        if scen.get("description"):
            lines += [scen["description"], ""]
        if scen.get("question"):
            lines += [f"Question: {scen['question']}", ""]
        lines += [f"Seeds: {', '.join(str(a.seed) for a in analyses)}; load window {rs[0].duration_s:g} s.", ""]
        lines += ["### Validity", "", _md(validity_table(analyses).drop(columns=["scenario"]).set_index("seed"), 3), ""]
        lines += ["### Per tenant (mean over seeds)", "", _md(combine(analyses)), ""]
        lat = pooled_latency(rs, n_boot=n_boot)
        lines += ["### Latency percentiles with 95% bootstrap intervals (pooled over seeds)", "",
                  ci_table(lat).to_markdown(), ""]
        lines += ["### Fairness", "", _md(fairness_table(analyses).drop(columns=["scenario"]).set_index("seed"), 3), ""]
        fits = pd.DataFrame([{"seed": a.seed, **a.cost_fit} for a in analyses]).set_index("seed")
        lines += ["### Iteration cost fitted from the stream timings", "",
                  "`dt = iter_base + iter_slope * B + prefill * P` (ms) over the iterations the streams show; "
                  "it prices prefill in `residency_fitted_share_pct`.", "", _md(fits, 4), ""]
        if scen.get("victim") and scen.get("baseline"):
            bl = by_name.get((scen["baseline"], backend)) or [r for (n, _), v in by_name.items()
                                                              if n == scen["baseline"] for r in v]
            if bl:
                vd = victim_degradation(rs, bl, scen["victim"], n_boot=n_boot)
                lines += [f"### Victim degradation ({scen['victim']}: contention / alone)", "", _md(vd, 3), ""]
            else:
                lines += ["### Victim degradation", "",
                          f"No run of the baseline scenario {scen['baseline']!r} was given (--baseline DIR).", ""]
        if plots_dir is not None:
            plots_dir = Path(plots_dir)
            plots_dir.mkdir(parents=True, exist_ok=True)
            stem = f"{name}_{backend}"
            wins = pd.concat([a.windowed.assign(seed=a.seed) for a in analyses], ignore_index=True)
            shares = []
            for a in analyses:
                for t in a.residency.index:
                    shares.append({"tenant": t, "measure": "residency", "pct": 100 * a.residency.loc[t, "share"]})
                    shares.append({"tenant": t, "measure": "token-weighted", "pct": 100 * a.tokens.loc[t, "share"]})
            shares = pd.DataFrame(shares).groupby(["tenant", "measure"], sort=False, as_index=False)["pct"].mean()
            charts = {"ttft": latency_chart(lat, "ttft"), "e2e": latency_chart(lat, "e2e"),
                      "shares": share_chart(shares, "Share of service per tenant (%, mean over seeds)"),
                      "jain": windowed_chart(wins)}
            lines += ["### Plots", ""]
            for k, ch in charts.items():
                p = plots_dir / f"{stem}_{k}.svg"
                ch.save(str(p))
                lines += [f"![{name} {k}]({plots_dir.name}/{p.name})", ""]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``fairlib analyze``: run directories (simulated or measured) -> a markdown report."""
    ap = argparse.ArgumentParser(prog="fairlib analyze", description=main.__doc__)
    ap.add_argument("--run", nargs="+", required=True, metavar="DIR", help="run directories to analyze")
    ap.add_argument("--baseline", nargs="*", default=[], metavar="DIR",
                    help="run directories of the victim baseline scenario (victim alone at the same rate)")
    ap.add_argument("--out", default="report.md", help="the markdown report to write (default report.md)")
    ap.add_argument("--plots", action="store_true", help="also write SVG charts next to the report")
    ap.add_argument("--window-s", type=float, default=10.0, help="window of the Jain time series (s)")
    ap.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples for the intervals")
    ap.add_argument("--slo", metavar="TTFT_MS,TPOT_MS",
                    help="SLOs for every tenant of a run whose config names none (default: the scenario's)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    plots = out.parent / (out.stem + "_plots") if args.plots else None
    try:
        slo = None
        if args.slo:
            parts = [float(x) for x in args.slo.split(",")]
            if len(parts) != 2 or min(parts) <= 0:
                raise ValueError(f"--slo takes TTFT_MS,TPOT_MS (two numbers > 0), got {args.slo!r}")
            slo = tuple(parts)
        runs = [load_run(d) for d in args.run]
        bases = [load_run(d) for d in args.baseline]
        text = report(runs, bases, plots, window_s=args.window_s, n_boot=args.n_boot, default_slo=slo)
    except ValueError as e:
        print(f"fairlib analyze: {e}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"fairlib analyze: wrote {out}" + (f" and charts in {plots}" if plots else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
