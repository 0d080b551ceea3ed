"""Start, health-check and stop a serving engine: ``fairlib serve``, vLLM, llama.cpp's server, or an
endpoint someone else started.

    from fairlib.calibrate.lifecycle import start_engine
    with start_engine("llamacpp", n_parallel=8) as eng:          # or "vllm", "fairlib", "external"
        summary = run(schedule, eng.endpoint_config(), "runs/x")

Each engine runs on 127.0.0.1 on a free port (or the one given), in its own process group, with
its output in a log file (``.cache/engines/`` or ``$FAIRLIB_ENGINES_LOG_DIR``). ``start`` waits
for ``GET /health`` to answer 200; when the process exits or the timeout passes first it raises
``EngineStartError`` with the log's tail. ``stop``
signals the engine's own process group (SIGTERM, then SIGKILL after ``stop_timeout_s``), never
anything found by name; an ``atexit`` hook and (on Linux) the parent-death signal stop engines
the caller forgot (the parent-death signal follows the thread that started the engine: start
engines from a thread that outlives them, e.g. the main thread). ``kind="external"`` wraps a URL the user started (a GPU host, say): nothing is
started or stopped.

Engines come from ``engines/setup_*.sh`` (``.engines/`` in the repository, or
``$FAIRLIB_ENGINES_DIR``): the vLLM CPU build in ``.engines/vllm-venv``, ``llama-server`` in
``.engines/llama.cpp/build/bin``, and the tiny random-weight models in ``.engines/models``
(``engines/make_models.py``). ``engine_available(kind)`` says whether one is set up, and why not.

Engine-specific request settings (``EngineProcess.endpoint_config``):
- vLLM: ``ignore_eos``; ``return_token_ids`` (tokens are counted from ids, so coalesced chunks
  are counted right); ``priority`` sent when started with ``scheduling_policy="priority"``;
  ``--enable-per-request-metrics`` on, so the usage chunk carries a ``metrics`` object
  (``queue_time_ms``, ``time_to_first_token_ms``, ``generation_time_ms``, ``mean_itl_ms``), which
  the client keeps in each record's ``server_timings["metrics"]``.
- llama.cpp: ``ignore_eos`` (accepted by llama-server); ``cache_prompt: false`` (no prompt reuse
  between requests).
- Token-id prompts (exact prompt lengths) on both: ``EngineProcess.tokenizer()`` returns a
  tokenizer over the tiny model's vocabulary for ``fairlib.client.build_schedule``.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Optional

from fairlib.calibrate.engine_kinds import (DEFAULT_SERVED_NAME, KINDS, EngineStartError, default_model,
                                            engine_available, fairlib_command, flag_args, llama_server_path,
                                            llamacpp_command, vllm_command, vllm_python)
from fairlib.calibrate.processes import (HOST, check_cpus, child_setup, free_port, group_members, http_get,
                                         move_threads, nice_of, port_is_free, rss_bytes_of, sched_of)
from fairlib.calibrate.tokenizer import ModelTokenizer
from fairlib.client import EndpointConfig
from fairlib.client.endpoint import server_root
from fairlib.paths import engine_logs_dir, engines_dir, repo_root

__all__ = [
    "KINDS", "EngineStartError", "EngineProcess", "ModelTokenizer", "start_engine", "engine_available",
    "engines_dir", "repo_root", "group_members", "free_port", "port_is_free", "default_model", "vllm_python",
    "llama_server_path", "stop_all", "DEFAULT_NICE", "DEFAULT_SCHED_IDLE", "nice_of", "sched_of",
    "HOST", "DEFAULT_SERVED_NAME",
]

#: the old private names, kept for the tests that use them
_flag_args, _vllm, _llamacpp, _fairlib = flag_args, vllm_command, llamacpp_command, fairlib_command

DEFAULT_TIMEOUT_S = {"fairlib": 60.0, "vllm": 600.0, "llamacpp": 120.0, "external": 30.0}
#: How many steps below the starting process a real engine runs (``os.nice``), by default. On a
#: machine shared by client and engine (this project's 2 cores), an engine at equal priority keeps
#: every core busy and the client's sends wait for a time slice: a measured schedule lag of
#: 10 ms to 3.9 s at the p99 on vLLM-CPU, so most runs were invalid. One step of nice is worth
#: about 1.25x of CPU weight; 10 steps let the mostly idle client run as soon as it wakes, while
#: the engine still gets every cycle the client does not use. ``fairlib serve`` (a real-time
#: emulation whose emission times are the measurement) keeps the client's priority.
DEFAULT_NICE = {"fairlib": 0, "vllm": 10, "llamacpp": 10, "external": 0}
#: Whether a real engine also runs under Linux's ``SCHED_IDLE`` policy, by default. Nice 10 was not
#: enough once a gateway sat between client and engine: on this machine's kernel (6.18, EEVDF) a
#: nice-0 process that wakes often (the client, the gateway, a 1-ms sleep loop measuring its own
#: oversleep) waited up to 0.6-4.5 s for a core while vLLM's nice-10 threads ran the overloaded
#: blog-post scenario through the gateway, and 9 of 15 recorded gateway runs came out invalid
#: (the client's p99 schedule lag 15 ms to 3.1 s). Under ``SCHED_IDLE`` the engine runs whenever
#: nothing else wants a core, so it still gets every cycle the client does not use, and the same
#: run's worst oversleep was 44 ms, its p99 schedule lag 2 ms. Recorded with each run
#: (``sched_of``). Engines started by someone else (``external``) are not touched.
DEFAULT_SCHED_IDLE = {"fairlib": False, "vllm": True, "llamacpp": True, "external": False}
LOG_TAIL_LINES = 60


# --- process bookkeeping ----------------------------------------------------------------------

_LIVE: "set[EngineProcess]" = set()
_LIVE_LOCK = threading.Lock()


def stop_all() -> None:
    """Stop every engine this process started and has not stopped (the atexit hook)."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for eng in live:
        with contextlib.suppress(Exception):
            eng.stop()


