"""A measurement a user can trust at a glance (issue 24): the preflight stops a setup that would
fail every request before the run starts, with the server's message and a hint; more than 1%
failed requests make a run INVALID (exit 1); progress shows on a terminal and not in a pipe; two
labels are two setups side by side, never one pooled "2 seed(s)"; the console summary's numbers
are the report's; every subcommand's help has an example and every option its default."""
import argparse
import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from fairlib import __version__, scenarios
from fairlib.analysis.glossary import DEFINITIONS
from fairlib.analysis.setups import SUMMARY_COLUMNS
from fairlib.cli import build_parser, main
from fairlib.client import load_summary
from fairlib.progress import COMPILE_NOTICE, Progress
from fairlib.serve import ServerProcess
from fairlib.serve.replay import ByTenant, HttpError, ReplayServer, Synth

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--iter-base-ms", 2, "--iter-slope-ms", 0.2, "--prefill-ms-per-token", 0.01, "--max-batch", 8]

# Two tenants, 10 periodic requests each over 2 s (a first: its offset is 0).
TWO = """
name = "two"
description = "Two tenants, periodic arrivals, short requests."
duration_s = 2.0
rho = 0.05
seeds = [0]
policy = "fcfs"
[[tenants]]
name = "a"
share = 0.5
prompt = 8
output = 4
arrival = { process = "periodic" }
ttft_slo_ms = 1000
tpot_slo_ms = 100
[[tenants]]
name = "b"
share = 0.5
prompt = 8
output = 4
arrival = { process = "periodic" }
ttft_slo_ms = 1000
tpot_slo_ms = 100
"""


@pytest.fixture
def two(tmp_path):
    p = tmp_path / "two.toml"
    p.write_text(TWO)
    return p


def env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_CACHE_DIR": str(ROOT / ".cache" / "numba")}


