"""How fairlib's own HTTP servers (``fairlib serve``, ``fairlib gateway``) run: in the foreground
until a signal, on an event loop in a background thread (tests), or in a child process that
prints one ready line with its URL (chapters, benchmarks, tests that need timing)."""
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
import urllib.request
from pathlib import Path
from typing import Awaitable, Callable, Optional, Sequence

from aiohttp import web

from fairlib.paths import repo_root

__all__ = ["port_number", "start_app", "run_until_signal", "run_from_args", "module_main", "LocalServer", "ThreadServer",
           "ChildServer", "die_with_parent", "STOP_SIGNALS"]

#: what stops a server in the foreground (SIGHUP: its terminal went away)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def port_number(text: str) -> int:
    """``--port``: an integer in 0..65535 (argparse type)."""
    try:
        v = int(text)
    except ValueError:
        v = -1
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"must be an integer in 0..65535 (0: a free port), got {text!r}")
    return v


async def start_app(app, host: str, port: int):
    """Bind ``app`` (aiohttp) on ``host:port`` (0: a free port) and start it: ``(runner, port)``.
    A client that goes away cancels its handler (``handler_cancellation``)."""
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, runner.addresses[0][1]


def run_until_signal(start: Callable[[], Awaitable], announce: Optional[Callable[[int], str]] = None,
                     drain: Optional[Callable[[object], Awaitable]] = None,
                     loop_factory: Optional[Callable[[], asyncio.AbstractEventLoop]] = None) -> bool:
    """``await start()`` (an aiohttp ``(runner, port)``), print ``announce(port)``, run until a stop
    signal, then clean the runner up. ``drain``: awaited with the runner after the first signal,
    before the clean-up (a server finishing what it holds; it returns whether it finished); a
    second signal ends it at once. Returns False when a drain did not finish (cut by its own
    timeout, a second signal, or an error), else True."""

    async def main():
        runner, port = await start()     # SIGINT in here: KeyboardInterrupt (see below)
        if announce is not None:
            print(announce(port), flush=True)
        stop, again = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal():
            (again if stop.is_set() else stop).set()

        for sig in STOP_SIGNALS:
            try:
                loop.add_signal_handler(sig, on_signal)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        clean = True
        try:
            await stop.wait()
            if drain is not None:
                task = asyncio.ensure_future(drain(runner))
                second = asyncio.ensure_future(again.wait())
                await asyncio.wait({task, second}, return_when=asyncio.FIRST_COMPLETED)
                if task.done() and not task.cancelled() and task.exception() is None:
                    clean = bool(task.result())
                else:
                    clean = False
                    if task.done() and not task.cancelled():
                        print(f"drain failed: {task.exception()!r}", file=sys.stderr, flush=True)
                    else:
                        print("a second stop signal: stopping at once", file=sys.stderr, flush=True)
                for f in (task, second):
                    f.cancel()
        finally:
            await runner.cleanup()
        return clean

    # asyncio.run replaces Python's SIGINT handler with one that cancels the main task, which takes
    # effect at its next await only: a Ctrl-C during a start-up that computes without awaiting (the
    # engine model compiled by numba in an on_startup hook, 30-90 s) waited for all of it (a test
    # saw no exit within 60 s). asyncio leaves a handler of the program's own in place, so SIGINT
    # raises KeyboardInterrupt at once until main() installs the loop's stop handlers.
    previous = signal.getsignal(signal.SIGINT)
    own = threading.current_thread() is threading.main_thread() and previous is signal.default_int_handler
    if own:
        signal.signal(signal.SIGINT, _interrupt)
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(main())
    finally:
        if own:
            signal.signal(signal.SIGINT, previous)


def _interrupt(signum, frame):
    """SIGINT before the loop's own handlers: Python's default, as a handler asyncio leaves alone."""
    raise KeyboardInterrupt


def run_from_args(name: str, a, config_from_args: Callable, serve_forever: Callable,
                  config_errors: tuple = (ValueError,)) -> int:
    """A server's command line: ``config_from_args(a)``, then ``serve_forever(cfg)`` until a stop
    signal. Exit status: 0 when it served to the end, 1 when ``serve_forever`` returned False (a
    drain that was cut) or the port cannot be bound, 2 for a bad option (``config_errors``), 130
    for Ctrl-C before it listens; each error is one line on stderr, after ``name: ``."""
    try:
        cfg = config_from_args(a)
    except config_errors as e:
        print(f"{name}: {e}", file=sys.stderr, flush=True)
        return 2
    try:
        served = serve_forever(cfg)
    except KeyboardInterrupt:
        print(f"{name}: interrupted (SIGINT) while starting; nothing served", file=sys.stderr, flush=True)
        return 130
    except OSError as e:
        why = "the port is in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
        print(f"{name}: cannot listen on {cfg.host}:{cfg.port}: {why} (--port: another port in 0..65535, "
              f"or 0 for a free one)", file=sys.stderr, flush=True)
        return 1
    return 0 if served is not False else 1


