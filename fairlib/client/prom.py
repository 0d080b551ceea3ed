"""The endpoint's Prometheus ``/metrics``: a text-format parser and a 1 Hz background sampler.

``parse_prometheus`` keeps sample lines whose metric name starts with ``vllm:`` or ``llamacpp:``
and returns ``{"name{labels}": value}`` (labels as the server wrote them; NaN and infinities become
``None`` so the output is strict JSON). ``MetricsScraper`` appends one line per sample to
``server_metrics.jsonl``: ``{"t": run seconds, "wall": unix time, "metrics": {...}}``. The
engine's metrics have no tenant label: per-tenant numbers come from the client's records.
"""
from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.request
from typing import Optional

__all__ = ["parse_prometheus", "MetricsScraper", "PREFIXES"]

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


class MetricsScraper:
    """Samples ``url`` every ``interval_s`` in a daemon thread until ``stop()``."""

    def __init__(self, url: str, path, t0_wall: float, interval_s: float = 1.0, timeout_s: float = 2.0,
                 prefixes=PREFIXES):
        self.url, self.path, self.t0_wall = url, path, t0_wall
        self.interval_s, self.timeout_s, self.prefixes = interval_s, timeout_s, prefixes
        self.samples, self.errors, self.last_error = 0, 0, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fairlib-metrics", daemon=True)
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._file = None
        self._disabled = False

    def start(self) -> "MetricsScraper":
        self._file = open(self.path, "a", encoding="utf-8")
        self._thread.start()
        return self

    def scrape_once(self) -> Optional[dict]:
        if self._disabled:
            return None
        wall = time.time()
        try:
            with self._opener.open(self.url, timeout=self.timeout_s) as r:
                text = r.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            self.errors += 1
            self.last_error = f"HTTP {e.code}"
            if e.code == 404:
                self._disabled = True  # the server has no /metrics
            return None
        except (OSError, ValueError) as e:
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"
            return None
        line = {"t": wall - self.t0_wall, "wall": wall, "metrics": parse_prometheus(text, self.prefixes)}
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._file.flush()
        self.samples += 1
        return line

    def _loop(self):
        nxt = max(time.time(), self.t0_wall)
        while not self._stop.wait(max(0.0, nxt - time.time())):
            self.scrape_once()
            nxt += self.interval_s
            if nxt < time.time():
                nxt = time.time() + self.interval_s

    def stop(self) -> dict:
        """Stop, take one last sample, close the file; returns counts."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.timeout_s + 1)
        if self._file is not None:
            self.scrape_once()
            self._file.close()
            self._file = None
        return {"url": self.url, "samples": self.samples, "errors": self.errors, "last_error": self.last_error}