def run_cli(argv, capfd):
    """``main(argv)`` -> (exit code, stdout, stderr); a CliError's code counts as the exit code."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out, err = capfd.readouterr()
    return code, out, err


# --- preflight ------------------------------------------------------------------------------------
def test_wrong_model_stops_before_any_request_of_the_schedule(two, tmp_path, capfd):
    """The server's 404 and the models it serves, exit 1; the one request it got was the preflight
    (max_tokens 1), nothing of the schedule, and no run directory was written."""
    msg = "The model `gpt-4` does not exist."
    with ReplayServer({"r": HttpError(404, msg)}) as srv:
        code, out, err = run_cli(["run", "--scenario", two, "--endpoint", srv.url("r"), "--model", "gpt-4",
                                  "--out", tmp_path / "run", "--no-metrics"], capfd)
        sent = list(srv.state["requests"])
    assert code == 1
    line = err.strip().splitlines()[-1]
    assert line == (f"fairlib run: POST {srv.url('r')}/completions: HTTP 404: The model `gpt-4` does not exist; "
                    "the server serves 'replay-model': pass one with --model")
    assert len(sent) == 1 and sent[0]["body"]["max_tokens"] == 1 and sent[0]["body"]["model"] == "gpt-4"
    assert not (tmp_path / "run").exists()


def test_wrong_model_on_fairlib_serve_names_the_servers_message(two, tmp_path, capfd):
    with ServerProcess(FAST) as srv:
        code, _, err = run_cli(["run", "--scenario", two, "--endpoint", srv.base_url, "--model", "gpt-4",
                                "--out", tmp_path / "run", "--no-metrics"], capfd)
        submitted = srv.stats()["requests_submitted"]
    assert code == 1 and submitted == 0 and not (tmp_path / "run").exists()
    assert "HTTP 404: The model `gpt-4` does not exist" in err and "the server serves 'fairlib-sim'" in err


def test_missing_v1_and_down_get_their_own_hints(two, tmp_path, capfd):
    with ReplayServer({"r": Synth()}) as srv:
        no_v1 = srv.url("r")[:-3]
        code, _, err = run_cli(["run", "--scenario", two, "--endpoint", no_v1, "--out", tmp_path / "a"], capfd)
        assert code == 1 and err.strip().endswith(f"is the base URL missing /v1? (try --endpoint {no_v1}/v1)")
        code, _, err = run_cli(["run", "--scenario", two, "--endpoint", no_v1, "--model", "replay-model",
                                "--out", tmp_path / "a"], capfd)
        assert code == 1 and "HTTP 404" in err and err.strip().endswith(f"(try --endpoint {no_v1}/v1)")
        assert srv.state["requests"] == []          # the 404s came before any generation
    with ReplayServer({"r": Synth()}) as srv:
        dead = srv.url("r")
    code, _, err = run_cli(["run", "--scenario", two, "--endpoint", dead, "--out", tmp_path / "a"], capfd)
    assert code == 1 and "--model" not in err
    assert err.strip().endswith(f"is the server up, and is {dead} its base URL (http://HOST:PORT/v1)?")


# --- strict validity -------------------------------------------------------------------------------
def test_a_full_tenant_table_makes_the_run_invalid_and_names_the_message(two, tmp_path, capfd):
    """The issue's case: fairlib serve's tenant table (8 names) is full but for one name; tenant a
    takes it (and passes the preflight), every request of b gets the server's 503 naming --tenants:
    50% failed > 1% -> INVALID, exit 1, the console names the message with its count."""
    taken = ",".join(f"t{i}" for i in range(7))
    with ServerProcess(FAST + ["--tenants", 8, "--tenant-names", taken]) as srv:
        code, out, _ = run_cli(["run", "--scenario", two, "--endpoint", srv.base_url, "--out", tmp_path / "run",
                                "--no-metrics"], capfd)
    s = load_summary(tmp_path / "run")
    n_b = sum(1 for t in scenarios.load(two).requests(0)["tenant"] if t == 1)
    assert code == 1 and s["valid"] is False and s["error_counts"]["http_5xx"] == n_b == s["n_errors"] >= 2
    assert f"{n_b} of {2 * n_b} answered requests failed (50.0% > --max-error-rate 1%" in s["valid_reason"]
    (m,) = s["error_messages"]
    assert m["count"] == n_b and "restart fairlib serve with a larger --tenants" in m["message"]
    assert f"{n_b:>6} x http_5xx: HTTP 503: tenant 'b'" in out and "INVALID (" in out


def test_max_error_rate_loosens_the_rule(two, tmp_path, capfd):
    with ReplayServer({"r": ByTenant({"a": Synth(ttft_s=0.002)}, default=HttpError(500, "boom"))}) as srv:
        code, out, _ = run_cli(["run", "--scenario", two, "--endpoint", srv.url("r"), "--model", "m",
                                "--out", tmp_path / "run", "--no-metrics", "--max-error-rate", "0.6",
                                "--lag-threshold-ms", "1000"], capfd)
    s = load_summary(tmp_path / "run")
    assert s["error_rate"] == 0.5 and s["valid"] and code == 0 and "VALID" in out


# --- setups side by side -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sims(tmp_path_factory):
    """noisy_neighbor (seed 0) under fcfs and vtc, and its baseline, as fairlib simulate writes them."""
    d = tmp_path_factory.mktemp("sims")
    out = {}
    for name, pol, label in (("noisy_neighbor", "fcfs", "direct"), ("noisy_neighbor", "vtc", "gateway"),
                             ("victim_baseline", "fcfs", "direct")):
        out[(name, label)] = d / f"{name}_{label}"
        assert main(["simulate", "--scenario", name, "--duration-s", "20", "--policy", pol, "--label", label,
                     "--out", str(out[(name, label)]), "--quiet"]) == 0
    return out


def test_two_labels_are_two_columns_never_pooled_seeds(sims, tmp_path, capfd):
    rep = tmp_path / "r.md"
    code, out, _ = run_cli(["analyze", "--run", sims[("noisy_neighbor", "direct")],
                            "--run", sims[("noisy_neighbor", "gateway")], "--out", rep, "--n-boot", "50"], capfd)
    text = rep.read_text()
    assert code == 0
    assert "seed(s)" not in text and "seeds 0, 0" not in text
    assert "## Comparison: noisy_neighbor" in text
    assert "## noisy_neighbor [direct]" in text and "## noisy_neighbor [gateway]" in text
    header = next(line for line in text.splitlines() if line.startswith("| metric"))
    assert [c.strip() for c in header.strip("|").split("|")] == ["metric", "direct", "gateway"]
    row = next(line for line in text.splitlines() if line.startswith("| interactive: TTFT p99 (ms)"))
    a, b = (float(c) for c in row.strip("|").split("|")[1:])
    assert a != b                     # fcfs and vtc: two setups, two numbers (pooled, there would be one)
    assert out.count("[direct]: VALID") == 1 and out.count("[gateway]: VALID") == 1


def test_compare_prints_the_deltas(sims, capfd):
    code, out, _ = run_cli(["analyze", "--compare", sims[("noisy_neighbor", "direct")],
                            sims[("noisy_neighbor", "gateway")], "--n-boot", "50"], capfd)
    assert code == 0 and "A = direct" in out and "B = gateway" in out
    head = next(line for line in out.splitlines() if line.startswith("metric"))
    assert head.split() == ["metric", "direct", "gateway", "delta", "ratio"]
    row = next(line for line in out.splitlines() if line.startswith("interactive: TTFT p99 (ms)"))
    a, b, delta, ratio = (float(x) for x in row.split()[-4:])
    assert delta == pytest.approx(b - a, rel=1e-2) and ratio == pytest.approx(b / a, rel=1e-2)
    assert out.count("verdict ") == 2


def _console_rows(text: str) -> list:
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("tenant "))
    rows = []
    for line in lines[i + 2:]:
        if not line or line.startswith(("fairness:", "question:")):
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


def _report_rows(text: str) -> list:
    lines = text.split("### Summary", 1)[1].splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("| tenant"))
    rows = []
    for line in lines[i + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def test_the_summary_numbers_are_the_reports(sims, tmp_path, capfd):
    """fairlib simulate's console table, cell by cell, is the Summary table of fairlib analyze's report."""
    d = tmp_path / "sim"
    code, out, _ = run_cli(["simulate", "--scenario", "noisy_neighbor", "--duration-s", "20", "--policy", "vtc",
                            "--out", d], capfd)
    assert code == 0
    console = _console_rows(out)
    assert [r[0] for r in console] == ["interactive", "batch"] and len(console[0]) == 1 + len(SUMMARY_COLUMNS)
    rep = tmp_path / "r.md"
    assert main(["analyze", "--run", str(d), "--baseline", str(sims[("victim_baseline", "direct")]),
                 "--out", str(rep), "--n-boot", "50", "--quiet"]) == 0
    assert _report_rows(rep.read_text()) == console
    assert "verdict: Latency isolation" in out


# --- progress ---------------------------------------------------------------------------------------
def _run_under_pty(cmd) -> str:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))    # a 160 x 40 terminal
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, cwd=ROOT, env={**env(), "TERM": "xterm"},
                            close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        r, _, _ = select.select([master], [], [], 120)
        if not r:
            proc.kill()
            raise AssertionError("no output for 120 s: " + b"".join(chunks).decode(errors="replace"))
        try:
            data = os.read(master, 65536)
        except OSError:      # the child closed its side (EIO)
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(60)
    os.close(master)
    return b"".join(chunks).decode(errors="replace")


def test_progress_on_a_terminal_and_not_in_a_pipe(two, tmp_path):
    with ReplayServer({"r": Synth(ttft_s=0.01, itl_s=0.005)}) as srv:
        base = [sys.executable, "-m", "fairlib", "run", "--scenario", str(two), "--endpoint", srv.url("r"),
                "--model", "m", "--no-metrics", "--lag-threshold-ms", "1000", "--duration-s", "3"]
        tty = _run_under_pty(base + ["--out", str(tmp_path / "tty")])
        piped = subprocess.run(base + ["--out", str(tmp_path / "pipe")], capture_output=True, text=True, cwd=ROOT,
                               env=env(), timeout=120)
        quiet = subprocess.run(base + ["--out", str(tmp_path / "quiet"), "--quiet"], capture_output=True, text=True,
                               cwd=ROOT, env=env(), timeout=120)
    n = len(scenarios.load(two, duration_s=3).requests(0))
    # on a terminal: a bar redrawn in place with the live counts, above the stage lines
    redrawn = re.findall(r"\r(?!\n)[^\r\n]*", tty)         # a carriage return that is not a line's end
    assert any("answered:" in r and f"/{n} [" in r and "in flight" in r and "lag p99" in r for r in redrawn), tty
    assert "fairlib run: sending" in tty and "verdict:" in tty
    # in a pipe: the same stage lines, one per stage, and no bar
    assert piped.returncode == 0, piped.stderr
    both = piped.stdout + piped.stderr
    assert "\r" not in both and "answered:" not in both and "in flight" not in both
    stages = [line for line in piped.stdout.splitlines() if line.startswith("fairlib run: ")]
    assert [s.split(":")[1].split()[0] for s in stages[:3]] == ["two", "preflight", "sending"]
    # --quiet: the summary alone
    assert quiet.returncode == 0 and "preflight" not in quiet.stdout and "sending" not in quiet.stdout
    assert "verdict:" in quiet.stdout


def test_compile_notice_only_when_the_engine_model_is_not_compiled(monkeypatch, capsys):
    import fairlib.progress as progress
    monkeypatch.setattr(progress, "engine_model_compiled", lambda kind="simulate": False)
    assert Progress("fairlib simulate").compile_notice() is True
    assert capsys.readouterr().out == f"fairlib simulate: {COMPILE_NOTICE}\n"
    assert Progress("fairlib simulate", quiet=True).compile_notice() is True and capsys.readouterr().out == ""
    monkeypatch.setattr(progress, "engine_model_compiled", lambda kind="simulate": True)
    assert Progress("fairlib simulate").compile_notice() is False and capsys.readouterr().out == ""


def test_engine_model_compiled_reads_numbas_cache(tmp_path):
    """An empty cache directory: not compiled (the notice shows); the project's warm cache: compiled."""
    code = "from fairlib.progress import engine_model_compiled as c; print(c())"
    cold = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**env(), "NUMBA_CACHE_DIR": str(tmp_path / "empty")})
    assert cold.stdout.strip() == "False", cold.stderr
    subprocess.run([sys.executable, "-m", "fairlib", "simulate", "--scenario", "victim_baseline", "--duration-s", "2",
                    "--out", str(tmp_path / "warm"), "--quiet"], check=True, capture_output=True, cwd=ROOT,
                   env=env(), timeout=900)
    warm = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=env())
    assert warm.stdout.strip() == "True", warm.stderr


