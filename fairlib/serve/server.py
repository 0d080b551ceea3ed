"""Starting and stopping ``fairlib serve``: in the foreground (the CLI), in a background thread,
or in a child process (tests, notebooks, benchmarks), and its command-line arguments."""
from __future__ import annotations

import time
import urllib.request
from typing import Optional

from fairlib.serve.app import DRIVER, make_app
from fairlib.serve.config import ServeConfig
from fairlib.servers import (
    ChildServer,
    ThreadServer,
    port_number,
    run_from_args,
    run_until_signal,
    start_app,
)
from fairlib.sim.engine import ENGINE_FIELDS, Engine, load_engine_params
from fairlib.sim.policies import parse_policy_param

__all__ = ["serve_from_args", "start", "serve_forever", "ServerThread", "ServerProcess", "add_arguments", "config_from_args",
           "READY_PREFIX"]

READY_PREFIX = "fairlib serve: listening on "


async def start(cfg: ServeConfig):
    """Bind and start; returns ``(runner, port)`` (``runner.app[DRIVER]`` is the driver)."""
    return await start_app(make_app(cfg), cfg.host, cfg.port)


def _describe(cfg: ServeConfig, port: int) -> str:
    e = cfg.engine
    params = f" {cfg.policy_params}" if cfg.policy_params else ""
    return (f"{READY_PREFIX}http://{cfg.host}:{port} (model {cfg.model!r}, policy {cfg.policy}{params}, "
            f"dt = {e.iter_base_ms:g} + {e.iter_slope_ms:g} B + {e.prefill_ms_per_token:g} P ms, "
            f"max_batch {e.max_batch}; a test double: the engine model in real time, not an engine)")


def serve_forever(cfg: ServeConfig, announce=True) -> bool:
    """Run until SIGINT/SIGTERM/SIGHUP. Prints one ready line (``READY_PREFIX`` + URL) when listening.
    Returns True (nothing to drain: it always ends clean)."""
    return run_until_signal(lambda: start(cfg), (lambda port: _describe(cfg, port)) if announce else None)


class ServerThread(ThreadServer):
    """``fairlib serve`` on its own event loop in a background thread of this process (shares the
    GIL with the caller: use ``ServerProcess`` when timing matters)."""

    name = "fairlib-serve"

    def __init__(self, cfg: Optional[ServeConfig] = None, **kw):
        self.cfg = cfg if cfg is not None else ServeConfig(port=0, **kw)
        super().__init__(lambda: start(self.cfg))

    @property
    def driver(self):
        return self.runner.app[DRIVER]

    def stats(self) -> dict:
        return self.get_json("/fairlib/stats")


class ServerProcess(ChildServer):
    """``fairlib serve`` in a child process (``python -m fairlib.cli serve --port 0 ARGS``).

    ``args``: the CLI's serve arguments, e.g. ``["--iter-base-ms", "8", "--policy", "vtc"]``.
    ``start()`` waits for the ready line and the bound port; ``stop()`` sends SIGTERM (then kills).
    """

    command, ready_prefix = "serve", READY_PREFIX

    def stats(self) -> dict:
        return self.get_json("/fairlib/stats")


# --- command line -----------------------------------------------------------------------------

_ENGINE = Engine()   # the engine model's defaults, shown in --help


