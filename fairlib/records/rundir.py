"""The run directory: written append-only while a run goes, read back as a DataFrame.

Layout: ``config.json`` (fully resolved settings), ``env.json``, ``records.jsonl`` (one JSON line
per request, appended and flushed as each completes: a crash loses nothing already measured),
``server_metrics.jsonl`` (``/metrics`` samples) and ``summary.json`` (written last).
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pandas as pd

from fairlib.records.schema import RECORD_FIELDS

__all__ = ["RunDir", "RecordWriter", "load_records", "load_summary", "load_server_metrics", "read_jsonl"]


class RecordWriter:
    """Appends one JSON line per record and flushes it at once (thread-safe)."""

    def __init__(self, path):
        self.path = Path(path)
        self._f = open(self.path, "a", encoding="utf-8")
        self._lock = threading.Lock()
        self.count = 0

    def write(self, rec: dict) -> None:
        line = json.dumps(rec, separators=(",", ":"), allow_nan=False) + "\n"
        with self._lock:
            self._f.write(line)
            self._f.flush()
            self.count += 1

    def close(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.flush()
                os.fsync(self._f.fileno())
                self._f.close()


class RunDir:
    """A run directory; refuses one that already holds records unless ``overwrite``."""

    def __init__(self, path, overwrite: bool = False):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        rec = self.path / "records.jsonl"
        if rec.exists() and rec.stat().st_size > 0:
            if not overwrite:
                raise FileExistsError(f"{rec} already holds records (pass overwrite=True to replace the run)")
        for name in ("records.jsonl", "summary.json", "server_metrics.jsonl"):
            p = self.path / name
            if p.exists():
                p.unlink()

    def write_json(self, name: str, obj) -> Path:
        """Write atomically (temp file, then rename)."""
        p = self.path / name
        tmp = p.with_suffix(p.suffix + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, sort_keys=True, default=str)
            f.write("\n")
        os.replace(tmp, p)
        return p

    def records_writer(self) -> RecordWriter:
        return RecordWriter(self.path / "records.jsonl")


def read_jsonl(path) -> list:
    """JSON lines; a torn last line (no final newline: a crash mid-write) is skipped."""
    parts = Path(path).read_bytes().split(b"\n")
    complete = parts[:-1]  # the piece after the last newline is empty or torn
    return [json.loads(line) for line in complete if line.strip()]


def load_records(run_dir):
    """One row per request (sorted by request_id), the columns ``RECORD_FIELDS``;
    ``chunk_times_s``/``chunk_tokens`` stay lists."""
    recs = read_jsonl(Path(run_dir) / "records.jsonl")
    df = pd.DataFrame.from_records(recs, columns=list(RECORD_FIELDS)) if recs else pd.DataFrame(columns=list(RECORD_FIELDS))
    if len(df):
        df = df.sort_values("request_id", kind="mergesort").reset_index(drop=True)
    return df


def load_summary(run_dir) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text(encoding="utf-8"))


def load_server_metrics(run_dir):
    """``server_metrics.jsonl`` as a DataFrame: ``t``, ``wall`` and one column per metric key."""

    p = Path(run_dir) / "server_metrics.jsonl"
    rows = read_jsonl(p) if p.exists() else []
    return pd.DataFrame([{"t": r["t"], "wall": r["wall"], **r["metrics"]} for r in rows])
