"""The ``fairlib`` command line.

    fairlib serve    --port 8000 --iter-base-ms 8 --iter-slope-ms 1.5 --policy vtc --policy-param wq=2
    fairlib gateway  --upstream http://127.0.0.1:8000/v1 --policy vtc --max-inflight 16 --port 8080
    fairlib run      --scenario noisy_neighbor --endpoint http://127.0.0.1:8000/v1 --seed 0 --out runs/nn/s0
    fairlib simulate --scenario noisy_neighbor --seed 0 --out runs/nn-sim/s0
    fairlib probe    --endpoint http://127.0.0.1:8000/v1 --out probe.json
    fairlib fit      --endpoint http://127.0.0.1:8000/v1 --max-batch 16 --out runs/fits/vllm.json
    fairlib analyze  RUN_DIR ... (fairlib.analysis)

``gateway`` puts the book's policies in front of any OpenAI-compatible engine (fairlib.gateway).
``serve`` is a test double (the engine model in real time, fairlib.serve), never an engine.
``run`` sends a scenario's schedule open-loop to an endpoint and writes a run directory
(fairlib.client.measure); ``simulate`` writes the same run-directory shape from the simulator
(fairlib.records), so ``analyze`` reads both the same way. Load: a scenario file states ``rho``
(offered load relative to capacity); ``--rho`` replaces it, ``--rate-scale`` multiplies it, and
``--capacity-file`` (a ``fairlib probe`` or ``fairlib fit`` result) makes it relative to the probed engine.
``fit`` fits the cost model of any endpoint in the format of ``fairlib.calibrate.fit`` (what chapters 1 and 8
read as ``fit_file``), with the endpoint's identity; ``probe`` is the quicker one-context sweep.

Credentials: ``--api-key`` (or the ``OPENAI_API_KEY`` environment variable) is sent as
``Authorization: Bearer``, ``--header`` adds any header, a ``user:password@`` in the URL is sent
as Basic auth; none of them is written to a run directory or printed (masked as ``***``).
Errors are one line on stderr naming the option: exit 2 for a usage error (a bad option or
scenario file, an ``--out`` that holds a run or cannot be written), 1 when the work itself fails,
130 on Ctrl-C before a command has started its work.
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

from fairlib import analysis as analyze
from fairlib import scenarios
from fairlib.backend import default_run_dir, run_scenario
from fairlib.calibrate import fit as fitmod
from fairlib.calibrate.fit import normalise_url
from fairlib.calibrate.probe import probe
from fairlib.client import EndpointConfig
from fairlib.client.endpoint import mask_url, redact, resolve_model
from fairlib.client.measure import MAX_ERROR_RATE, exit_status, max_workers
from fairlib.gateway.server import add_arguments as add_gateway_arguments
from fairlib.gateway.server import gateway_from_args
from fairlib.serve.server import add_arguments as add_serve_arguments
from fairlib.serve.server import serve_from_args
from fairlib.sim.policies import parse_policy_param

__all__ = ["main", "build_parser", "load_tokenizer", "load_spec", "CliError"]


# --- errors and option types ------------------------------------------------------------------

class CliError(SystemExit):
    """A command-line error: its one line goes to stderr when raised; exit ``code`` (2: usage)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(code)
        self.message = message
        print(message, file=sys.stderr, flush=True)

    def __str__(self) -> str:
        return self.message


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block), exit 2."""

    def error(self, message):
        raise CliError(f"{self.prog}: {message} ('{self.prog} --help' lists the options)", 2)


def _number(low: float, strict: bool = True, integer: bool = False):
    """An argparse type: a finite number (an integer when ``integer``) > ``low`` (>= when not ``strict``)."""
    what = f"{'an integer' if integer else 'a number'} {'>' if strict else '>='} {low:g}"

    def parse(text: str):
        try:
            v = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if not math.isfinite(v) or (v <= low if strict else v < low):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return v

    return parse


def _endpoint_url(text: str) -> str:
    """An argparse type: an http(s) endpoint URL (the message masks any credential in it)."""
    try:
        return EndpointConfig(base_url=text).base_url
    except ValueError:
        raise argparse.ArgumentTypeError(f"{mask_url(text)!r} is not an endpoint URL: pass http://HOST:PORT/v1 "
                                         "(or https://)") from None


def _header(text: str) -> tuple:
    """An argparse type: ``"Name: value"``."""
    name, sep, value = text.partition(":")
    if not sep or not name.strip() or any(c.isspace() for c in name.strip()):
        raise argparse.ArgumentTypeError("must be 'Name: value' (e.g. 'X-Org: research')")
    return name.strip(), value.strip()


def _check_out(out: Path, overwrite: bool, cmd: str, *, run_dir: bool = True) -> None:
    """Refuse an ``--out`` that holds a run (without ``--overwrite``) or cannot be written,
    before any work is done."""
    if run_dir:
        rec = out / "records.jsonl"
        if out.exists() and not out.is_dir():
            raise CliError(f"fairlib {cmd}: --out {out} is a file, not a run directory")
        if rec.is_file() and rec.stat().st_size > 0 and not overwrite:
            raise CliError(f"fairlib {cmd}: --out {out} already holds a run (records.jsonl); pass --overwrite "
                           f"to replace it, or choose another --out")
    elif out.is_dir():
        raise CliError(f"fairlib {cmd}: --out {out} is a directory; give a file name (e.g. probe.json)")
    parent = (out if run_dir else out.parent).absolute()
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise CliError(f"fairlib {cmd}: --out {out} cannot be written ({parent} is "
                       f"{'not a directory' if not parent.is_dir() else 'not writable'})")


# --- shared helpers ---------------------------------------------------------------------------

def load_tokenizer(name: Optional[str]):
    """``None``/``"whitespace"``: no tokenizer (prompts of N words). Otherwise a tokenizer file or
    folder, read with ``tokenizers`` (a ``tokenizer.json``) or ``transformers`` (a folder)."""
    if name is None or name == "whitespace":
        return None
    p = Path(name)
    if p.is_file():
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise SystemExit(f"--tokenizer {name}: reading a tokenizer.json needs the 'tokenizers' package "
                             "(pip install tokenizers), or use --tokenizer whitespace") from None
        return Tokenizer.from_file(str(p))
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise SystemExit(f"--tokenizer {name}: loading a tokenizer folder needs 'transformers'; offline, use "
                         "--tokenizer whitespace (prompt tokens = words)") from None
    return AutoTokenizer.from_pretrained(str(p), local_files_only=True)


def load_spec(scenario: str, *, rho=None, rate_scale=None, capacity_file=None, duration_s=None):
    """A scenario file (name or path) as a ``ScenarioSpec`` with the load options applied:
    ``rho`` replaces the file's rho (a baseline's: its base's), ``rate_scale`` multiplies every
    tenant's rate (``scenarios.load``)."""

    if rate_scale is not None and not rate_scale > 0:
        raise CliError(f"--rate-scale must be > 0, got {rate_scale}")
    return scenarios.load(scenario, capacity=capacity_file, duration_s=duration_s, rho=rho, rate_scale=rate_scale)


