"""Starting and stopping ``fairlib serve``: in the foreground (the CLI), in a background thread,
or in a child process (tests, notebooks, benchmarks), and its command-line arguments."""
from __future__ import annotations

import argparse
import asyncio
import ctypes
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Optional, Sequence

from aiohttp import web

from fairlib.paths import repo_root
from fairlib.serve.app import DRIVER, make_app
from fairlib.serve.config import ENGINE_FIELDS, ServeConfig, load_engine_params
from fairlib.sim.engine import Engine
from fairlib.sim.policies import parse_policy_param

__all__ = ["serve_from_args", "start", "serve_forever", "ServerThread", "ServerProcess", "add_arguments", "config_from_args",
           "READY_PREFIX"]

READY_PREFIX = "fairlib serve: listening on "


async def start(cfg: ServeConfig):
    """Bind and start; returns ``(runner, port)`` (``runner.app[DRIVER]`` is the driver)."""
    app = make_app(cfg)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port, reuse_address=True)
    await site.start()
    port = runner.addresses[0][1]
    return runner, port


def _describe(cfg: ServeConfig, port: int) -> str:
    e = cfg.engine
    params = f" {cfg.policy_params}" if cfg.policy_params else ""
    return (f"{READY_PREFIX}http://{cfg.host}:{port} (model {cfg.model!r}, policy {cfg.policy}{params}, "
            f"dt = {e.iter_base_ms:g} + {e.iter_slope_ms:g} B + {e.prefill_ms_per_token:g} P ms, "
            f"max_batch {e.max_batch}; a test double: the engine model in real time, not an engine)")


def serve_forever(cfg: ServeConfig, announce=True) -> None:
    """Run until SIGINT/SIGTERM. Prints one ready line (``READY_PREFIX`` + URL) when listening."""

    async def main():
        runner, port = await start(cfg)
        if announce:
            print(_describe(cfg, port), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())