def module_main(prog: str, description: str, add_arguments: Callable, from_args: Callable, argv=None) -> int:
    """``python -m fairlib.serve`` / ``python -m fairlib.gateway``: the subcommand's options
    (``add_arguments``) parsed from ``argv``, then ``from_args``'s exit status."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    add_arguments(p)
    return from_args(p.parse_args(argv))


#: the longest an in-process server may take to start before start() gives up
START_TIMEOUT_S = 300.0


class LocalServer:
    """A server on 127.0.0.1 at ``port``: its URLs and a JSON/text GET; a context manager."""

    host = "127.0.0.1"
    port: Optional[int] = None

    @property
    def root(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (ending in ``/v1``)."""
        return self.root + "/v1"

    def request(self, path: str, data: Optional[bytes] = None, timeout_s: float = 10.0):
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        req = urllib.request.Request(self.root + path, data=data,
                                     headers={"Content-Type": "application/json"} if data is not None else {})
        return opener.open(req, timeout=timeout_s)

    def get_json(self, path: str, timeout_s: float = 5.0) -> dict:
        with self.request(path, timeout_s=timeout_s) as r:
            return json.loads(r.read())

    def get_text(self, path: str, timeout_s: float = 5.0) -> str:
        with self.request(path, timeout_s=timeout_s) as r:
            return r.read().decode("utf-8")

    def start(self):
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class ThreadServer(LocalServer):
    """A server on its own event loop in a background thread of this process (it shares the GIL
    with the caller: use a ``ChildServer`` when timing matters). ``start_coro()`` returns the
    aiohttp ``(runner, port)``."""

    name = "fairlib-server"

    def __init__(self, start_coro: Callable[[], Awaitable]):
        self._start_coro = start_coro
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._runner: Optional[web.AppRunner] = None

    @property
    def runner(self) -> web.AppRunner:
        """The server's aiohttp runner (a RuntimeError before it has started)."""
        if self._runner is None:
            raise RuntimeError(f"{self.name} has not started (start() first)")
        return self._runner

    def start(self):
        ready, box = threading.Event(), {}
        self._loop = asyncio.new_event_loop()

        def main():
            asyncio.set_event_loop(self._loop)
            try:
                self._runner, self.port = self._loop.run_until_complete(self._start_coro())
            except BaseException as e:  # surface bind errors to the caller
                box["error"] = e
                ready.set()
                return
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=main, name=self.name, daemon=True)
        self._thread.start()
        # generous: the first start in a fresh clone compiles the engine's kernels (numba's cache
        # empty), which on a busy 2-core machine took over 60 s
        if not ready.wait(START_TIMEOUT_S):
            raise RuntimeError(f"{self.name} did not start within {START_TIMEOUT_S:.0f} s")
        if "error" in box:
            raise box["error"]
        return self

    def call(self, fn, *args):
        """``fn(*args)`` run on the server's loop (to read its state safely); its result."""
        done, box = threading.Event(), {}

        def run():
            try:
                box["v"] = fn(*args)
            except BaseException as e:
                box["e"] = e
            done.set()
        self._loop.call_soon_threadsafe(run)
        if not done.wait(10):
            raise TimeoutError(f"{self.name}: its loop did not answer within 10 s")
        if "e" in box:
            raise box["e"]
        return box.get("v")

    def stop(self) -> None:
        if self._thread is not None:
            assert self._loop is not None       # start() sets the loop before the thread
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None


def die_with_parent() -> None:
    """In a child before exec (Linux): SIGTERM it when the parent dies, so that a killed test run
    or notebook leaves no server behind."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class ChildServer(LocalServer):
    """``python -m fairlib.cli COMMAND --port 0 ARGS`` in a child process (its own session, dying
    with its parent). ``start()`` waits for the line that starts with ``ready_prefix`` and reads the
    bound port from the URL after it; ``stop()`` sends SIGTERM (then kills). ``cpu``: pin it to
    that core (``taskset``)."""

    command = ""
    ready_prefix = ""

    def __init__(self, args: Sequence[str] = (), env: Optional[dict] = None, startup_timeout_s: float = 120.0,
                 cpu: Optional[int] = None):
        self.args = [str(a) for a in args]
        self.env, self.startup_timeout_s, self.cpu = env, startup_timeout_s, cpu
        self.proc: Optional[subprocess.Popen] = None
        self.ready_line: Optional[str] = None
        self._log: list = []

    def start(self):
        env = dict(os.environ if self.env is None else self.env)
        root = str(repo_root())
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("NUMBA_CACHE_DIR", str(Path(root) / ".cache" / "numba"))
        env["PYTHONUNBUFFERED"] = "1"
        cmd = [sys.executable, "-m", "fairlib.cli", self.command, "--port", "0", *self.args]
        if self.cpu is not None:
            cmd = ["taskset", "-c", str(self.cpu), *cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     start_new_session=True, preexec_fn=die_with_parent)
        box, got = {}, threading.Event()

        def reader():
            for line in self.proc.stdout:
                self._log.append(line.rstrip("\n"))
                if "line" not in box and line.startswith(self.ready_prefix):
                    box["line"] = line.strip()
                    got.set()
            got.set()

        threading.Thread(target=reader, name=f"fairlib-{self.command}-log", daemon=True).start()
        if not got.wait(self.startup_timeout_s) or "line" not in box:
            self.stop()
            raise RuntimeError(f"fairlib {self.command} did not start:\n" + "\n".join(self._log[-40:]))
        self.ready_line = box["line"]
        url = self.ready_line[len(self.ready_prefix):].split()[0]
        self.port = int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        return self

    @property
    def log(self) -> list:
        return list(self._log)

    def stop(self) -> None:
        p = self.proc
        if p is None:
            return
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)      # a server that drains finishes what it holds ...
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGTERM)  # ... a second signal stops it at once
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        self.proc = None
