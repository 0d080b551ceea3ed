"""Saved fits: where the committed ones live, reading one, the engine model it gives at a decode
context (``iter_slope = slope_0 + slope_ctx * context``), and a table of several."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pandas as pd

from fairlib import paths
from fairlib.calibrate.probe import load_probed_engine
from fairlib.kinds import SAVED_FIT_KINDS
from fairlib.sim.engine import Engine

__all__ = ["REFERENCE_CONTEXT", "fit_data_path", "load_fit", "load_fitted_engine", "engine_at",
           "summary_table"]

#: The context (tokens) of the ``engine`` table saved with a fit: a prompt of 320 and 32 generated.
REFERENCE_CONTEXT = 352.0


def fit_data_path(kind: str) -> Path:
    """The committed fit of an engine kind: ``data/engines/<kind>.json`` (in ``fairlib.paths.data_dir()``)."""
    return paths.data_path("engines", f"{kind}.json")

# --- the engine model at a context ---------------------------------------------------------------
def engine_at(fit, context: Optional[float] = None) -> Engine:
    """The engine model at a decode context (tokens): ``iter_slope = slope_0 + slope_ctx * context``
    (default :data:`REFERENCE_CONTEXT`). ``fit``: a fit's dict, its path, or an engine kind."""
    d = fit if isinstance(fit, dict) else load_fit(fit)
    j = d["fit"]["decode"]["joint"]
    ctx = REFERENCE_CONTEXT if context is None else float(context)
    e = d["engine"]
    slope = max(j["slope_0_ms"] + j["slope_ctx_ms_per_token"] * ctx, 0.0)
    base = max(j["iter_base_ms"], 0.0)
    return Engine(base if base + slope > 0 else 1e-3, slope, e["prefill_ms_per_token"], e["max_batch"])


# --- reading -------------------------------------------------------------------------------------
def load_fit(path_or_kind) -> dict:
    """A saved fit: a path, or an engine kind (``data/engines/<kind>.json``)."""
    p = Path(path_or_kind)
    if not p.exists() and str(path_or_kind) in SAVED_FIT_KINDS:
        p = fit_data_path(str(path_or_kind))
    return json.loads(p.read_text(encoding="utf-8"))


def load_fitted_engine(path_or_kind) -> Engine:
    """The fitted :class:`fairlib.Engine` of a saved fit at the reference context
    (``fairlib.calibrate.probe.load_probed_engine`` reads the same file); :func:`engine_at` for another
    context."""
    d = path_or_kind if isinstance(path_or_kind, dict) else load_fit(path_or_kind)
    return load_probed_engine(d)


def summary_table(fits: dict):
    """One row per engine: the fitted parameters and the fit quality (a DataFrame)."""
    rows = []
    for name, d in fits.items():
        s = d["fit"]["summary"]
        rows.append({
            "engine": name, "version": d["engine_info"].get("version"),
            "iter_base (ms)": s["iter_base_ms"], "slope_0 (ms)": s["slope_0_ms"],
            "slope per 1k context tokens (ms)": s["slope_ctx_ms_per_1k_tokens"],
            "prefill (ms/token)": s["prefill_ms_per_token"], "max_batch": s["max_batch"],
            "decode fitted over B": "{}-{}".format(*s["decode_B_range"]),
            "decode R2": s["decode_r2"], "decode max |residual| (ms)": s["decode_max_abs_residual_ms"],
            "prefill R2": s["prefill_r2"], "prefill max |residual| (ms)": s["prefill_max_abs_residual_ms"],
            "B=1 a regime of its own": s["small_batch_regime"],
            "TTFT overhead (ms)": d["fit"]["ttft_overhead_ms"],
            "client/server per-token time": s["client_over_server_per_token"],
            "client/server prefill slope": s["client_over_server_prefill_slope"],
        })
    return pd.DataFrame(rows).set_index("engine")