def _policy_params(items) -> dict:
    try:
        return dict(parse_policy_param(s) for s in items or [])
    except ValueError as e:
        raise CliError(f"--policy-param: {e}") from None


def _resolve_model(endpoint, cmd: str = "run") -> str:
    try:
        return resolve_model(endpoint)
    except ValueError as e:
        raise CliError(f"fairlib {cmd}: {e} (--model)", 1) from None


def _add_credentials(p) -> None:
    p.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY', never written (default: the "
                                     "OPENAI_API_KEY environment variable, which keeps the key out of 'ps')")
    p.add_argument("--header", action="append", default=[], type=_header, metavar="'NAME: VALUE'",
                   help="an HTTP header sent with every request (repeatable; secret ones masked in the run directory)")


def _api_key(a):
    return a.api_key or os.environ.get("OPENAI_API_KEY") or None


def _add_load_options(p) -> None:
    p.add_argument("--scenario", required=True, help="a scenario name (fairlib/scenarios/*.toml) or a .toml path")
    p.add_argument("--seed", type=_number(0, strict=False, integer=True),
                   help="run seed (default: the scenario's first seed)")
    p.add_argument("--duration-s", type=_number(0), help="replace the scenario's run length (seconds > 0)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--rho", type=_number(0), help="total offered load relative to capacity (replaces the file's rho; "
                                             "a baseline's rates follow its base scenario's rho)")
    g.add_argument("--rate-scale", type=_number(0), help="multiply every tenant's rate by this, in every scenario "
                                                    "(a baseline included: the file's rho times this)")
    p.add_argument("--capacity-file", help="a fairlib probe result (JSON): load is relative to the probed engine")
    p.add_argument("--out", help="the run directory (default runs/<scenario>/<backend>/seed<seed>)")
    p.add_argument("--overwrite", action="store_true", help="replace a run directory that already holds records")
    p.add_argument("--api", choices=("completions", "chat"), default="completions")


