"""Running the picker: ``fairlib epp`` (the gRPC service alone, for an Envoy of the operator's) and
``fairlib gateway --data-plane envoy`` (Envoy started with a generated bootstrap in front of it).

One process holds the :class:`~fairlib.gateway.core.Gateway` (the policy, the lines, the
charge), its control app (the gateway's own aiohttp app on loopback: ``/health``, ``/metrics``
with Envoy's stats appended, ``/admin/*``, the upstream health checks and the credit) and the picker's gRPC server; Envoy is
its child (its own session, dying with its parent), with its bootstrap and log in a temporary
folder removed at the end. A stop signal drains as the Python gateway does (new requests 503
``shutting_down``, those waiting and in flight run to their end), then Envoy, the gRPC server and
the control app stop, in that order; no child is left.
"""
from __future__ import annotations

import asyncio
import errno
import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from functools import partial
from pathlib import Path
from typing import Optional
from urllib.parse import quote

from fairlib.epp.bootstrap import EnvoyMissing, EnvoyOptions, envoy_binary, envoy_command, write_bootstrap
from fairlib.epp.service import start_grpc
from fairlib.gateway.app import GATEWAY, GatewayApp, make_app
from fairlib.gateway.config import GatewayConfig
from fairlib.gateway.core import Gateway
from fairlib.gateway.server import config_from_args, describe, drain
from fairlib.servers import die_with_parent, run_from_args, run_until_signal, start_app

__all__ = ["Plane", "start_plane", "epp_from_args", "envoy_gateway_from_args", "EPP_READY_PREFIX"]

EPP_READY_PREFIX = "fairlib epp: listening on "
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Plane:
    """What runs for one picker: the control app's runner (``app``: the gateway's, for
    :func:`~fairlib.gateway.server.drain`), the gRPC server, Envoy (None: ``fairlib epp`` alone)."""

    def __init__(self, control_runner, control_port: int, grpc_server, picker, grpc_port: int):
        self.control_runner, self.control_port = control_runner, control_port
        self.app = control_runner.app
        self.grpc_server, self.picker, self.grpc_port = grpc_server, picker, grpc_port
        self.envoy: Optional[subprocess.Popen] = None
        self.folder: Optional[Path] = None
        self.envoy_admin: Optional[str] = None

    async def cleanup(self) -> None:
        """Envoy first (no new request reaches the picker), then the gRPC server, the control app."""
        try:
            if self.envoy is not None:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(None, self.quiesce)
                await loop.run_in_executor(None, stop_process, self.envoy)
            await self.grpc_server.stop(1.0)
            await self.control_runner.cleanup()
        finally:
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)


    def quiesce(self, timeout_s: float = 5.0) -> None:
        """Until Envoy holds no downstream request (the last bytes of a drained stream reach their
        client after the picker saw its end), at most ``timeout_s``: Envoy's SIGTERM cuts at once."""
        if self.envoy_admin is None or self.envoy is None or self.envoy.poll() is not None:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                _, body = _get(self.envoy_admin + "/stats?filter=" + quote(r"^http\.fairlib\.downstream_rq_active$"))
            except OSError:
                return
            if body.decode().strip().endswith(": 0"):
                return
            time.sleep(0.02)


