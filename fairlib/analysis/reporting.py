"""The Markdown report of one or more runs, and ``fairlib analyze``.

    fairlib analyze --run DIR [--run DIR ...] [--baseline DIR ...] --out report.md [--plots]
    fairlib analyze --compare DIR_A DIR_B

Runs are grouped by setup, (scenario, label) (``fairlib.analysis.setups``): the seeds of one
setup are combined, two labels never are. Each setup's section opens with the question its
scenario asks and the answer in one sentence (``fairlib.analysis.verdict``), then the summary the
console prints, validity, latency per tenant with bootstrap intervals, SLO goodput, starvation,
token-weighted and residency fairness (raw, demand-normalised, windowed) and the victim against
its baseline. A scenario measured by several setups gets a side-by-side comparison. The report
ends with a glossary of every column it shows (``fairlib.analysis.glossary``).
"""
from __future__ import annotations

import argparse
import math
import re
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from fairlib.analysis.charts import latency_chart, share_chart, windowed_chart
from fairlib.analysis.common import as_run
from fairlib.analysis.console import compare_text, setup_summary
from fairlib.analysis.glossary import DEFINITIONS, glossary_markdown
from fairlib.analysis.report_charts import (WIDTH, comparison_chart, engine_chart, goodput_chart, latency_over_time,
                                            save_chart, victim_chart)
from fairlib.analysis.run import ci_table, pooled_latency, validity_table
from fairlib.analysis.setups import Setup, build_setups, compare, comparison_table, format_summary, summary_table
from fairlib.progress import Progress
from fairlib.records import Run, load_run

__all__ = ["report", "report_setups", "main", "EXAMPLES"]

EXIT_STATUS = """exit status:
  0    the report is written and every run it read is valid
  1    the report is written, but a run is invalid (the console and the report say which and why);
       with --compare: one of the two is
  2    a usage error (no run directory there, SLOs missing, a bad option)"""

EXAMPLES = """examples:
  fairlib analyze --run runs/noisy_neighbor/http/seed0 --baseline runs/victim_baseline/http/seed0 --plots
  fairlib analyze --run runs/direct --run runs/gateway --out compare.md     (two setups side by side)
  fairlib analyze --compare runs/direct runs/gateway                        (deltas on the console)"""


# --- Markdown ------------------------------------------------------------------------------------
def _md(df: pd.DataFrame, digits: int = 2) -> str:
    """A table as Markdown: index levels as columns, numbers rounded, missing values as '-'."""
    d = df.reset_index() if any(n is not None for n in df.index.names) else df.copy()

    def cell(v):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        if isinstance(v, float):
            if math.isinf(v):
                return "inf" if v > 0 else "-inf"
            text = f"{v:.{digits}f}"
            return text.rstrip("0").rstrip(".") if "." in text else text
        return str(v)
    return d.map(cell).to_markdown(index=False, disable_numparse=True)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", str(text)).strip("-") or "run"


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


def _seeds(s: Setup) -> str:
    return ("seed " if len(s.seeds) == 1 else "seeds ") + ", ".join(str(x) for x in s.seeds)


def _charts(lines: list, charts: dict, plots_dir: Path, stem: str, title: str) -> None:
    lines += ["### Charts", "", f"Each chart is an SVG with a PNG beside it ({WIDTH} px wide).", ""]
    for k, ch in charts.items():
        if ch is None:
            continue
        svg, png = save_chart(ch, plots_dir / f"{stem}_{k}")
        lines += [f"![{title} {k}]({plots_dir.name}/{svg.name}) ([PNG]({plots_dir.name}/{png.name}))", ""]


