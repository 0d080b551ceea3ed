"""The Azure LLM inference trace 2023: a loader, and the summary tables the book commits.

Two one-hour production traces of LLM inference services in Azure (2023-11-16), code completion
and conversation, published by Microsoft in ``Azure/AzurePublicDataset`` under CC BY 4.0 with:
Patel, Choukse, Zhang, Shah, Goiri, Maleki, Bianchini, "Splitwise: Efficient generative LLM
inference using phase splitting", ISCA 2024. Columns: ``TIMESTAMP``, ``ContextTokens`` (prompt
tokens), ``GeneratedTokens`` (output tokens).

    df = load_azure_trace("code")        # timestamp, arrival_s, prompt_tokens, output_tokens
    t = trace_tenant("conv", machine_ms_per_s=750)   # a TenantSpec drawing the conversation lengths

The raw CSVs are never committed. :func:`load_azure_trace` reads a local copy (``path``; else the
directory in ``$FAIRLIB_AZURE_TRACE_DIR``; else ``../shared/data/azure-llm-inference-2023`` next
to the repository; else the download cache) or downloads the file from the public URL into the
cache (``~/.cache/fairlib/azure-llm-inference-2023``, or ``$XDG_CACHE_HOME/fairlib/...``).

What the project commits instead (:func:`write_trace_tables`, both with the attribution in a
``#`` header): ``data/azure_trace_summary.csv`` (per service: requests, duration, rate, mean and
percentiles of prompt and output tokens) and ``data/azure_trace_quantiles.csv`` (1,000 quantiles
of prompt and output tokens per service at q = (i + 0.5) / 1000, each a value of the trace:
a stratified sample of each marginal distribution). :func:`trace_lengths` and
:func:`trace_tenant` build :class:`fairlib.workload.Empirical` lengths from the quantile table,
so chapters rebuild the two services as tenants without the raw files. The quantile table keeps
each marginal, not the pairing of prompt and output: a tenant built from it draws the two
independently.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import urllib.request
from pathlib import Path
from typing import Mapping, Optional, Union

import numpy as np
import pandas as pd

from fairlib.paths import data_dir, repo_root
from fairlib.workload import Empirical, TenantSpec

__all__ = ["load_azure_trace", "trace_summary", "trace_quantiles", "write_trace_tables", "read_trace_summary",
           "read_trace_quantiles", "trace_lengths", "trace_tenant", "find_trace_file", "KINDS", "TRACE_URL",
           "ATTRIBUTION", "SUMMARY_FILE", "QUANTILES_FILE", "ENV_DIR"]

KINDS = ("code", "conv")
SERVICES = {"code": "code completion", "conv": "conversation"}
FILE_NAME = "AzureLLMInferenceTrace_{kind}.csv"
TRACE_URL = "https://github.com/Azure/AzurePublicDataset/raw/master/data/AzureLLMInferenceTrace_{kind}.csv"
ENV_DIR = "FAIRLIB_AZURE_TRACE_DIR"
SUBDIR = "azure-llm-inference-2023"
SHARED_DIR = repo_root().parent / "shared" / "data" / SUBDIR
DATA_DIR = data_dir()
SUMMARY_FILE = DATA_DIR / "azure_trace_summary.csv"
QUANTILES_FILE = DATA_DIR / "azure_trace_quantiles.csv"
N_QUANTILES = 1000
RAW_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

ATTRIBUTION = (
    "Derived from the Azure LLM inference trace 2023 (AzureLLMInferenceTrace_code.csv and "
    "AzureLLMInferenceTrace_conv.csv), Microsoft, https://github.com/Azure/AzurePublicDataset, "
    "licensed under CC BY 4.0 (https://creativecommons.org/licenses/by/4.0/); data of Patel, Choukse, "
    "Zhang, Shah, Goiri, Maleki, Bianchini, \"Splitwise: Efficient generative LLM inference using phase "
    "splitting\", ISCA 2024. Changes: only summary statistics and quantiles of the token counts, computed "
    "by fairlib.traces.write_trace_tables(); no request rows are reproduced."
)


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS} (code completion, conversation), got {kind!r}")
    return kind


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fairlib" / SUBDIR


def find_trace_file(kind: str, cache_dir: Union[str, Path, None] = None) -> Optional[Path]:
    """The first local copy of the trace file: ``$FAIRLIB_AZURE_TRACE_DIR``, then
    ``../shared/data/azure-llm-inference-2023`` next to the repository, then the cache."""
    name = FILE_NAME.format(kind=_check_kind(kind))
    dirs = []
    if os.environ.get(ENV_DIR):
        dirs.append(Path(os.environ[ENV_DIR]))
    dirs.append(SHARED_DIR)
    dirs.append(Path(cache_dir) if cache_dir is not None else default_cache_dir())
    for d in dirs:
        if (d / name).is_file():
            return d / name
    return None


def _download(url: str, dest: Path, timeout: float = 60.0) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
            shutil.copyfileobj(resp, out)
        os.replace(tmp, dest)          # atomic: a failed download leaves no half file
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return dest


def load_azure_trace(kind: str = "code", path: Union[str, Path, None] = None,
                     cache_dir: Union[str, Path, None] = None, download: bool = True,
                     url: Optional[str] = None) -> pd.DataFrame:
    """One service's trace as a table, in file order: ``timestamp`` (datetime64), ``arrival_s``
    (seconds since the first request), ``prompt_tokens`` (the trace's ``ContextTokens``),
    ``output_tokens`` (``GeneratedTokens``).

    kind: ``"code"`` (code completion, 8,819 requests) or ``"conv"`` (conversation, 19,366).
    path: a CSV file (or a directory holding it); default: :func:`find_trace_file`, else a
        download from ``url`` (default :data:`TRACE_URL`) into ``cache_dir`` when ``download``.
    """
    _check_kind(kind)
    p: Optional[Path]
    if path is not None:
        p = Path(path)
        if p.is_dir():
            p = p / FILE_NAME.format(kind=kind)
        if not p.is_file():
            raise FileNotFoundError(f"{p}: no such trace file")
    else:
        p = find_trace_file(kind, cache_dir)
        if p is None:
            if not download:
                raise FileNotFoundError(
                    f"no local copy of {FILE_NAME.format(kind=kind)}: set ${ENV_DIR}, put it in {SHARED_DIR}, "
                    f"or allow the download from {TRACE_URL.format(kind=kind)}")
            cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
            p = _download((url or TRACE_URL).format(kind=kind), cache / FILE_NAME.format(kind=kind))
    raw = pd.read_csv(p)
    missing = [c for c in RAW_COLUMNS if c not in raw.columns]
    if missing:
        raise ValueError(f"{p}: not an Azure LLM inference trace file (missing columns {missing}; "
                         f"expected {list(RAW_COLUMNS)})")
    ts = pd.to_datetime(raw["TIMESTAMP"], format="%Y-%m-%d %H:%M:%S.%f")
    prompt = raw["ContextTokens"].to_numpy()
    output = raw["GeneratedTokens"].to_numpy()
    for name, v in (("ContextTokens", prompt), ("GeneratedTokens", output)):
        if v.dtype.kind not in "iu":
            raise ValueError(f"{p}: column {name!r} must hold integers")
    return pd.DataFrame({
        "timestamp": ts,
        "arrival_s": (ts - ts.min()).dt.total_seconds().to_numpy(),
        "prompt_tokens": prompt.astype(np.int64),
        "output_tokens": output.astype(np.int64),
    })


def _traces(traces: Optional[Mapping[str, pd.DataFrame]]) -> dict:
    if traces is None:
        return {k: load_azure_trace(k) for k in KINDS}
    return {k: traces[k] for k in KINDS if k in traces}


def trace_summary(traces: Optional[Mapping[str, pd.DataFrame]] = None) -> pd.DataFrame:
    """Per service: requests, duration_s (first to last request), rate_rps, and min, mean,
    p50, p90, p99 (``np.percentile``, linear) and max of prompt and output tokens."""
    rows = []
    for kind, df in _traces(traces).items():
        dur = float(df["arrival_s"].max() - df["arrival_s"].min())
        row = {"service": kind, "description": SERVICES[kind], "requests": len(df), "duration_s": dur,
               "rate_rps": len(df) / dur if dur > 0 else np.nan}
        for col, short in (("prompt_tokens", "prompt"), ("output_tokens", "output")):
            v = df[col].to_numpy(np.float64)
            p50, p90, p99 = np.percentile(v, [50, 90, 99])
            row.update({f"{short}_min": int(v.min()), f"{short}_mean": float(v.mean()), f"{short}_p50": float(p50),
                        f"{short}_p90": float(p90), f"{short}_p99": float(p99), f"{short}_max": int(v.max())})
        rows.append(row)
    return pd.DataFrame(rows)


def trace_quantiles(traces: Optional[Mapping[str, pd.DataFrame]] = None, n: int = N_QUANTILES) -> pd.DataFrame:
    """``n`` quantiles per service of prompt and output tokens at ``q = (i + 0.5) / n``, each a
    value of the trace (``np.quantile(..., method="inverted_cdf")``): columns ``q``,
    ``<service>_prompt_tokens``, ``<service>_output_tokens``. Drawing uniformly from one column
    samples that marginal distribution in n equal strata."""
    q = (np.arange(n) + 0.5) / n
    out = {"q": q}
    for kind, df in _traces(traces).items():
        for col in ("prompt_tokens", "output_tokens"):
            out[f"{kind}_{col}"] = np.quantile(df[col].to_numpy(), q, method="inverted_cdf").astype(np.int64)
    return pd.DataFrame(out)


def _write_with_header(df: pd.DataFrame, path: Path, what: str) -> None:
    lines = [f"# {what}"]
    words, line = ATTRIBUTION.split(), "#"
    for w in words:
        if len(line) + 1 + len(w) > 100:
            lines.append(line)
            line = "#"
        line += " " + w
    lines.append(line)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        f.write("\n".join(lines) + "\n")
        df.to_csv(f, index=False, float_format="%.10g", lineterminator="\n")


def write_trace_tables(traces: Optional[Mapping[str, pd.DataFrame]] = None, data_dir: Union[str, Path, None] = None,
                       n: int = N_QUANTILES) -> tuple:
    """Write ``azure_trace_summary.csv`` and ``azure_trace_quantiles.csv`` (in ``data_dir``,
    default the project's data/) with the CC BY attribution in a ``#`` header. Returns the paths."""
    traces = _traces(traces)
    d = Path(data_dir) if data_dir is not None else DATA_DIR
    s, q = d / SUMMARY_FILE.name, d / QUANTILES_FILE.name
    _write_with_header(trace_summary(traces), s,
                       "Azure LLM inference trace 2023: per-service summary of token counts (fairlib.traces.trace_summary)")
    _write_with_header(trace_quantiles(traces, n), q,
                       f"Azure LLM inference trace 2023: {n} quantiles per service at q = (i + 0.5) / {n} of prompt "
                       f"(ContextTokens) and output (GeneratedTokens) tokens (fairlib.traces.trace_quantiles)")
    return s, q


def read_trace_summary(path: Union[str, Path] = SUMMARY_FILE) -> pd.DataFrame:
    """The committed per-service summary (no raw trace needed)."""
    return pd.read_csv(path, comment="#")


def read_trace_quantiles(path: Union[str, Path] = QUANTILES_FILE) -> pd.DataFrame:
    """The committed quantile table (no raw trace needed)."""
    return pd.read_csv(path, comment="#")


def trace_lengths(kind: str, source: str = "quantiles") -> tuple:
    """(prompt, output) :class:`~fairlib.workload.Empirical` lengths of one service: from the
    committed quantile table (``source="quantiles"``, default; no raw file needed) or from the
    raw trace (``source="raw"``: every request's lengths)."""
    _check_kind(kind)
    if source == "quantiles":
        q = read_trace_quantiles()
        return Empirical(q[f"{kind}_prompt_tokens"].to_numpy()), Empirical(q[f"{kind}_output_tokens"].to_numpy())
    if source == "raw":
        df = load_azure_trace(kind)
        return Empirical(df["prompt_tokens"].to_numpy()), Empirical(df["output_tokens"].to_numpy())
    raise ValueError(f"source must be 'quantiles' or 'raw', got {source!r}")


def trace_tenant(kind: str, name: Optional[str] = None, source: str = "quantiles", **tenant_kw) -> TenantSpec:
    """A :class:`~fairlib.workload.TenantSpec` drawing one service's prompt and output lengths
    (independently, see the module notes); give its load as for any TenantSpec (``rate_rps=`` or
    ``machine_ms_per_s=``). ``name`` defaults to the service (``"code"``, ``"conv"``)."""
    prompt, output = trace_lengths(kind, source)
    return TenantSpec(name or kind, output=output, prompt=prompt, **tenant_kw)
