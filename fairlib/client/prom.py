"""The endpoint's Prometheus ``/metrics``: a text-format parser and a sampler in its own process.

``parse_prometheus`` keeps sample lines whose metric name starts with ``vllm:`` or ``llamacpp:``
and returns ``{"name{labels}": value}`` (labels as the server wrote them; NaN and infinities become
``None`` so the output is strict JSON). The engine's metrics have no tenant label: per-tenant
numbers come from the client's records.

``MetricsScraper`` samples in a child process (``python -I prom.py``: this file, standard library
only), so that neither the GET nor the text it returns costs the send loop anything: vLLM's
histograms took the old in-process sampler up to 1.3 s to parse, holding the interpreter. The
child appends one JSON line per sample to ``<path stem>.raw.jsonl`` as it goes, ``{"t": run
seconds, "wall": unix time, "elapsed_s", "text"}`` (or ``"error"`` instead of ``"text"``), flushed
at once: nothing measured is lost if the run dies. ``stop()`` ends the child (a last sample first)
and parses the raw text into ``path`` (``server_metrics.jsonl``: ``{"t", "wall", "metrics"}`` per
sample); ``parse_raw`` does the same for a raw file a dead run left. The child exits when the
parent dies (``PR_SET_PDEATHSIG``) or closes its stdin, ignores SIGINT, SIGHUP and SIGQUIT (the
parent stops it on those), and runs 10 nice levels below the parent (never competing with the
sender).
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

__all__ = ["parse_prometheus", "parse_raw", "raw_path_for", "MetricsScraper", "PREFIXES"]

PREFIXES = ("vllm:", "llamacpp:")


def _split_sample(line: str) -> Optional[tuple]:
    """``(key, value_text)`` of one sample line; the key keeps ``{labels}`` verbatim."""
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        i, quoted = brace + 1, False
        while i < len(line):
            c = line[i]
            if quoted and c == "\\":
                i += 2
                continue
            if c == '"':
                quoted = not quoted
            elif c == "}" and not quoted:
                break
            i += 1
        else:
            return None
        key, rest = line[:i + 1], line[i + 1:].split()
    else:
        parts = line.split()
        key, rest = parts[0], parts[1:]
    return (key, rest[0]) if rest else None


def parse_prometheus(text: str, prefixes=PREFIXES) -> dict:
    """Parse the Prometheus text format into ``{"name{labels}": float or None}``."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] == "#" or (prefixes and not line.startswith(tuple(prefixes))):
            continue
        kv = _split_sample(line)
        if kv is None:
            continue
        try:
            v = float(kv[1])
        except ValueError:
            continue
        out[kv[0]] = v if math.isfinite(v) else None
    return out


