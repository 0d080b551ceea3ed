"""The ``fairlib`` command line.

    fairlib serve    --port 8000 --iter-base-ms 8 --iter-slope-ms 1.5 --policy vtc --policy-param wq=2
    fairlib gateway  --upstream http://127.0.0.1:8000/v1 --policy vtc --max-inflight 16 --port 8080
    fairlib run      --scenario noisy_neighbor --endpoint http://127.0.0.1:8000/v1 --seed 0 --out runs/nn/s0
    fairlib simulate --scenario noisy_neighbor --seed 0 --out runs/nn-sim/s0
    fairlib sweep    --scenario noisy_neighbor --policy fcfs --policy vtc --seeds 0,1,2 --out sweep.csv
    fairlib probe    --endpoint http://127.0.0.1:8000/v1 --out probe.json
    fairlib fit      --endpoint http://127.0.0.1:8000/v1 --max-batch 16 --out runs/fits/vllm.json
    fairlib analyze  --run RUN_DIR [--run RUN_DIR ...] --out report.md --plots
    fairlib scenarios

``gateway`` puts the book's policies in front of any OpenAI-compatible engine (fairlib.gateway).
``serve`` is a test double (the engine model in real time, fairlib.serve), never an engine.
``run`` sends a scenario's schedule open-loop to an endpoint and writes a run directory
(fairlib.client.measure); ``simulate`` writes the same run-directory shape from the simulator
(fairlib.records), so ``analyze`` reads both the same way. Load: a scenario file states ``rho``
(offered load relative to capacity); ``--rho`` replaces it, ``--rate-scale`` multiplies it, and
``--capacity-file`` (a ``fairlib probe`` or ``fairlib fit`` result) makes it relative to the probed engine.
``fit`` fits the cost model of any endpoint in the format of ``fairlib.calibrate.fit`` (what chapters 1 and 8
read as ``fit_file``), with the endpoint's identity; ``probe`` is the quicker one-context sweep.
``run`` sends one preflight request per API before its clock starts and stops with the server's
message when it fails; ``run``, ``simulate`` and ``analyze`` end with a per-tenant summary and the
scenario's verdict (``fairlib.analysis.console``); long commands show progress on a terminal
(``fairlib.progress``), one line per stage elsewhere, nothing but the result with ``--quiet``.
Every run directory carries a ``label`` (``--label``), the setup ``analyze`` groups by.

Credentials: ``--api-key`` (or the ``OPENAI_API_KEY`` environment variable) is sent as
``Authorization: Bearer``, ``--header`` adds any header, a ``user:password@`` in the URL is sent
as Basic auth; none of them is written to a run directory or printed (masked as ``***``).
Errors are one line on stderr naming the option: exit 2 for a usage error (a bad option or
scenario file, an ``--out`` that holds a run or cannot be written), 1 when the work itself fails,
130 on Ctrl-C before a command has started its work.
"""
from __future__ import annotations

import asyncio
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
from fairlib.backend import HttpOptions, SimOptions, default_run_dir, run_scenario
from fairlib.calibrate import fit as fitmod
from fairlib.calibrate.fit import normalise_url
from fairlib.calibrate.probe import probe
from fairlib.cli_commands import run_summary, scenario_lines, sweep_table
from fairlib.cli_parser import RUN_EXIT_STATUS, CliError, build_parser
from fairlib.client import EndpointConfig
from fairlib.client.endpoint import mask_url, redact
from fairlib.client.measure import RunOptions, exit_status, max_workers
from fairlib.client.preflight import resolve_model
from fairlib.client.progress import RunProgress
from fairlib.epp.plane import envoy_gateway_from_args, epp_from_args
from fairlib.gateway.server import gateway_from_args
from fairlib.progress import COMPILE_NOTICE, Progress, engine_model_compiled
from fairlib.serve.server import serve_from_args
from fairlib.sim.policies import parse_policy_param

__all__ = ["main", "build_parser", "load_tokenizer", "load_spec", "CliError", "run_exit_status", "RUN_EXIT_STATUS"]


# --- checks and shared helpers ---------------------------------------------------------------

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
    """The endpoint's first model; a server that is down, a base URL without /v1 or a credential
    it wants: one line with the cause's hint (``fairlib.client.preflight``), exit 1."""
    try:
        return resolve_model(endpoint)
    except RuntimeError as e:
        raise CliError(f"fairlib {cmd}: {e}", 1) from None


def _api_key(a):
    return a.api_key or os.environ.get("OPENAI_API_KEY") or None


# --- subcommands ------------------------------------------------------------------------------

def run_exit_status(summary: dict) -> int:
    """``fairlib run``'s exit status for a run's summary (``RUN_EXIT_STATUS``; the rules are
    ``fairlib.client.measure.exit_status``'s)."""
    return exit_status(summary)


def _extra_label(a) -> dict:
    return {"label": a.label} if a.label else {}


def cmd_run(a) -> int:
    if not 1 <= a.workers <= max_workers():
        raise CliError(f"fairlib run: --workers must be between 1 and {max_workers()} (the CPU count), got {a.workers}")
    prog = Progress("fairlib run", quiet=a.quiet)
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
                                                "capacity_file": a.capacity_file}, **_extra_label(a)}
    prog.stage(redact(f"{spec.name} seed {seed}: {n} requests over {spec.duration_s:g} s "
                      f"({n / spec.duration_s:.2f} req/s) -> {a.endpoint} ({cfg.model}); run directory {out}",
                      cfg.secrets))
    options = RunOptions(preflight=True, progress=RunProgress(prog, n, spec.duration_s))
    run = run_scenario(spec, seed, HttpOptions(
        run_dir=out, endpoint_config=cfg, api=a.api, server_policy=a.server_policy, workers=a.workers,
        lag_threshold_ms=a.lag_threshold_ms, scrape_metrics=not a.no_metrics, config_extra=extra,
        overwrite=a.overwrite, tokenizer=load_tokenizer(a.tokenizer), handle_sigint=True,
        max_error_rate=a.max_error_rate, client=options))
    print(redact(run_summary(run, "fairlib run"), cfg.secrets), flush=True)
    return run_exit_status(run.summary)