def _setup_section(s: Setup, plots_dir: Optional[Path], n_boot: int, used: list) -> list:
    v = s.verdict
    lines = [f"## {s.scenario} [{s.label}]", ""]
    lines += [f"**Question.** {v.asks}", "", f"**Answer.** {v.answer}", ""]
    if s.spec.get("description"):
        lines += [s.spec["description"], ""]
    lines += [f"{_seeds(s).capitalize()}; load window {s.runs[0].duration_s:g} s."
              + ("" if s.valid else " **Not every run is valid: read the Validity table first.**"), ""]
    lines += [n + "\n" for n in s.notes]
    sm = format_summary(summary_table(s))
    lines += ["### Summary", "", "What the console printed: ok/failed/refused summed over seeds, the rest means "
              "over seeds (`share %` is the residency share).", "",
              sm.reset_index().to_markdown(index=False, disable_numparse=True), ""]
    used += ["ok", "failed", "refused", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms",
             "e2e_p99_ms", "goodput_rps", "slo_attainment_pct", "share_pct"]
    vt = validity_table(s.analyses).drop(columns=["scenario"]).set_index("seed")
    lines += ["### Validity", "", _md(vt, 3), ""]
    used += list(vt.columns)
    lines += ["### Per tenant (mean over seeds)", "", _md(s.table), ""]
    used += list(s.table.columns)
    if s.table["completed"].sum():
        lat = pooled_latency(s.runs, n_boot=n_boot)
        ci = ci_table(lat)
        lines += ["### Latency percentiles with 95% bootstrap intervals (pooled over seeds)", "", _md(ci), ""]
        used += list(ci.columns)
    ft = s.fairness_rows.drop(columns=["scenario"]).set_index("seed")
    lines += ["### Fairness", "", _md(ft, 3), ""]
    used += [c for c in ft.columns]
    fits = pd.DataFrame([{"seed": a.seed, **a.cost_fit} for a in s.analyses]).set_index("seed")
    lines += ["### Iteration cost fitted from the stream timings", "",
              "`dt = iter_base + iter_slope * B + prefill * P` (ms) over the iterations the streams show; "
              "it prices prefill in `residency_fitted_share_pct`.", "", _md(fits, 4), ""]
    used += list(fits.columns)
    if s.victim is not None:
        who = s.spec["victim"]
        lines += [f"### Victim degradation ({who}: contention / alone"
                  + (f", baseline {s.baseline_label}" if s.baseline_label else "") + ")", "", _md(s.victim, 3), ""]
        used += ["contention", "alone", "ratio", "attainment"]
    elif s.spec.get("victim"):
        lines += ["### Victim degradation", "", "No victim degradation: " + " ".join(s.notes or ["no baseline run."]),
                  ""]
    if plots_dir is not None and s.table["completed"].sum():
        wins = pd.concat([a.windowed.assign(seed=a.seed) for a in s.analyses], ignore_index=True)
        shares = []
        for a in s.analyses:
            for t in a.residency.index:
                shares.append({"tenant": t, "measure": "residency", "pct": 100 * a.residency.loc[t, "share"]})
                shares.append({"tenant": t, "measure": "token-weighted", "pct": 100 * a.tokens.loc[t, "share"]})
        shares = pd.DataFrame(shares).groupby(["tenant", "measure"], sort=False, as_index=False)["pct"].mean()
        lat = pooled_latency(s.runs, n_boot=n_boot)
        charts = {"ttft_over_time": latency_over_time(s.runs, "ttft"),
                  "ttft": latency_chart(lat, "ttft").properties(width=WIDTH),
                  "e2e": latency_chart(lat, "e2e").properties(width=WIDTH),
                  "goodput": goodput_chart({s.label: s.table}),
                  "shares": share_chart(shares, "Share of service per tenant (%, mean over seeds)").properties(
                      width=WIDTH),
                  "jain": windowed_chart(wins).properties(width=WIDTH),
                  "engine": engine_chart(s.runs),
                  "victim": victim_chart(s.victim, s.spec["victim"], s.baseline_label) if s.victim is not None
                  else None}
        _charts(lines, charts, plots_dir, f"{_slug(s.scenario)}_{_slug(s.label)}", s.scenario)
    return lines


def _comparison_section(name: str, setups: list, plots_dir: Optional[Path]) -> list:
    lines = [f"## Comparison: {name}", "", f"**Question.** {setups[0].verdict.asks}", ""]
    for s in setups:
        lines.append(f"- **{s.label}** ({_seeds(s)}): {s.verdict.answer}")
    table = comparison_table(setups)
    lines += ["", "One column per setup (means over its seeds; the glossary defines the rows' columns).", "",
              _md(table, 3), ""]
    if plots_dir is not None:
        rows = [r for r in table.index if "TTFT p99 (ms)" in r or "SLO attainment" in r or r.startswith("jain_resid")
                or r.startswith("windowed_jain_residency") or "residency share" in r]
        charts = {"comparison": comparison_chart(table, rows),
                  "goodput": goodput_chart({s.label: s.table for s in setups})}
        _charts(lines, charts, plots_dir, f"{_slug(name)}_comparison", name)
    return lines