atexit.register(stop_all)



@dataclass
class EngineProcess:
    """One engine: its command, its process, its URLs. ``start()``/``stop()`` or ``with``."""

    kind: str
    command: list = field(default_factory=list)   # empty for "external"
    env: dict = field(default_factory=dict)       # added to os.environ
    host: str = HOST
    port: Optional[int] = None
    model: str = "default"                        # the name requests carry
    model_path: Optional[Path] = None
    health_path: str = "/health"
    base_url: Optional[str] = None                # the OpenAI base (…/v1); derived when None
    startup_timeout_s: float = 120.0
    stop_timeout_s: float = 20.0
    log_path: Optional[Path] = None
    settings: dict = field(default_factory=dict)  # what endpoint_config() needs to know
    nice: int = 0                                 # steps below the starting process (os.nice)
    sched_idle: bool = False                      # run under SCHED_IDLE (DEFAULT_SCHED_IDLE)
    cpus: Optional[frozenset] = None              # the CPUs it is confined to (None: any)
    front_cpus: Optional[frozenset] = None        # its first process's CPUs once it is up (None: cpus)
    proc: Optional[subprocess.Popen] = field(default=None, repr=False)
    startup_s: Optional[float] = None             # seconds from spawn to healthy
    _log_file: Optional[IO[bytes]] = field(default=None, repr=False)

    def __post_init__(self):
        if self.base_url is None:
            if self.port is None:
                raise ValueError("EngineProcess needs a port or a base_url")
            self.base_url = f"http://{self.host}:{self.port}/v1"

    def __hash__(self):
        return id(self)

    def __eq__(self, other):
        return self is other

    # -- URLs
    @property
    def server_root(self) -> str:
        assert self.base_url is not None   # set in __post_init__
        return server_root(self.base_url)

    @property
    def health_url(self) -> str:
        return self.server_root + self.health_path

    @property
    def metrics_url(self) -> str:
        return self.server_root + "/metrics"

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self, timeout: float = 2.0) -> bool:
        return http_get(self.health_url, timeout)[0] == 200

    # -- lifecycle
    def start(self) -> "EngineProcess":
        """Spawn (unless external) and wait for health; ``EngineStartError`` with the log tail."""
        if self.kind == "external":
            self._wait_healthy(time.monotonic())
            return self
        if self.proc is not None:
            raise RuntimeError(f"{self.kind} engine already started (pid {self.pid})")
        if self.port is not None and not port_is_free(self.port, self.host):
            raise EngineStartError(f"{self.kind}: port {self.port} on {self.host} is already in use")
        if self.log_path is None:
            logs = engine_logs_dir()
            self.log_path = logs / f"{self.kind}-{self.port}-{time.strftime('%Y%m%d-%H%M%S')}.log"
        self.log_path = Path(self.log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab", buffering=0)
        self._log_file.write(f"# fairlib.calibrate.lifecycle: {' '.join(map(str, self.command))}\n".encode())
        env = {**os.environ, **{k: str(v) for k, v in self.env.items()}}
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [str(c) for c in self.command], stdin=subprocess.DEVNULL, stdout=self._log_file,
            stderr=subprocess.STDOUT, env=env, cwd=str(repo_root()),
            preexec_fn=functools.partial(child_setup, self.nice, self.sched_idle, self.cpus),
            close_fds=True)
        with _LIVE_LOCK:
            _LIVE.add(self)
        try:
            self._wait_healthy(t0)
            if self.front_cpus:
                self._move_front()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def _move_front(self) -> None:
        """The first process's threads onto ``front_cpus``; one that exited in between is a start
        that failed (with its log tail)."""
        assert self.proc is not None and self.front_cpus is not None
        try:
            move_threads(self.proc.pid, self.front_cpus)
        except FileNotFoundError:
            raise EngineStartError(f"{self.kind} engine exited right after it was healthy; log {self.log_path}:\n"
                                   f"{self.log_tail()}") from None

    def _wait_healthy(self, t0: float) -> None:
        deadline = t0 + self.startup_timeout_s
        status = 0
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise EngineStartError(
                    f"{self.kind} engine exited with code {self.proc.returncode} before it was healthy "
                    f"({self.health_url}); log {self.log_path}:\n{self.log_tail()}")
            status, _ = http_get(self.health_url, timeout=2.0)
            if status == 200:
                return
            if time.monotonic() > deadline:
                break
            time.sleep(0.25)
        raise EngineStartError(
            f"{self.kind} engine not healthy after {self.startup_timeout_s:.0f} s ({self.health_url} "
            f"last answered {status or 'nothing'}); log {self.log_path}:\n{self.log_tail()}")

    def stop(self) -> Optional[int]:
        """Stop the engine's process group (SIGTERM, then SIGKILL); returns the exit code."""
        with _LIVE_LOCK:
            _LIVE.discard(self)
        proc = self.proc
        if proc is None:
            return None
        pgid = proc.pid  # the child called setsid(): its pid is its process group
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
                proc.wait(10)
        # children that outlived the leader (vLLM's engine core, say), still in the group
        deadline = time.monotonic() + self.stop_timeout_s
        while group_members(pgid):
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
                time.sleep(0.2)
                break
            time.sleep(0.1)
        if self._log_file is not None:
            with contextlib.suppress(Exception):
                self._log_file.close()
            self._log_file = None
        return proc.returncode

    def __enter__(self) -> "EngineProcess":
        if self.kind != "external" and self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- inspection
    def log_tail(self, n: int = LOG_TAIL_LINES) -> str:
        if self.log_path is None or not Path(self.log_path).exists():
            return "(no log)"
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            lines = f.read().decode("utf-8", "replace").splitlines()
        return "\n".join(lines[-n:])

    def pids(self) -> list:
        """The engine's live processes (its process group)."""
        return group_members(self.proc.pid) if self.proc is not None and self.alive else []

    def rss_bytes(self) -> int:
        """Resident memory of the engine's whole process group."""
        return sum(rss_bytes_of(p) for p in self.pids())

    def tokenizer(self) -> Optional[ModelTokenizer]:
        """A tokenizer for exact token-id prompts when the model is one of the tiny models."""
        folder = self.settings.get("tokenizer_folder")
        if folder and (Path(folder) / "tokenizer.json").exists():
            return ModelTokenizer(folder)
        return None

    def endpoint_config(self, **overrides):
        """A ``fairlib.client.EndpointConfig`` with this engine's request settings."""

        kw = dict(base_url=self.base_url, model=self.model, ignore_eos=True,
                  send_priority=bool(self.settings.get("send_priority", False)),
                  extra_body=dict(self.settings.get("extra_body", {})),
                  metrics_url=self.metrics_url)
        if "extra_body" in overrides:
            kw["extra_body"] = {**kw["extra_body"], **(overrides.pop("extra_body") or {})}
        kw.update(overrides)
        return EndpointConfig(**kw)

    def describe(self) -> dict:
        """What a run directory's config should record about the engine."""
        return {"kind": self.kind, "base_url": self.base_url, "model": self.model,
                "model_path": str(self.model_path) if self.model_path else None,
                "command": [str(c) for c in self.command], "env": dict(self.env),
                "startup_s": self.startup_s, "log_path": str(self.log_path) if self.log_path else None,
                "settings": dict(self.settings), "nice": self.nice, "sched_idle": self.sched_idle,
                "cpus": sorted(self.cpus) if self.cpus else None,
                "front_cpus": sorted(self.front_cpus) if self.front_cpus else None}