class _Base:
    host = "127.0.0.1"
    port: Optional[int] = None

    @property
    def root(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (ending in ``/v1``)."""
        return self.root + "/v1"

    def get_json(self, path: str, timeout_s: float = 5.0) -> dict:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(self.root + path, timeout=timeout_s) as r:
            return json.loads(r.read())

    def get_text(self, path: str, timeout_s: float = 5.0) -> str:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(self.root + path, timeout=timeout_s) as r:
            return r.read().decode("utf-8")

    def stats(self) -> dict:
        return self.get_json("/fairlib/stats")

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class ServerThread(_Base):
    """``fairlib serve`` on its own event loop in a background thread of this process (shares the
    GIL with the caller: use ``ServerProcess`` when timing matters)."""

    def __init__(self, cfg: Optional[ServeConfig] = None, **kw):
        self.cfg = cfg if cfg is not None else ServeConfig(port=0, **kw)
        self._loop = self._thread = self._runner = None

    def start(self) -> "ServerThread":
        ready, box = threading.Event(), {}
        self._loop = asyncio.new_event_loop()

        def main():
            asyncio.set_event_loop(self._loop)
            try:
                self._runner, self.port = self._loop.run_until_complete(start(self.cfg))
            except BaseException as e:  # surface bind errors to the caller
                box["error"] = e
                ready.set()
                return
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=main, name="fairlib-serve", daemon=True)
        self._thread.start()
        if not ready.wait(60):
            raise RuntimeError("fairlib serve did not start within 60 s")
        if "error" in box:
            raise box["error"]
        return self

    @property
    def driver(self):
        return self._runner.app[DRIVER]

    def stop(self) -> None:
        if self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM it when the parent dies, so that a killed test
    run or notebook leaves no server behind."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class ServerProcess(_Base):
    """``fairlib serve`` in a child process (``python -m fairlib.cli serve --port 0 ARGS``).

    ``args``: the CLI's serve arguments, e.g. ``["--iter-base-ms", "8", "--policy", "vtc"]``.
    ``start()`` waits for the ready line and the bound port; ``stop()`` sends SIGTERM (then kills).
    """

    def __init__(self, args: Sequence[str] = (), env: Optional[dict] = None, startup_timeout_s: float = 120.0):
        self.args = [str(a) for a in args]
        self.env = env
        self.startup_timeout_s = startup_timeout_s
        self.proc: Optional[subprocess.Popen] = None
        self.ready_line: Optional[str] = None
        self._log: list = []

    def start(self) -> "ServerProcess":
        env = dict(os.environ if self.env is None else self.env)
        root = str(repo_root())
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("NUMBA_CACHE_DIR", str(Path(root) / ".cache" / "numba"))
        env["PYTHONUNBUFFERED"] = "1"
        cmd = [sys.executable, "-m", "fairlib.cli", "serve", "--port", "0", *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     start_new_session=True, preexec_fn=_die_with_parent)
        box = {}

        def reader():
            for line in self.proc.stdout:
                self._log.append(line.rstrip("\n"))
                if "line" not in box and line.startswith(READY_PREFIX):
                    box["line"] = line.strip()
                    got.set()
            got.set()

        got = threading.Event()
        threading.Thread(target=reader, name="fairlib-serve-log", daemon=True).start()
        if not got.wait(self.startup_timeout_s) or "line" not in box:
            self.stop()
            raise RuntimeError("fairlib serve did not start:\n" + "\n".join(self._log[-40:]))
        self.ready_line = box["line"]
        url = self.ready_line[len(READY_PREFIX):].split()[0]
        self.port = int(url.rsplit(":", 1)[1])
        return self

    @property
    def log(self) -> list:
        return list(self._log)

    def stop(self) -> None:
        p = self.proc
        if p is None:
            return
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.proc = None


# --- command line -----------------------------------------------------------------------------

def port_number(text: str) -> int:
    """``--port``: an integer in 0..65535 (argparse type)."""
    try:
        v = int(text)
    except ValueError:
        v = -1
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"must be an integer in 0..65535 (0: a free port), got {text!r}")
    return v


def add_arguments(p) -> None:
    """The ``serve`` subcommand's options."""
    g = p.add_argument_group("engine model (dt = iter_base + iter_slope * B + prefill * P ms)")
    g.add_argument("--engine-params", metavar="JSON|FILE",
                   help="engine fields as a JSON object, or a .json/.toml file (a probe result's 'engine' table "
                        "works); the flags below override it")
    g.add_argument("--iter-base-ms", type=float)
    g.add_argument("--iter-slope-ms", type=float)
    g.add_argument("--prefill-ms-per-token", type=float)
    g.add_argument("--max-batch", type=int)
    g.add_argument("--max-prefill-tokens", type=int)
    g.add_argument("--kv-capacity-tokens", type=int)
    p.add_argument("--policy", default="fcfs", help="scheduling policy (fairlib.POLICIES), default fcfs")
    p.add_argument("--policy-param", action="append", default=[], metavar="NAME=VALUE",
                   help="a policy parameter (VALUE parsed as JSON when it can be: wq=2, weights=[1,2]); repeatable")
    p.add_argument("--host", default="127.0.0.1", help="loopback only (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=8000,
                   help="0..65535; 0 picks a free port (printed on the ready line)")
    p.add_argument("--model", default="fairlib-sim", help="the served model name")
    p.add_argument("--tenants", type=int, default=8, help="most tenants told apart by the X-Tenant header")
    p.add_argument("--tenant-names", default="", help="comma-separated names given indices 0, 1, ... first")
    p.add_argument("--tenant-header", default="X-Tenant")
    p.add_argument("--api-key", help="as vLLM's --api-key: the /v1 routes answer 401 unless sent "
                                     "'Authorization: Bearer KEY'")
    p.add_argument("--max-waiting", type=int, help="HTTP 429 when this many requests wait (default: no cap)")
    p.add_argument("--mean-output-tokens", type=float, default=128.0,
                   help="mean of the geometric output length when a request does not force it (ignore_eos)")
    p.add_argument("--seed", type=int, default=0, help="seed of the output-length draws")
    p.add_argument("--max-model-len", type=int, default=8192)
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
                       api_key=a.api_key or None)


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
    try:
        cfg = config_from_args(a)
    except ValueError as e:
        print(f"fairlib serve: {e}", file=sys.stderr, flush=True)
        return 2
    try:
        serve_forever(cfg)
    except KeyboardInterrupt:
        print("fairlib serve: interrupted (SIGINT) while starting; nothing served", file=sys.stderr, flush=True)
        return 130
    except OSError as e:
        why = "the port is in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
        print(f"fairlib serve: cannot listen on {cfg.host}:{cfg.port}: {why} (--port: another port in 0..65535, "
              f"or 0 for a free one)", file=sys.stderr, flush=True)
        return 1
    return 0