def report_setups(setups: Sequence[Setup], plots_dir: Optional[Path] = None, n_boot: int = 1000) -> str:
    """The Markdown report of analysed setups (``build_setups``)."""
    if plots_dir is not None:
        plots_dir = Path(plots_dir)
        plots_dir.mkdir(parents=True, exist_ok=True)
    n = sum(len(s.analyses) for s in setups)
    lines = ["# fairlib analyze report", ""]
    lines += [f"{n} run{'s' if n != 1 else ''} in {len(setups)} setup{'s' if len(setups) != 1 else ''} "
              "(a setup is one scenario measured one way, its label; seeds of a setup are combined, setups never "
              "are): " + "; ".join(f"{s.scenario} [{s.label}] ({_seeds(s)})" for s in setups) + ".", ""]
    lines += ["## Verdicts", "", "Each scenario asks one question: below capacity latency isolation, at or above it "
              "shares (each section below says what to read).", ""]
    for s in setups:
        q = {"isolation": "latency isolation", "shares": "shares"}[s.verdict.question]
        lines.append(f"- **{s.scenario} [{s.label}]** ({q}{'' if s.valid else '; an INVALID run'}): {s.verdict.answer}")
    lines.append("")
    used: list = []
    by_scenario: dict = {}
    for s in setups:
        by_scenario.setdefault(s.scenario, []).append(s)
    for name, group in by_scenario.items():
        if len(group) > 1:
            lines += _comparison_section(name, group, plots_dir)
            used += ["jain_residency_demand", "jain_tokens_demand", "jain_residency", "max_min_residency",
                     "windowed_jain_residency_min", "windowed_jain_tokens_min", "label"]
    for s in setups:
        lines += _setup_section(s, plots_dir, n_boot, used)
    lines += ["## Glossary", "", "Latencies in ms; percentiles are numpy's (linear); the intervals are 95% percentile "
              "bootstrap intervals (IID resampling, optimistic for queueing series).", "",
              glossary_markdown([c for c in dict.fromkeys(used) if c in DEFINITIONS]), ""]
    return "\n".join(lines) + "\n"


def report(runs: Sequence, baselines: Sequence = (), plots_dir: Optional[Path] = None, window_s: float = 10.0,
           n_boot: int = 1000, default_slo: Optional[tuple] = None) -> str:
    """The Markdown report of several runs (grouped by setup: scenario and label). Victim
    degradation is reported for a scenario that names a victim and a baseline when runs of that
    baseline are among ``runs`` or ``baselines``. With ``plots_dir``, charts (SVG and PNG) are
    written there and linked. ``default_slo`` = ``(ttft_ms, tpot_ms)`` for every tenant of a run
    whose config names no SLOs (a run made without a scenario file). The runs given are left
    unchanged.

    Parameters
    ----------
    runs : sequence
        The runs (anything ``as_run`` takes: Run objects, run directories).
    baselines : sequence, default ()
        Runs of baseline scenarios (the victim alone), for victim degradation only.
    plots_dir : pathlib.Path, optional
        Where to write the charts; ``None``: no charts.
    window_s : float, default 10.0
        Window length (s) of the windowed Jain series.
    n_boot : int, default 1000
        Bootstrap resamples of the intervals.
    default_slo : tuple of float, optional
        ``(ttft_ms, tpot_ms)`` for every tenant of a run whose config names no SLOs.

    Returns
    -------
    str
        The Markdown report: per setup its question and answer, summary, validity, latency,
        goodput, fairness, the victim against its baseline; setups side by side; a glossary.

    Raises
    ------
    ValueError
        A run whose config names no SLOs when ``default_slo`` is not given, or a run ``as_run``
        refuses.
    """
    runs = [_with_slos(as_run(r), default_slo) for r in runs]
    base_runs = [_with_slos(as_run(r), default_slo) for r in baselines]
    return report_setups(build_setups(runs, base_runs, window_s=window_s, n_boot=n_boot), plots_dir, n_boot)