def cmd_simulate(a) -> int:
    prog = Progress("fairlib simulate", quiet=a.quiet)
    spec = load_spec(a.scenario, rho=a.rho, rate_scale=a.rate_scale, capacity_file=a.capacity_file,
                     duration_s=a.duration_s)
    seed = spec.seeds[0] if a.seed is None else a.seed
    policy = a.policy or spec.policy
    out = Path(a.out) if a.out else default_run_dir(spec, "sim", seed)
    _check_out(out, a.overwrite, "simulate")
    params = _policy_params(a.policy_param)
    prog.stage(f"{spec.name} seed {seed}, policy {policy}: {len(spec.requests(seed))} requests over "
               f"{spec.duration_s:g} s of arrivals -> {out}")
    prog.compile_notice()
    run = run_scenario(spec, seed, SimOptions(policy=a.policy, policy_params=params, api=a.api, run_dir=out,
                                              overwrite=a.overwrite, config_extra=_extra_label(a)))
    print(run_summary(run, "fairlib simulate"), flush=True)
    return run_exit_status(run.summary)


def cmd_sweep(a) -> int:
    prog = Progress("fairlib sweep", quiet=a.quiet)
    seeds = _ints(a.seeds, "--seeds")
    if not seeds or min(seeds) < 0:
        raise CliError(f"fairlib sweep: --seeds takes integers >= 0, got {a.seeds!r}")
    rhos = None
    if a.rho:
        try:
            rhos = [float(x) for x in a.rho.split(",") if x.strip()]
        except ValueError:
            rhos = []
        if not rhos or min(rhos) <= 0 or not all(math.isfinite(r) for r in rhos):
            raise CliError(f"fairlib sweep: --rho takes comma-separated numbers > 0, got {a.rho!r}")
    spec = load_spec(a.scenario, duration_s=a.duration_s, capacity_file=a.capacity_file)
    policies = a.policy or [spec.policy]
    if a.out:
        _check_out(Path(a.out), True, "sweep", run_dir=False)
    rows, text = sweep_table(a.scenario, policies, seeds, rhos, prog, capacity_file=a.capacity_file,
                             duration_s=a.duration_s, workers=a.workers)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        rows.to_csv(a.out, index=False)
    print(f"fairlib sweep: {spec.name}: {len(rows)} runs" + (f" -> {a.out}" if a.out else ""))
    print(text)
    return 0


def cmd_scenarios(a) -> int:
    print("\n".join(scenario_lines()))
    print("load: offered load relative to the replica's capacity (below 1: latency isolation; at or above 1: "
          "shares); 'fairlib simulate --scenario NAME' runs one")
    return 0


def _server_start(cmd: str, quiet: bool = False) -> None:
    """A line before a server's ready line when its first start compiles the engine model."""
    if not quiet and not engine_model_compiled(cmd):
        print(f"fairlib {cmd}: starting; {COMPILE_NOTICE}", flush=True)


def _ints(text: str, name: str) -> list:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{name} takes comma-separated integers, got {text!r}") from None


def cmd_probe(a) -> int:

    a.endpoint = normalise_url(a.endpoint)
    _check_out(Path(a.out), True, "probe", run_dir=False)
    cfg = EndpointConfig(base_url=a.endpoint, api=a.api, ignore_eos=a.ignore_eos, send_min_tokens=a.send_min_tokens,
                         api_key=_api_key(a), headers=dict(a.header))
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


def _stop_background_job() -> None:
    """SIGTERM to a job started with SIGINT ignored (``cmd &`` in a shell without job control), so
    that asyncio installed no SIGINT handler: inside the sweep's event loop its tasks are cancelled,
    as asyncio's own handler cancels its main task (a KeyboardInterrupt raised there instead
    escapes from whichever task runs, and asyncio prints that task's traceback); outside a loop,
    KeyboardInterrupt at once."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise KeyboardInterrupt from None
    for t in asyncio.all_tasks(loop):
        t.cancel()
    loop.call_soon_threadsafe(lambda: None)


def cmd_fit(a) -> int:
    """``fairlib fit``: stops on Ctrl-C or SIGTERM with one line (nothing written), exit 130 / 143."""

    settings = _fit_settings(a)
    tok = load_tokenizer(a.tokenizer)
    got = {}

    def on_term(signum, frame):   # SIGTERM takes SIGINT's path (asyncio cancels the sweep cleanly)
        got["signal"] = "SIGTERM"
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            _stop_background_job()   # started as a background job (SIGINT ignored): SIGTERM must still stop it
        else:
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
    except (KeyboardInterrupt, asyncio.CancelledError):
        if "signal" not in got and not isinstance(sys.exc_info()[1], KeyboardInterrupt):
            raise
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
    if a.cmd in ("serve", "gateway", "epp"):
        _server_start("gateway" if a.cmd == "epp" else a.cmd)
        if a.cmd == "epp":
            return epp_from_args(a)
        if a.cmd == "gateway" and a.data_plane == "envoy":
            return envoy_gateway_from_args(a)
        return serve_from_args(a) if a.cmd == "serve" else gateway_from_args(a)
    try:
        if a.cmd == "run":
            return cmd_run(a)
        if a.cmd == "simulate":
            return cmd_simulate(a)
        if a.cmd == "sweep":
            return cmd_sweep(a)
        if a.cmd == "scenarios":
            return cmd_scenarios(a)
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