def start_engine(kind: str, port: Optional[int] = None, *, startup_timeout_s: Optional[float] = None,
                 stop_timeout_s: float = 20.0, log_path=None, base_url: Optional[str] = None,
                 model: Optional[str] = None, health_path: str = "/health", nice: Optional[int] = None,
                 sched_idle: Optional[bool] = None, cpus=None, front_cpus=None, **flags) -> EngineProcess:
    """Start an engine and wait until it is healthy; use as ``with start_engine(...) as eng:``.

    ``kind``: ``"fairlib"`` (``python -m fairlib.cli serve``, the test double; ``flags`` become its
    ``--options``, e.g. ``iter_base_ms=8, policy="vtc", policy_param=["wq=2"]``; or pass
    ``command=[..., "{port}", ...]`` to run any other server the same way), ``"vllm"`` (flags: ``model`` (path),
    ``served_model_name``, ``max_num_seqs``, ``max_model_len``, ``dtype``, ``scheduling_policy``,
    ``kvcache_space_gib``, ``omp_threads_bind``, ``return_token_ids``, ``per_request_metrics``,
    ``extra_args``, ``env``),
    ``"llamacpp"`` (flags: ``model`` (GGUF path), ``alias``, ``n_parallel``, ``ctx_per_slot``,
    ``threads``, ``cache_prompt``, ``extra_args``, ``env``) or ``"external"`` (``base_url`` of a
    server someone else started, and its ``model`` name; only its health is checked).
    ``port``: default a free one. ``nice``: steps below this process the engine runs at (default
    :data:`DEFAULT_NICE`: 10 for real engines, 0 for ``fairlib serve``; 0 to keep this process's
    priority). ``sched_idle``: run it under ``SCHED_IDLE`` (default :data:`DEFAULT_SCHED_IDLE`:
    real engines yes). ``cpus``: the CPU numbers the engine and every process it starts are confined
    to (``fairlib.calibrate.processes.split_cpus`` gives one CPU for it and the rest for the caller);
    default any. ``front_cpus``: once the engine is healthy, the CPUs of its first process only (vLLM:
    the HTTP server, whose engine core and workers stay on ``cpus``). Returns the started ``EngineProcess`` (stopping it is the
    caller's: ``with``, ``.stop()``, or at interpreter exit at the latest).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown engine kind {kind!r}: one of {KINDS}")
    timeout = DEFAULT_TIMEOUT_S[kind] if startup_timeout_s is None else float(startup_timeout_s)
    cpus, front_cpus = check_cpus(cpus), check_cpus(front_cpus, "front_cpus")
    if kind == "external":
        if not base_url:
            raise ValueError("kind='external' needs base_url (the OpenAI base, e.g. http://host:8000/v1)")
        if flags or cpus is not None or front_cpus is not None:
            extra = sorted(flags) + [n for n, v in (("cpus", cpus), ("front_cpus", front_cpus)) if v is not None]
            raise ValueError(f"kind='external' starts nothing: unexpected flags {extra}")
        eng = EngineProcess("external", base_url=base_url, model=model or "default",
                            health_path=health_path, startup_timeout_s=timeout)
        if model is None:
            status, body = http_get(str(eng.base_url).rstrip("/") + "/models")
            with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
                eng.model = json.loads(body)["data"][0]["id"] if status == 200 else eng.model
        return eng.start()
    port = free_port() if port is None else int(port)
    if kind == "vllm":
        if model is not None:
            flags.setdefault("model", model)
        cmd, env, name, path, settings = vllm_command(port, **flags)
    elif kind == "llamacpp":
        if model is not None:
            flags.setdefault("model", model)
        cmd, env, name, path, settings = llamacpp_command(port, **flags)
    else:
        cmd, env, name, path, settings = fairlib_command(port, model=model, **flags)
    eng = EngineProcess(kind, command=[str(c) for c in cmd], env={k: str(v) for k, v in env.items()},
                        port=port, model=name, model_path=path, health_path=health_path,
                        startup_timeout_s=timeout, stop_timeout_s=stop_timeout_s, log_path=log_path,
                        settings=settings, nice=DEFAULT_NICE[kind] if nice is None else int(nice),
                        sched_idle=DEFAULT_SCHED_IDLE[kind] if sched_idle is None else bool(sched_idle),
                        cpus=cpus, front_cpus=front_cpus)
    return eng.start()


def main(argv=None) -> int:
    """``python -m fairlib.calibrate.lifecycle status`` | ``python -m fairlib.calibrate.lifecycle run KIND [--port P]``."""

    ap = argparse.ArgumentParser(prog="python -m fairlib.calibrate.lifecycle", description=main.__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("status", help="which engines are set up")
    r = sub.add_parser("run", help="start an engine and keep it up until Ctrl-C")
    r.add_argument("kind", choices=[k for k in KINDS if k != "external"])
    r.add_argument("--port", type=int)
    a = ap.parse_args(argv)
    if a.cmd == "status":
        for k in KINDS:
            ok, why = engine_available(k)
            print(f"{k:9s} {'ready' if ok else 'missing: ' + why}")
        return 0
    with start_engine(a.kind, a.port) as eng:
        print(f"{eng.kind} ready in {eng.startup_s:.1f} s: {eng.base_url} model={eng.model} "
              f"pid={eng.pid} log={eng.log_path}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while eng.alive:
                time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