# --- the command ---------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="fairlib analyze", epilog=EXIT_STATUS + "\n\n" + EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill("Report on run directories, simulated or measured: per setup (scenario and "
                                  "label) the question the scenario asks and its answer, a summary table, validity, "
                                  "latency, goodput and fairness, the victim against its baseline; setups of one "
                                  "scenario side by side; a glossary.", 100))
    ap.add_argument("--run", nargs="+", action="extend", default=[], metavar="DIR",
                    help="run directories to analyze (repeatable: --run A --run B, or --run A B)")
    ap.add_argument("--baseline", nargs="+", action="extend", default=[], metavar="DIR",
                    help="run directories of the victim baseline scenario (the victim alone at the same rate); "
                         "default: none")
    ap.add_argument("--compare", nargs=2, metavar=("DIR_A", "DIR_B"),
                    help="print two runs' numbers and their deltas (B - A, B / A) on the console; writes nothing")
    ap.add_argument("--out", default="report.md", help="the markdown report to write (default: report.md)")
    ap.add_argument("--plots", action="store_true",
                    help="also write charts (SVG and PNG) in <out>_plots next to the report (default: off)")
    ap.add_argument("--window-s", type=float, default=10.0,
                    help="window of the Jain and rolling-p99 time series, seconds (default: 10)")
    ap.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples for the intervals (default: 1000)")
    ap.add_argument("--slo", metavar="TTFT_MS,TPOT_MS",
                    help="SLOs for every tenant of a run whose config names none (default: the scenario's)")
    ap.add_argument("--quiet", action="store_true", help="print only the report's path, no summary or progress "
                                                          "(default: off)")
    return ap


def _slo(text: Optional[str]) -> Optional[tuple]:
    if not text:
        return None
    try:
        parts = [float(x) for x in text.split(",")]
    except ValueError:
        parts = []
    if len(parts) != 2 or min(parts) <= 0:
        raise ValueError(f"--slo takes TTFT_MS,TPOT_MS (two numbers > 0), got {text!r}")
    return tuple(parts)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``fairlib analyze``: the report of ``--run DIR ...``, or ``--compare DIR_A DIR_B`` on the console.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments (``fairlib analyze --help``); default ``sys.argv[1:]``.

    Returns
    -------
    int
        The exit status: 0 when the report is written and every run is valid, 1 when a run is
        invalid (the report is still written and says which), 2 for a usage error (no run
        directory there, SLOs missing, a bad option), printed as one line on stderr.

    Raises
    ------
    SystemExit
        From argparse: ``--help`` (status 0) or arguments it cannot parse (status 2).
    """
    args = _parser().parse_args(argv)
    prog = Progress("fairlib analyze", quiet=args.quiet)
    if bool(args.run) == bool(args.compare):
        print("fairlib analyze: give --run DIR ... (a report) or --compare DIR_A DIR_B (deltas on the console)",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    plots = out.parent / (out.stem + "_plots") if args.plots else None
    try:
        slo = _slo(args.slo)
        dirs = list(args.compare or args.run)
        runs = [_with_slos(load_run(d), slo) for d in dirs]
        bases = [_with_slos(load_run(d), slo) for d in args.baseline]
        prog.stage(f"analyzing {len(runs)} run{'s' if len(runs) != 1 else ''}"
                   + (f" and {len(bases)} baseline run{'s' if len(bases) != 1 else ''}" if bases else ""))
        with prog.bar(len(runs), "analyzed", "run") as bar:
            if args.compare and runs[0].label == runs[1].label and runs[0].name == runs[1].name:
                # one setup twice (two seeds, or a rerun): compare them as two setups A and B
                runs = [replace(r, config={**r.config, "extra": {**r.extra, "label": f"{r.label} ({ab})"}})
                        for r, ab in zip(runs, "AB")]
            setups = build_setups(runs, bases, window_s=args.window_s, n_boot=args.n_boot, on_run=lambda: bar.update(1))
            if args.compare:
                a, b = sorted(setups, key=lambda s: [r.path for r in s.runs] != [str(Path(dirs[0]))])
            else:
                text = report_setups(setups, plots, args.n_boot)
    except ValueError as e:
        print(f"fairlib analyze: {e}", file=sys.stderr)
        return 2
    if args.compare:
        print(f"fairlib analyze: {a.scenario}: A = {a.label} ({dirs[0]}), B = {b.label} ({dirs[1]})")
        print(compare_text(compare(a, b)))
        for tag, s in (("A", a), ("B", b)):
            print(f"verdict {tag}: {s.verdict.answer}")
        return 0 if a.valid and b.valid else 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    if not args.quiet:
        for s in setups:
            print(setup_summary(s, "fairlib analyze"))
    print(f"fairlib analyze: wrote {out}" + (f" and charts in {plots}" if plots else ""))
    return 0 if all(s.valid for s in setups) else 1


if __name__ == "__main__":
    sys.exit(main())