def add_arguments(p) -> None:
    """The ``serve`` subcommand's options."""
    g = p.add_argument_group("engine model (dt = iter_base + iter_slope * B + prefill * P ms)")
    g.add_argument("--engine-params", metavar="JSON|FILE",
                   help="engine fields as a JSON object, or a .json/.toml file (a probe result's 'engine' table "
                        "works); the flags below override it")
    g.add_argument("--iter-base-ms", type=float,
                   help=f"fixed cost of one iteration, ms (default: {_ENGINE.iter_base_ms:g})")
    g.add_argument("--iter-slope-ms", type=float,
                   help=f"cost per running sequence, ms (default: {_ENGINE.iter_slope_ms:g})")
    g.add_argument("--prefill-ms-per-token", type=float,
                   help=f"cost per prompt token admitted, ms (default: {_ENGINE.prefill_ms_per_token:g})")
    g.add_argument("--max-batch", type=int,
                   help=f"most sequences in the running batch (default: {_ENGINE.max_batch:g})")
    g.add_argument("--max-prefill-tokens", type=int,
                   help="most prompt tokens admitted in one iteration (default: no cap)")
    g.add_argument("--kv-capacity-tokens", type=int,
                   help="KV cache capacity in tokens: a full cache preempts (default: no cap)")
    p.add_argument("--policy", default="fcfs", help="scheduling policy (fairlib.POLICIES), default fcfs")
    p.add_argument("--policy-param", action="append", default=[], metavar="NAME=VALUE",
                   help="a policy parameter (VALUE parsed as JSON when it can be: wq=2, weights=[1,2]); repeatable")
    p.add_argument("--host", default="127.0.0.1", help="loopback only (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=8000,
                   help="0..65535; 0 picks a free port (printed on the ready line)")
    p.add_argument("--model", default="fairlib-sim", help="the served model name")
    p.add_argument("--tenants", type=int,
                   help="most tenants told apart by the X-Tenant header, for the server's life; a new one beyond "
                        "them gets HTTP 503 (default: one per weight of --policy-param weights, else 64)")
    p.add_argument("--tenant-names", default="", help="comma-separated names given indices 0, 1, ... first")
    p.add_argument("--tenant-header", default="X-Tenant", help="the request header that names the tenant")
    p.add_argument("--no-metrics", action="store_true",
                   help="answer 404 on /metrics, as an OpenAI-compatible server without Prometheus metrics does "
                        "(default: off: vLLM's names are served)")
    p.add_argument("--api-key", help="as vLLM's --api-key: the /v1 routes answer 401 unless sent "
                                     "'Authorization: Bearer KEY'")
    p.add_argument("--max-waiting", type=int, help="HTTP 429 when this many requests wait (default: no cap)")
    p.add_argument("--mean-output-tokens", type=float, default=128.0,
                   help="mean of the geometric output length when a request does not force it (ignore_eos)")
    p.add_argument("--seed", type=int, default=0, help="seed of the output-length draws")
    p.add_argument("--max-model-len", type=int, default=8192, help="the context window: prompt + output tokens")
    p.add_argument("--spin-ms", type=float, default=1.0,
                   help="spin (yielding) for the last SPIN ms before each iteration's end (timer precision)")
    p.add_argument("--n-classes", type=int, default=4, help="service classes (the 'klass' field) for weighted/aging")


def config_from_args(a) -> ServeConfig:
    fields = dict(load_engine_params(a.engine_params)) if a.engine_params else {}
    for name in ENGINE_FIELDS:
        v = getattr(a, name, None)
        if v is not None:
            fields[name] = v
    engine = Engine(**fields)
    params = dict(parse_policy_param(s) for s in a.policy_param)
    names = tuple(s.strip() for s in a.tenant_names.split(",") if s.strip())
    return ServeConfig(engine=engine, policy=a.policy, policy_params=params, model=a.model, n_tenants=a.tenants,
                       tenant_names=names, n_classes=a.n_classes, max_waiting=a.max_waiting,
                       mean_output_tokens=a.mean_output_tokens, seed=a.seed, max_model_len=a.max_model_len,
                       host=a.host, port=a.port, spin_ms=a.spin_ms, tenant_header=a.tenant_header,
                       api_key=a.api_key or None, metrics=not a.no_metrics)


def wait_ready(root: str, timeout_s: float = 30.0) -> None:
    """Poll ``root/health`` until it answers 200."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with opener.open(root + "/health", timeout=1.0) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{root}/health did not answer within {timeout_s} s")
        time.sleep(0.05)


def serve_from_args(a) -> int:
    """``fairlib serve`` / ``python -m fairlib.serve``: the parsed options to a running server
    (until SIGINT or SIGTERM: exit 0). Errors are one line on stderr: a bad option (exit 2), a
    port that cannot be bound (exit 1), Ctrl-C before the server listens (exit 130)."""
    return run_from_args("fairlib serve", a, config_from_args, serve_forever)