def build_parser() -> argparse.ArgumentParser:

    p = _Parser(prog="fairlib", description=__doc__.split("\n\n")[0].strip(),
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="{serve,gateway,run,simulate,probe,fit,analyze}")

    s = sub.add_parser("serve", help="an OpenAI-compatible test double timed by the engine model (not an engine)",
                       description="Serve the engine model in real time over HTTP (vLLM's wire format). A test "
                                   "double and a live demonstration of a policy: its numbers are never an engine's.")
    add_serve_arguments(s)

    g = sub.add_parser("gateway", help="the fairness gateway: the book's policies in front of an engine",
                       description="An OpenAI-compatible reverse proxy whose policy (the simulator's own code) decides "
                                   "who enters each upstream's batch; tenants by x-llm-d-inference-fairness-id or API "
                                   "key; charges from the stream as it runs; /metrics per tenant, /admin on loopback.")
    add_gateway_arguments(g)

    r = sub.add_parser("run", help="send a scenario open-loop to an endpoint; write a run directory",
                       description="Send a scenario's schedule open-loop to an endpoint and write a run directory "
                                   "(config.json, env.json, records.jsonl as requests complete, summary.json last, "
                                   "also when the run is stopped).",
                       epilog=RUN_EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_load_options(r)
    r.add_argument("--endpoint", required=True, type=_endpoint_url,
                   help="OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    r.add_argument("--model", help="model name (default: the first the endpoint lists)")
    _add_credentials(r)
    r.add_argument("--workers", type=int, default=1,
                   help=f"client processes, 1 to the CPU count ({max_workers()} here); the schedule is sharded "
                        "round-robin; they stop with the run and die with it")
    r.add_argument("--tokenizer", default="whitespace",
                   help="'whitespace' (prompt tokens = words; default) or a tokenizer.json / tokenizer folder")
    r.add_argument("--ignore-eos", dest="ignore_eos", action="store_true", default=True,
                   help="send ignore_eos: true (default)")
    r.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="do not send ignore_eos (for servers that reject it)")
    r.add_argument("--send-min-tokens", action="store_true", help="also send min_tokens = max_tokens")
    r.add_argument("--send-priority", action="store_true",
                   help="send each tenant's priority (vLLM: only with --scheduling-policy priority)")
    r.add_argument("--server-policy", help="a label: the policy the server is known to run (recorded)")
    r.add_argument("--lag-threshold-ms", type=_number(0), default=10.0,
                   help="p99 schedule lag (ms > 0) above which the run is invalid")
    r.add_argument("--timeout-s", type=_number(0), default=600.0, help="per-request timeout (seconds > 0)")
    r.add_argument("--max-error-rate", type=float, default=MAX_ERROR_RATE,
                   help=f"share of failed answers (0 to 1) above which a valid run warns and exits 3 "
                        f"(default {MAX_ERROR_RATE:g})")
    r.add_argument("--no-metrics", action="store_true", help="do not sample the endpoint's /metrics")

    m = sub.add_parser("simulate", help="run a scenario in the simulator; write the same run-directory shape")
    _add_load_options(m)
    m.add_argument("--policy", help="override the scenario's policy")
    m.add_argument("--policy-param", action="append", default=[], metavar="NAME=VALUE")

    q = sub.add_parser("probe", help="fit the engine model's costs and capacity of a live endpoint")
    q.add_argument("--endpoint", required=True, type=_endpoint_url,
                   help="OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    q.add_argument("--model", help="model name (default: the first the endpoint lists)")
    q.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY', never written (default: OPENAI_API_KEY)")
    q.add_argument("--api", choices=("completions", "chat"), default="completions")
    q.add_argument("--out", default="probe.json", help="where to write the result (JSON)")
    q.add_argument("--batches", default="1,2,4,8,16,32,64", help="running batch sizes to try (ascending)")
    q.add_argument("--decode-tokens", type=_number(8, strict=False, integer=True), default=48,
                   help="output tokens per stream in the batch sweep (>= 8)")
    q.add_argument("--prompt-tokens", type=_number(1, strict=False, integer=True), default=16,
                   help="prompt tokens per stream in the batch sweep")
    q.add_argument("--prefill-lengths", default="16,256,512,1024,1536,2048", help="prompt lengths for the TTFT fit")
    q.add_argument("--prefill-repeats", type=_number(1, strict=False, integer=True), default=5)
    q.add_argument("--max-batch", type=_number(1, strict=False, integer=True),
                   help="the engine's known batch limit (default: found by the sweep)")
    q.add_argument("--tokenizer", default="whitespace")
    q.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false", default=True)
    q.add_argument("--send-min-tokens", action="store_true")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--quiet", action="store_true")

    f = sub.add_parser("fit", help="fit the cost model of any endpoint (the fit format chapters 1 and 8 read)",
                       description="Measure an endpoint (vLLM, llama.cpp's server, any OpenAI-compatible server) "
                                   "and fit the engine model's cost model to it: the decode step against the running "
                                   "batch at several contexts, and the prefill cost. Writes the format of "
                                   "fairlib.calibrate.fit (fit.load_fit / load_engine / engine_at), with the endpoint's "
                                   "identity (URL, model, server kind and version, batch limit, context window), "
                                   "the client machine and the date. Pass the file to a chapter as fit_file.")
    f.add_argument("--endpoint", required=True, type=_endpoint_url,
                   help="OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    f.add_argument("--model", help="model name (default: the first the endpoint lists)")
    _add_credentials(f)
    f.add_argument("--kind", choices=("vllm", "llamacpp", "openai"),
                   help="the server (default: what it says: llama.cpp's GET /props, vLLM's GET /version; else openai)")
    f.add_argument("--max-batch", type=int,
                   help="the batch limit (vLLM: its --max-num-seqs; llama.cpp and fairlib serve tell theirs)")
    f.add_argument("--out", required=True, help="where to write the fit (JSON)")
    f.add_argument("--api", choices=("completions", "chat"), default="completions")
    f.add_argument("--tokenizer", default="whitespace",
                   help="'whitespace' (prompts of N words; the server's own counts are recorded) or a tokenizer")
    f.add_argument("--batches", help="batch sizes of the decode sweep (default: 1,2,4,8 and 1/4..4/4 of max-batch)")
    f.add_argument("--prompt-tokens", help="prompt lengths of the decode sweep, its contexts (default 32,320,768)")
    f.add_argument("--decode-tokens", type=int, help="output tokens per stream in the decode sweep (default 64)")
    f.add_argument("--prefill-lengths", help="prompt lengths of the prefill fit (default 16,64,...,768)")
    f.add_argument("--repeats", type=int, help="repeats of the decode sweep (default 2)")
    f.add_argument("--prefill-repeats", type=int, help="repeats of each prefill length (default 3)")
    f.add_argument("--note", default="", help="a note kept in the file")
    f.add_argument("--quiet", action="store_true", help="no progress lines")

    sub.add_parser("analyze", help="report on run directories (fairlib.analysis; 'fairlib analyze -h')",
                   add_help=False)
    return p


# --- subcommands ------------------------------------------------------------------------------

RUN_EXIT_STATUS = """exit status:
  0    the run is complete and valid: every planned request sent and recorded, at least one
       succeeded, p99 schedule lag within --lag-threshold-ms
  1    the run is invalid or incomplete (summary.json's valid_reason says which condition
       failed), or the work failed before it ran (e.g. the endpoint lists no model)
  2    a usage error (a bad option or scenario file, an --out that holds a run)
  3    valid, but the error rate exceeds --max-error-rate (summary.json: error_rate, warnings)
  128+N  stopped by signal N: 129 SIGHUP, 130 SIGINT (Ctrl-C), 131 SIGQUIT, 143 SIGTERM:
       in-flight requests are recorded as interrupted, unsent ones dropped, and summary.json
       says interrupted (never valid)"""


def run_exit_status(summary: dict) -> int:
    """``fairlib run``'s exit status for a run's summary (``RUN_EXIT_STATUS``; the rules are
    ``fairlib.client.measure.exit_status``'s)."""
    return exit_status(summary)


def cmd_run(a) -> int:
    if not 1 <= a.workers <= max_workers():
        raise CliError(f"fairlib run: --workers must be between 1 and {max_workers()} (the CPU count), got {a.workers}")
    spec = load_spec(a.scenario, rho=a.rho, rate_scale=a.rate_scale, capacity_file=a.capacity_file,
                     duration_s=a.duration_s)
    seed = spec.seeds[0] if a.seed is None else a.seed
    out = Path(a.out) if a.out else default_run_dir(spec, "http", seed)
    _check_out(out, a.overwrite, "run")
    cfg = EndpointConfig(base_url=a.endpoint, api=a.api, ignore_eos=a.ignore_eos, send_min_tokens=a.send_min_tokens,
                         send_priority=a.send_priority, timeout_s=a.timeout_s, headers=dict(a.header),
                         api_key=_api_key(a))
    cfg = replace(cfg, model=a.model or _resolve_model(cfg))
    n = len(spec.requests(seed))
    extra = {"tokenizer": a.tokenizer, "cli": {"rho": a.rho, "rate_scale": a.rate_scale,
                                                "capacity_file": a.capacity_file}}
    print(redact(f"fairlib run: {spec.name} seed {seed}: {n} requests over {spec.duration_s:g} s "
                 f"({n / spec.duration_s:.2f} req/s) -> {a.endpoint} ({cfg.model}); run directory {out}", cfg.secrets),
          flush=True)
    run = run_scenario(spec, seed, "http", endpoint_config=cfg, api=a.api, run_dir=out,
                       server_policy=a.server_policy, workers=a.workers,
                       lag_threshold_ms=a.lag_threshold_ms, scrape_metrics=not a.no_metrics, config_extra=extra,
                       overwrite=a.overwrite, tokenizer=load_tokenizer(a.tokenizer), handle_sigint=True,
                       max_error_rate=a.max_error_rate)
    _print_summary(run.summary, out)
    return run_exit_status(run.summary)


def _print_summary(summary: dict, out) -> None:
    lag = summary.get("schedule_lag_ms") or {}
    errs = {k: v for k, v in (summary.get("error_counts") or {}).items() if v and k != "none"}
    fmt = (lambda v: "-" if v is None else f"{v:.2f}")
    print(f"  {summary['n_ok']}/{summary['n_planned']} ok" + (f", errors {errs}" if errs else "")
          + f"; schedule lag p50 {fmt(lag.get('p50'))} ms, p99 {fmt(lag.get('p99'))} ms; "
          f"requested {fmt(summary.get('requested_rate_rps'))} req/s, achieved {fmt(summary.get('achieved_rate_rps'))}; "
          + ("VALID" if summary.get("valid") else f"INVALID ({summary.get('valid_reason')})")
          + (" [interrupted]" if summary.get("interrupted") else ""))
    for w in summary.get("warnings") or []:
        print(f"  WARNING: {w}")
    print(f"  {out}")


def cmd_simulate(a) -> int:
    spec = load_spec(a.scenario, rho=a.rho, rate_scale=a.rate_scale, capacity_file=a.capacity_file,
                     duration_s=a.duration_s)
    seed = spec.seeds[0] if a.seed is None else a.seed
    policy = a.policy or spec.policy
    out = Path(a.out) if a.out else default_run_dir(spec, "sim", seed)
    _check_out(out, a.overwrite, "simulate")
    run = run_scenario(spec, seed, "sim", policy=a.policy, policy_params=_policy_params(a.policy_param), api=a.api,
                       run_dir=out, overwrite=a.overwrite)
    print(f"fairlib simulate: {spec.name} seed {seed}, policy {policy}: {len(run.records)} requests "
          f"({spec.duration_s:g} s of arrivals) -> {out}")
    return 0


def _ints(text: str, name: str) -> list:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{name} takes comma-separated integers, got {text!r}") from None


def cmd_probe(a) -> int:

    a.endpoint = normalise_url(a.endpoint)
    _check_out(Path(a.out), True, "probe", run_dir=False)
    cfg = EndpointConfig(base_url=a.endpoint, api=a.api, ignore_eos=a.ignore_eos, send_min_tokens=a.send_min_tokens,
                         api_key=_api_key(a))
    cfg = replace(cfg, model=a.model or _resolve_model(cfg, "probe"))
    res = probe(cfg, batches=_ints(a.batches, "--batches"), decode_tokens=a.decode_tokens,
                prompt_tokens=a.prompt_tokens, prefill_lengths=_ints(a.prefill_lengths, "--prefill-lengths"),
                prefill_repeats=a.prefill_repeats, max_batch=a.max_batch, seed=a.seed,
                tokenizer=load_tokenizer(a.tokenizer), out=a.out, verbose=not a.quiet)
    e, f, c = res["engine"], res["fit"], res["capacity"]
    r2 = (lambda v: "-" if v is None else f"{v:.4f}")
    print(f"fairlib probe: dt = {e['iter_base_ms']:.3f} + {e['iter_slope_ms']:.4f} B "
          f"(R^2 {r2(f['decode']['r2'])}) + {e['prefill_ms_per_token']:.5f} P ms (R^2 {r2(f['prefill']['r2'])}); "
          f"max_batch {e['max_batch']}{' (lower bound)' if c['max_batch_is_lower_bound'] else ''}; "
          f"capacity {c['output_tokens_per_s']:.1f} output tokens/s -> {a.out}")
    return 0


def _fit_settings(a) -> dict:
    out = {}
    for name in ("batches", "prompt_tokens", "prefill_lengths"):
        v = getattr(a, name)
        if v is not None:
            out[name] = tuple(_ints(v, "--" + name.replace("_", "-")))
            if not out[name] or min(out[name]) < 1:
                raise CliError(f"fairlib fit: --{name.replace('_', '-')} takes integers >= 1, got {v!r}")
    for name in ("decode_tokens", "repeats", "prefill_repeats"):
        v = getattr(a, name)
        if v is not None:
            if v < 1 or (name == "decode_tokens" and v < 8):
                raise CliError(f"fairlib fit: --{name.replace('_', '-')} must be >= {8 if name == 'decode_tokens' else 1}, "
                               f"got {v}")
            out[name] = v
    return out


def cmd_fit(a) -> int:
    """``fairlib fit``: stops on Ctrl-C or SIGTERM with one line (nothing written), exit 130 / 143."""

    settings = _fit_settings(a)
    tok = load_tokenizer(a.tokenizer)
    got = {}

    def on_term(signum, frame):   # SIGTERM takes SIGINT's path (asyncio cancels the sweep cleanly)
        got["signal"] = "SIGTERM"
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            raise KeyboardInterrupt  # started as a background job (SIGINT ignored): SIGTERM must still stop it
        signal.raise_signal(signal.SIGINT)

    old = signal.signal(signal.SIGTERM, on_term)
    t0 = time.monotonic()
    try:
        eng = fitmod.endpoint_engine(a.endpoint, model=a.model, kind=a.kind, max_batch=a.max_batch,
                                     tokenizer=tok, api=a.api, api_key=_api_key(a), headers=dict(a.header))
        if not a.quiet:
            i = eng.info()
            print(f"fairlib fit: {i['engine']} at {eng.base_url}, model {eng.model!r}, max_batch "
                  f"{eng.settings['max_num_seqs']} ({eng.settings['max_num_seqs_source']})", flush=True)
        res = fitmod.fit_engine(eng, max_batch=eng.settings["max_num_seqs"], out=a.out, verbose=not a.quiet,
                                note=a.note, **settings)
    except KeyboardInterrupt:
        sig = got.get("signal", "SIGINT")
        print(f"fairlib fit: interrupted by {sig} after {time.monotonic() - t0:.0f} s; nothing written to {a.out}",
              file=sys.stderr, flush=True)
        return 143 if sig == "SIGTERM" else 130
    except (ValueError, RuntimeError, OSError) as e:
        raise SystemExit(f"fairlib fit: {' '.join(str(e).split())}") from None
    finally:
        signal.signal(signal.SIGTERM, old)
    s = res["fit"]["summary"]
    r2 = (lambda v: "-" if v is None else f"{v:.3f}")
    print(f"fairlib fit: dt = {s['iter_base_ms']:.3f} + ({s['slope_0_ms']:.4f} + {s['slope_ctx_ms_per_1k_tokens']:.4f} "
          f"ctx/1000) B ms (R^2 {r2(s['decode_r2'])}), prefill {s['prefill_ms_per_token']:.5f} ms/token "
          f"(R^2 {r2(s['prefill_r2'])}), max_batch {s['max_batch']}; {res['duration_s']:.0f} s -> {a.out}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "analyze":
        return int(analyze.main(argv[1:]) or 0)
    a = build_parser().parse_args(argv)
    if a.cmd == "serve":
        return serve_from_args(a)
    if a.cmd == "gateway":
        return gateway_from_args(a)
    try:
        if a.cmd == "run":
            return cmd_run(a)
        if a.cmd == "simulate":
            return cmd_simulate(a)
        if a.cmd == "probe":
            return cmd_probe(a)
        if a.cmd == "fit":
            return cmd_fit(a)
    except ValueError as e:  # invalid scenario files, parameters: one line, no traceback, exit 2
        raise CliError(f"fairlib {a.cmd}: {_one_line(e)}") from None
    except FileExistsError:  # a run directory that appeared since _check_out
        raise CliError(f"fairlib {a.cmd}: --out {a.out or 'the run directory'} already holds a run; pass --overwrite "
                       f"to replace it, or choose another --out") from None
    except (OSError, RuntimeError) as e:  # the work failed (a file not written, a probe without data): exit 1
        raise CliError(f"fairlib {a.cmd}: {_one_line(e)}", 1) from None
    except KeyboardInterrupt:  # Ctrl-C before a command took over SIGINT
        print(f"fairlib {a.cmd}: interrupted (SIGINT)", file=sys.stderr, flush=True)
        return 130
    raise SystemExit(f"unknown command {a.cmd!r}")


def _one_line(e: BaseException) -> str:
    """An exception as one line, any credential in it masked."""
    text = str(e) if not isinstance(e, OSError) or not e.strerror else \
        f"{e.strerror}" + (f": {e.filename}" if e.filename else "")
    return " ".join(mask_url(text).split())


if __name__ == "__main__":
    sys.exit(main())