def stop_process(p: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; waits for it."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


async def start_picker(cfg: GatewayConfig, grpc_port: int, control_port: int = 0) -> Plane:
    """The gateway, its control app on loopback (``control_port``, 0: free) and the picker's gRPC
    server on loopback (``grpc_port``)."""
    gw = Gateway(cfg)
    runner, cport = await start_app(make_app(gw), "127.0.0.1", control_port)
    try:
        server, picker, gport = await start_grpc(GatewayApp(gw), "127.0.0.1", grpc_port)
    except BaseException:
        await runner.cleanup()
        raise
    return Plane(runner, cport, server, picker, gport)


def _get(url: str, timeout_s: float = 1.0) -> tuple:
    try:
        with _opener.open(url, timeout=timeout_s) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def envoy_stats(admin_url: str) -> bytes:
    """Envoy's own stats in the Prometheus text format (its admin's ``/stats/prometheus``, families
    ``envoy_*``), for the gateway's ``/metrics``; a comment line saying why when Envoy does not answer."""
    try:
        status, body = _get(admin_url + "/stats/prometheus")
    except OSError as e:
        return f"# Envoy's stats unavailable: {e}\n".encode()
    if status != 200:
        return f"# Envoy's stats unavailable: HTTP {status}\n".encode()
    return body if body.endswith(b"\n") or not body else body + b"\n"


def _envoy_failed(log: Path, rc: int) -> OSError:
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    if "Address already in use" in tail or "cannot bind" in tail:
        return OSError(errno.EADDRINUSE, "the port is in use")
    return OSError(f"Envoy exited with {rc} while starting: {tail.strip().splitlines()[-1] if tail.strip() else ''}")


async def start_envoy(plane: Plane, cfg: GatewayConfig, binary: str, concurrency: int = 1) -> int:
    """Envoy in front of ``plane``'s picker, listening on ``cfg.host:cfg.port``; returns its port
    once it answers (its admin's ``/ready`` LIVE, the listener bound)."""
    plane.folder = Path(tempfile.mkdtemp(prefix="fairlib-envoy-"))
    timeout = 3600.0 if cfg.queue_timeout_s is None else cfg.queue_timeout_s + 60.0
    conf = write_bootstrap(EnvoyOptions(cfg.host, cfg.port, plane.grpc_port, plane.control_port, timeout,
                                        concurrency), plane.folder)
    addr, log = plane.folder / "admin.address", plane.folder / "envoy.log"
    with open(log, "wb") as out:
        plane.envoy = subprocess.Popen(envoy_command(binary, conf, addr, concurrency), stdout=out,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                       preexec_fn=die_with_parent)
    loop = asyncio.get_running_loop()
    while True:
        rc = plane.envoy.poll()
        if rc is not None:
            raise _envoy_failed(log, rc)
        if addr.exists() and addr.read_text().strip():
            plane.envoy_admin = "http://" + addr.read_text().strip()
            try:
                s, body = await loop.run_in_executor(None, _get, plane.envoy_admin + "/listeners?format=json")
            except OSError:
                s = 0
            if s == 200:
                ports = [ls["local_address"]["socket_address"]["port_value"]
                         for ls in json.loads(body).get("listener_statuses", []) if ls.get("name") == "fairlib"]
                if ports and ports[0]:
                    plane.app[GATEWAY].extra_metrics = partial(envoy_stats, plane.envoy_admin)
                    return int(ports[0])
        await asyncio.sleep(0.05)


async def start_plane(cfg: GatewayConfig, binary: str):
    """``fairlib gateway --data-plane envoy``'s start: ``(plane, Envoy's port)``."""
    plane = await start_picker(cfg, 0)
    try:
        return plane, await start_envoy(plane, cfg, binary)
    except BaseException:
        await plane.cleanup()
        raise


def _plane_line(cfg: GatewayConfig, plane: Plane, port: int) -> str:
    return (describe(cfg, port) + f" [data plane envoy; control http://127.0.0.1:{plane.control_port}; "
            f"epp grpc 127.0.0.1:{plane.grpc_port}]")


def envoy_gateway_from_args(a) -> int:
    """``fairlib gateway --data-plane envoy``: the gateway's options, Envoy in front; exit status
    as ``fairlib gateway``'s (a missing Envoy: one line naming the fix, exit 2)."""
    box = {}

    def configure(args):
        box["binary"] = envoy_binary()
        return _picker_config(args)

    def serve(cfg):
        return run_until_signal(lambda: _started(cfg), None, drain=lambda plane: drain(plane, cfg.drain_timeout_s))

    async def _started(cfg):
        plane, port = await start_plane(cfg, box["binary"])
        print(_plane_line(cfg, plane, port), flush=True)
        return plane, port

    return run_from_args("fairlib gateway", a, configure, serve, (ValueError, OSError, EnvoyMissing))


def epp_from_args(a) -> int:
    """``fairlib epp``: the picker's gRPC service on ``--port`` (loopback unless ``--host``), for
    an Envoy configured as :func:`~fairlib.epp.bootstrap.bootstrap` writes it."""
    def serve(cfg):
        async def started():
            plane = await start_picker(cfg, cfg.port, a.control_port)
            print(f"{EPP_READY_PREFIX}grpc://127.0.0.1:{plane.grpc_port} (policy {cfg.policy}; control "
                  f"http://127.0.0.1:{plane.control_port})", flush=True)
            return plane, plane.grpc_port
        return run_until_signal(started, None, drain=lambda plane: drain(plane, cfg.drain_timeout_s))

    return run_from_args("fairlib epp", a, _picker_config, serve, (ValueError, OSError))


def _picker_config(a) -> GatewayConfig:
    """The gateway's options for the picker, which runs on asyncio's loop (grpc.aio's)."""
    cfg = config_from_args(a)
    if cfg.event_loop != "asyncio":
        raise ValueError(f"--event-loop {cfg.event_loop}: the Python data plane's option; the endpoint picker "
                         f"runs on asyncio's loop (grpc.aio)")
    return cfg