def raw_path_for(path) -> Path:
    """Where the raw samples behind ``path`` go: ``server_metrics.jsonl`` -> ``server_metrics.raw.jsonl``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.raw{path.suffix}")


def parse_raw(raw_path, out_path, prefixes=PREFIXES) -> dict:
    """Parse the raw samples at ``raw_path`` into ``out_path`` (one ``{"t", "wall", "metrics"}``
    line per answered sample; a torn last line is skipped, an unreadable one counted as an error).
    Returns ``{"samples", "errors", "last_error"}``."""
    samples, errors, last_error = 0, 0, None
    raw_path = Path(raw_path)
    with open(out_path, "w", encoding="utf-8") as out, \
            (open(raw_path, "rb") if raw_path.exists() else open(os.devnull, "rb")) as raw:
        for line in raw:                # one sample at a time: a long run's raw file can be large
            if not line.endswith(b"\n") or not line.strip():
                continue                # a torn last line (the run died mid-write), or blank
            try:
                r = json.loads(line)
            except ValueError as e:
                r = {"error": f"unreadable raw line: {e}"}
            if not isinstance(r, dict) or not isinstance(r.get("text"), str):
                errors += 1
                last_error = r.get("error") if isinstance(r, dict) else "unreadable raw line"
                continue
            m = parse_prometheus(r["text"], prefixes)
            out.write(json.dumps({"t": r["t"], "wall": r["wall"], "metrics": m}, separators=(",", ":")) + "\n")
            samples += 1
    return {"samples": samples, "errors": errors, "last_error": last_error}


# --- the sampler ------------------------------------------------------------------------------

class MetricsScraper:
    """Samples ``url`` every ``interval_s`` from ``t0_wall`` on, in a child process, until
    ``stop()``; the raw answers go to ``raw_path_for(path)``, their parse to ``path``."""

    def __init__(self, url: str, path, t0_wall: float, interval_s: float = 1.0, timeout_s: float = 2.0,
                 prefixes=PREFIXES, headers: Optional[dict] = None):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.url, self.path, self.t0_wall = url, Path(path), t0_wall
        self.headers = dict(headers or {})      # sent on each GET; reach the child on its stdin only
        self.raw_path = raw_path_for(self.path)
        self.interval_s, self.timeout_s, self.prefixes = interval_s, timeout_s, prefixes
        self.proc: Optional[subprocess.Popen] = None
        self.start_error: Optional[str] = None

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> "MetricsScraper":
        self.raw_path.write_bytes(b"")
        conf = {"url": self.url, "headers": self.headers, "raw_path": str(self.raw_path), "t0_wall": self.t0_wall,
                "interval_s": self.interval_s, "timeout_s": self.timeout_s, "parent": os.getpid()}
        try:
            # -I: no PYTHONPATH, user site or script folder on the path (this file needs the stdlib only)
            proc = self.proc = subprocess.Popen([sys.executable, "-I", str(Path(__file__).resolve())],
                                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, close_fds=True)
            assert proc.stdin is not None   # stdin=PIPE
            proc.stdin.write((json.dumps(conf) + "\n").encode())
            proc.stdin.flush()
        except OSError as e:
            self.start_error = f"{type(e).__name__}: {e}"
            self._kill()
        return self

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> dict:
        """End the child (it takes one last sample first), parse what it saved; returns counts."""
        if self.proc is not None:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()      # the child's signal to stop
            except OSError:
                pass
            try:
                self.proc.wait(self.timeout_s + 5)
            except subprocess.TimeoutExpired:
                self._kill()
        stats = parse_raw(self.raw_path, self.path, self.prefixes)
        if self.start_error and stats["last_error"] is None:
            stats["errors"] += 1
            stats["last_error"] = self.start_error
        return {"url": self.url, **stats, "raw": self.raw_path.name}


def _die_with_parent(parent: int) -> None:
    """SIGTERM this process when its parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``); exit now if
    it already has."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        sys.exit(0)


def _sample(opener, url: str, t0_wall: float, timeout_s: float, out, headers=None) -> bool:
    """One GET, its raw text (or error) appended to ``out``; False when the server has no ``/metrics``."""
    wall = time.time()
    line: dict = {"t": wall - t0_wall, "wall": wall}
    found = True
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=timeout_s) as r:
            line["text"] = r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        line["error"] = f"HTTP {e.code}"
        found = e.code != 404
    except (OSError, ValueError) as e:
        line["error"] = f"{type(e).__name__}: {e}"
    line["elapsed_s"] = time.time() - wall
    out.write(json.dumps(line, separators=(",", ":")) + "\n")
    out.flush()
    return found


def _child_main() -> int:
    """The child: the settings on stdin's first line; stdin's end (or the parent's death) stops it.
    A Ctrl-C or a hang-up to the process group is the parent's to handle (it stops the run, then
    closes stdin: the child takes its last sample); SIGTERM, its parent-death signal, ends it."""
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(s, signal.SIG_IGN)
    try:
        os.nice(10)                     # below the sender, should they share a core
    except OSError:
        pass
    line = sys.stdin.buffer.readline()
    if not line:
        return 0
    conf = json.loads(line)
    _die_with_parent(conf["parent"])
    url, t0, dt, timeout_s = conf["url"], conf["t0_wall"], conf["interval_s"], conf["timeout_s"]
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    live = True
    with open(conf["raw_path"], "a", encoding="utf-8") as out:
        nxt = max(time.time(), t0)
        while True:
            ready, _, _ = select.select([sys.stdin.fileno()], [], [], max(0.0, nxt - time.time()))
            if ready and not os.read(sys.stdin.fileno(), 4096):
                break                            # the parent closed stdin (or died): stop
            if ready:
                continue
            if live:
                live = _sample(opener, url, t0, timeout_s, out, conf.get("headers"))
            nxt += dt
            if nxt < time.time():
                nxt = time.time() + dt
        if live:
            _sample(opener, url, t0, timeout_s, out, conf.get("headers"))   # a last sample at the end of the run
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
