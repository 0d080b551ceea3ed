"""The run directory: written append-only while a run goes, read back as a DataFrame.

Layout: ``config.json`` (fully resolved settings), ``env.json``, ``records.jsonl`` (one JSON line
per request, appended and flushed as each completes: a crash loses nothing already measured),
``server_metrics.jsonl`` (``/metrics`` samples) and ``summary.json`` (written last). Reading a
damaged file raises ``ValueError`` naming the file and the line.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import threading
from pathlib import Path

import pandas as pd

from fairlib.records.schema import RECORD_FIELDS

__all__ = ["RunDir", "RecordWriter", "load_records", "load_summary", "load_server_metrics", "read_jsonl",
           "read_json", "records_path", "write_gzip"]


def _strict(obj, path: str, bad: list):
    """``obj`` with what strict JSON cannot hold replaced: non-finite floats by ``None``, other
    objects by their ``repr``, non-string keys by ``str``; ``bad`` gets each replaced path."""
    if isinstance(obj, float) and not math.isfinite(obj):
        bad.append(f"{path}={obj}")
        return None
    if obj is None or isinstance(obj, (str, int, float)):
        return obj
    if isinstance(obj, dict):
        return {str(k): _strict(v, f"{path}.{k}", bad) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v, f"{path}[{i}]", bad) for i, v in enumerate(obj)]
    bad.append(f"{path}={type(obj).__name__}")
    return repr(obj)


class RecordWriter:
    """Appends one JSON line per record and flushes it at once (thread-safe).

    ``write`` never fails silently, nor raises: a record strict JSON cannot hold (NaN, Infinity,
    an object) is written with those values as ``null`` or text, and a record that cannot be
    written at all (an OS error) is not; either way the record's ``error_class`` becomes
    ``record_error`` in place (the caller counts it: the run is not valid) and ``failed`` counts it.
    """

    def __init__(self, path):
        self.path = Path(path)
        self._f = open(self.path, "a", encoding="utf-8")
        self._lock = threading.Lock()
        self.count = 0
        self.failed = 0

    def write(self, rec: dict) -> None:
        try:
            line = json.dumps(rec, separators=(",", ":"), allow_nan=False) + "\n"
        except (ValueError, TypeError, RecursionError) as e:
            bad: list = []
            try:
                clean = _strict(rec, "", bad)
            except RecursionError:  # nested too deeply: keep the plain fields
                clean = {k: v for k, v in rec.items() if v is None or isinstance(v, (str, int))}
            self._flag(rec, f"record not strict JSON ({type(e).__name__}: {e}); written with "
                            + ", ".join(p.lstrip(".") for p in bad[:20]) + " as null/text")
            clean.update(error_class=rec["error_class"], error_message=rec["error_message"])
            line = json.dumps(clean, separators=(",", ":"), allow_nan=False) + "\n"
        with self._lock:
            try:
                self._f.write(line)
                self._f.flush()
                self.count += 1
            except (OSError, ValueError) as e:  # a full disk, a closed file
                self._flag(rec, f"record not written ({type(e).__name__}: {e})")

    def _flag(self, rec: dict, why: str) -> None:
        self.failed += 1
        was = f" (was {rec.get('error_class')}: {rec.get('error_message')})" if rec.get("error_class") != "none" else ""
        rec["error_class"] = "record_error"
        rec["error_message"] = (why + was)[:2000]

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
        for name in ("records.jsonl", "summary.json", "server_metrics.jsonl", "server_metrics.raw.jsonl"):
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
    """JSON lines (gzip-compressed when the name ends in ``.gz``: saved runs of the book); a torn
    last line (no final newline: a crash mid-write) is skipped. A damaged line raises
    ``ValueError`` naming the file and the line number (1-based)."""
    raw = Path(path).read_bytes()
    if str(path).endswith(".gz"):
        raw = gzip.decompress(raw)
    parts = raw.split(b"\n")
    complete = parts[:-1]  # the piece after the last newline is empty or torn
    out = []
    for i, line in enumerate(complete, 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except (ValueError, RecursionError) as e:
                raise ValueError(f"{path}, line {i}: not JSON ({e}): {line[:120]!r}") from None
    return out


def read_json(path):
    """One JSON file; a damaged one raises ``ValueError`` naming the file, line and column."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}, line {e.lineno} column {e.colno}: not JSON ({e.msg})") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply") from None


def records_path(run_dir) -> Path:
    """A run directory's records: ``records.jsonl``, or ``records.jsonl.gz`` where only that is
    there (a saved run, compressed)."""
    p = Path(run_dir) / "records.jsonl"
    gz = p.with_name(p.name + ".gz")
    return gz if not p.exists() and gz.exists() else p


def write_gzip(src, dst) -> None:
    """``src`` compressed to ``dst``, byte-identical for identical input (no name, no time)."""
    with open(src, "rb") as f, open(dst, "wb") as out:
        with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as z:
            shutil.copyfileobj(f, z)


def load_records(run_dir):
    """One row per request (sorted by request_id), the columns ``RECORD_FIELDS``;
    ``chunk_times_s``/``chunk_tokens`` stay lists."""
    recs = read_jsonl(records_path(run_dir))
    df = pd.DataFrame.from_records(recs, columns=list(RECORD_FIELDS)) if recs else pd.DataFrame(columns=list(RECORD_FIELDS))
    if len(df):
        df = df.sort_values("request_id", kind="mergesort").reset_index(drop=True)
    return df


def load_summary(run_dir) -> dict:
    return read_json(Path(run_dir) / "summary.json")


def load_server_metrics(run_dir):
    """``server_metrics.jsonl`` as a DataFrame: ``t``, ``wall`` and one column per metric key
    (empty when the run sampled nothing). A run killed outright (SIGKILL) leaves only the raw
    samples, ``server_metrics.raw.jsonl``: ``FileNotFoundError`` naming the call that parses them."""
    p = Path(run_dir) / "server_metrics.jsonl"
    raw = p.with_name("server_metrics.raw.jsonl")
    if not p.exists() and raw.exists() and raw.stat().st_size > 0:
        raise FileNotFoundError(f"{p} is missing: the run ended before parsing its raw /metrics samples; "
                                f"fairlib.client.prom.parse_raw('{raw}', '{p}') parses them")
    rows = read_jsonl(p) if p.exists() else []
    return pd.DataFrame([{"t": r["t"], "wall": r["wall"], **r["metrics"]} for r in rows])
