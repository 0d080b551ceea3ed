"""The inputs every metric shares: tenants, completed requests, SLOs, the service weights.

``QS`` are the reported percentiles; ``PREFILL_WEIGHT, DECODE_WEIGHT`` = 1, 2 weigh prompt and
output tokens in token-weighted service (VTC's); ``REFUSED`` are the error classes of requests the
server refused or never saw (not "starved"); ``STARVATION_FACTOR``: a TTFT over 10x the tenant's
TTFT SLO counts as starved.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from fairlib.records import Run, load_run

__all__ = ["QS", "STARVATION_FACTOR", "PREFILL_WEIGHT", "DECODE_WEIGHT", "REFUSED", "as_run",
           "tenant_names_of", "tenant_index", "numeric", "completed", "slo_of", "chunks", "load_window"]



QS = (50, 90, 99)


STARVATION_FACTOR = 10.0


PREFILL_WEIGHT, DECODE_WEIGHT = 1.0, 2.0


#: Error classes of requests the server refused, or that never reached it: not "starved".
REFUSED = ("http_429", "http_4xx", "connect_error", "client_error")


# --- inputs ------------------------------------------------------------------------------------
def as_run(x) -> Run:
    """A :class:`~fairlib.records.Run` from a Run, a run directory path or a records DataFrame.

    Parameters
    ----------
    x : Run, str, pathlib.Path or pandas.DataFrame
        A Run (returned as it is), a run directory (``load_run``) or records (``Run(x)``: no
        config, so no scenario or SLOs).

    Returns
    -------
    Run
        The run.

    Raises
    ------
    ValueError
        For any other type, or a directory ``load_run`` refuses.
    """
    if isinstance(x, Run):
        return x
    if isinstance(x, pd.DataFrame):
        return Run(x)
    if isinstance(x, (str, Path)):
        return load_run(x)
    raise ValueError(f"expected a Run, a run directory or a records DataFrame, got {type(x).__name__}")


def tenant_names_of(records: pd.DataFrame, tenant_names=None) -> list:
    if tenant_names is not None:
        return [str(n) for n in tenant_names]
    pairs = records[["tenant", "tenant_name"]].drop_duplicates().sort_values("tenant", kind="mergesort")
    return [str(n) for n in pairs["tenant_name"]]


def tenant_index(records: pd.DataFrame, names: list) -> np.ndarray:
    pos = {n: i for i, n in enumerate(names)}
    idx = np.array([pos.get(str(n), -1) for n in records["tenant_name"]], dtype=np.int64)
    if len(idx) and idx.min() < 0:
        unknown = sorted({str(n) for n in records["tenant_name"]} - set(names))
        raise ValueError(f"records name tenants {unknown} that are not in tenant_names {names}")
    return idx


def numeric(records: pd.DataFrame, col: str) -> np.ndarray:
    return pd.to_numeric(records[col], errors="coerce").to_numpy(dtype=np.float64)


def completed(records: pd.DataFrame) -> np.ndarray:
    return (records["error_class"] == "none").to_numpy()


def slo_of(slos: Mapping, name: str) -> tuple:
    if name not in slos:
        raise ValueError(f"no SLO for tenant {name!r} (SLOs given for {sorted(slos)})")
    s = slos[name]
    if isinstance(s, Mapping):
        return float(s["ttft_ms"]), float(s["tpot_ms"])
    return float(s[0]), float(s[1])


def chunks(records: pd.DataFrame):
    """Flattened chunks: (times_s, tokens, row index)."""
    times, toks, rows = [], [], []
    for r, (ct, ck) in enumerate(zip(records["chunk_times_s"], records["chunk_tokens"])):
        if ct is None or (isinstance(ct, float) and math.isnan(ct)) or len(ct) == 0:
            continue
        ct = np.asarray(ct, dtype=np.float64)
        ck = np.ones(len(ct)) if ck is None or len(ck) != len(ct) else np.asarray(ck, dtype=np.float64)
        times.append(ct)
        toks.append(ck)
        rows.append(np.full(len(ct), r, dtype=np.int64))
    if not times:
        return np.zeros(0), np.zeros(0), np.zeros(0, np.int64)
    return np.concatenate(times), np.concatenate(toks), np.concatenate(rows)


def load_window(run: Run, window):
    """``(lo, hi)`` seconds of ``window``: ``"load"`` = ``[0, duration_s)`` (every time when the
    duration is unknown), ``"all"`` or None = every time, or a ``(lo, hi)`` pair."""
    if window == "all" or window is None:
        return (-math.inf, math.inf)
    if window == "load":
        d = run.duration_s
        return (0.0, d) if math.isfinite(d) else (-math.inf, math.inf)
    lo, hi = window
    return (float(lo), float(hi))