# --- help -------------------------------------------------------------------------------------------
SUBCOMMANDS = ("serve", "gateway", "epp", "run", "simulate", "sweep", "scenarios", "probe", "fit")
RST = re.compile(r"``|:(func|class|mod|meth|data|attr):|\*\*|^\.\. ", re.M)


@pytest.mark.parametrize("cmd", SUBCOMMANDS + ("analyze",))
def test_every_subcommand_has_an_example_and_every_option_its_default(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "example" in text and f"fairlib {cmd}" in text.split("example", 1)[1]
    assert not RST.search(text), RST.search(text)
    if cmd == "analyze":
        return
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices[cmd]
    fmt = parser._get_formatter()
    for act in parser._actions:
        if act.dest == "help":
            continue
        assert act.help, f"{cmd} {act.option_strings}: no help"
        shown = fmt._get_help_string(act)
        assert act.required or "default" in shown.lower(), f"{cmd} {act.option_strings}: no default in {shown!r}"


def test_version_scenarios_and_probe_header(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    top = capsys.readouterr().out
    assert e.value.code == 0 and not RST.search(top) and all(c in top for c in SUBCOMMANDS)
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"fairlib {__version__}"
    assert main(["scenarios"]) == 0
    out = capsys.readouterr().out
    for name in scenarios.SCENARIOS:
        line = next(line for line in out.splitlines() if line.startswith(name + " "))
        first = scenarios.load(name).description.split(". ")[0].rstrip(".")
        assert first in line
    a = build_parser().parse_args(["probe", "--endpoint", "http://127.0.0.1:1/v1", "--header", "X-Org: lab"])
    assert a.header == [("X-Org", "lab")]


def test_the_glossary_defines_every_column_of_the_report(sims, tmp_path):
    rep = tmp_path / "g.md"
    assert main(["analyze", "--run", str(sims[("noisy_neighbor", "direct")]), "--baseline",
                 str(sims[("victim_baseline", "direct")]), "--out", str(rep), "--n-boot", "50", "--quiet"]) == 0
    text = rep.read_text()
    body, glossary = text.split("## Glossary")
    defined = set(re.findall(r"^- \*\*([a-z0-9_]+)\*\*: ", glossary, re.M))
    lines = body.splitlines()
    headers = set()
    for line, nxt in zip(lines, lines[1:]):          # a table's header is the line above its |:--- rule
        if line.startswith("| ") and nxt.startswith("|:"):
            headers |= {c.strip() for c in line.strip("|").split("|")}
    columns = {h for h in headers if re.fullmatch(r"[a-z0-9_]+", h) and h not in ("tenant", "metric", "seed", "pct")}
    assert columns and columns <= defined, columns - defined
    assert defined <= set(DEFINITIONS)


def test_sweep_writes_the_rows_and_prints_their_means(tmp_path, capfd):
    out = tmp_path / "sweep.csv"
    code, text, _ = run_cli(["sweep", "--scenario", "noisy_neighbor", "--policy", "fcfs", "--policy", "vtc",
                             "--seeds", "0,1", "--rho", "0.6,1.2", "--duration-s", "10", "--workers", "1",
                             "--out", out, "--quiet"], capfd)
    import pandas as pd
    from fairlib.sweep import ScenarioPoint, scenario_policy, sweep
    rows = pd.read_csv(out)
    want = sweep(ScenarioPoint("noisy_neighbor", None, 10.0), {"rho": [0.6, 1.2]},
                 [scenario_policy("fcfs"), scenario_policy("vtc")], [0, 1], executor="serial", progress=False)
    assert code == 0 and len(rows) == 8
    pd.testing.assert_series_equal(rows["jain"], want["jain"], check_names=False)
    line = next(x for x in text.splitlines() if x.startswith("1.2") and " vtc " in x)
    assert line.split()[2] == f"{want[(want.rho == 1.2) & (want.policy == 'vtc')]['jain'].mean():.3f}"
