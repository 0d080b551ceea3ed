"""The fit math of ``fairlib fit``: medians over repeats, the joint decode line
``dt = iter_base + (slope_0 + slope_ctx * ctx) * B``, the small-batch regime, a two-piece check,
and the prefill line ``TTFT = c + prefill * P`` (with a quadratic beside it); pure functions of
the measured points."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from fairlib.calibrate.probe import linear_fit

__all__ = ["SMALL_BATCH_OFF", "PIECEWISE_R2_BELOW", "PIECEWISE_SSE_CUT", "piecewise_fit", "fit_decode_one",
           "fit_decode", "fit_prefill"]

SMALL_BATCH_OFF = 0.25          # dt(1) this far from the B >= 2 line: a regime of its own
PIECEWISE_R2_BELOW = 0.95       # a single line explaining less than this ...
PIECEWISE_SSE_CUT = 0.5         # ... and a two-piece fit cutting the residual SSE by more than half


# --- fitting -------------------------------------------------------------------------------------
def _medians(points: Sequence[dict], key: str, value: str) -> tuple:
    by: dict = {}
    for q in points:
        if q.get(value) is not None and (q.get("concurrent") is None or q.get("concurrent") == q.get("B")):
            by.setdefault(q[key], []).append(float(q[value]))
    xs = sorted(by)
    return (np.array(xs, float), np.array([np.median(by[x]) for x in xs]),
            {x: [min(by[x]), max(by[x])] for x in xs})


def piecewise_fit(x, y, min_points: int = 2) -> Optional[dict]:
    """Two separate lines, split at the breakpoint (between consecutive ``x``) with the least total
    squared error; ``None`` when there are too few points."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    best: Optional[dict] = None
    for k in range(min_points, x.size - min_points + 1):
        lo, hi = linear_fit(x[:k], y[:k]), linear_fit(x[k:], y[k:])
        if lo["slope"] is None or hi["slope"] is None:
            continue
        sse = float(np.sum(np.square(lo["residuals"])) + np.sum(np.square(hi["residuals"])))
        if best is None or sse < best["sse"]:
            best = {"break_after": float(x[k - 1]), "low": {k2: lo[k2] for k2 in ("intercept", "slope", "r2", "n")},
                    "high": {k2: hi[k2] for k2 in ("intercept", "slope", "r2", "n")}, "sse": sse}
    return best


def _lin(d: dict) -> dict:
    return {k: d[k] for k in ("intercept", "slope", "r2", "n")} | {"residuals_ms": d.get("residuals")}


def fit_decode_one(points: Sequence[dict], max_batch: int) -> dict:
    """``dt = a + s * B`` over the per-B medians of one context with ``B <= max_batch``, the
    small-batch check at ``B = 1`` and the two-piece check (module docstring)."""
    B, dt, spread = _medians(points, "B", "dt_ms")
    in_range = B <= max_batch
    lin_all = linear_fit(B[in_range], dt[in_range])
    ge2 = in_range & (B >= 2)
    lin_b2 = linear_fit(B[ge2], dt[ge2]) if ge2.sum() >= 2 else None
    small = None
    if lin_b2 is not None and lin_b2["slope"] is not None and 1.0 in set(B):
        d1 = float(dt[list(B).index(1.0)])
        pred1 = lin_b2["intercept"] + lin_b2["slope"]
        small = {"dt1_ms": d1, "line_at_1_ms": pred1, "off": (pred1 - d1) / d1,
                 "separate": bool(abs(pred1 - d1) / d1 > SMALL_BATCH_OFF)}
    use_b2 = bool(small and small["separate"])
    lin = lin_b2 if use_b2 and lin_b2 is not None else lin_all
    rng = ge2 if use_b2 else in_range
    pw = piecewise_fit(B[rng], dt[rng]) if rng.sum() >= 4 else None
    demanded = False
    if pw is not None and lin["r2"] is not None:
        sse = float(np.sum(np.square(lin["residuals"])))
        pw["sse_cut"] = 1.0 - pw["sse"] / sse if sse > 0 else 0.0
        demanded = lin["r2"] < PIECEWISE_R2_BELOW and pw["sse_cut"] > PIECEWISE_SSE_CUT
    return {"B": B.tolist(), "dt_ms_median": dt.tolist(), "dt_ms_range": {str(int(k)): v for k, v in spread.items()},
            "fit_range_B": [int(B[rng].min()), int(B[rng].max())] if rng.any() else None,
            "linear": _lin(lin), "linear_1_to_max": _lin(lin_all), "small_batch_regime": small,
            "piecewise": pw, "piecewise_demanded": bool(demanded)}


def fit_decode(points: Sequence[dict], max_batch: int) -> dict:
    """Per context (prompt length) :func:`fit_decode_one`, then the joint fit over every context
    ``dt = iter_base + (slope_0 + slope_ctx * ctx) * B`` (least squares over the per-(context, B)
    medians, ``B >= 2`` when the small-batch regime shows at most contexts), with its ``R^2`` and
    residuals, and the server's per-token figures beside the client's."""
    ctxs = sorted({float(q.get("context", q.get("prompt_tokens", 0))) for q in points})
    per = {}
    for c in ctxs:
        pts = [q for q in points if float(q.get("context", q.get("prompt_tokens", 0))) == c]
        per[c] = fit_decode_one(pts, max_batch)
    n_small = sum(bool((v["small_batch_regime"] or {}).get("separate")) for v in per.values())
    small = n_small * 2 > len(per)
    bmin = 2 if small else 1
    rows = []
    for c, v in per.items():
        for b, d in zip(v["B"], v["dt_ms_median"]):
            if bmin <= b <= max_batch:
                rows.append((c, b, d))
    X = np.array([[1.0, b, b * c] for c, b, _ in rows])
    y = np.array([d for _, _, d in rows])
    joint = None
    if len(rows) >= 3:
        cols = [0, 1, 2] if len(per) >= 2 else [0, 1]
        coef, *_ = np.linalg.lstsq(X[:, cols], y, rcond=None)
        full = np.zeros(3)
        full[cols] = coef
        pred = X @ full
        ss = float(((y - y.mean()) ** 2).sum())
        joint = {"iter_base_ms": float(full[0]), "slope_0_ms": float(full[1]), "slope_ctx_ms_per_token": float(full[2]),
                 "r2": 1.0 - float(((y - pred) ** 2).sum()) / ss if ss > 0 else 1.0, "n": len(rows),
                 "B_range": [bmin, int(max_batch)],
                 "points": [{"context": c, "B": b, "dt_ms": d, "fit_ms": float(f)} for (c, b, d), f in zip(rows, pred)],
                 "residuals_ms": [float(v) for v in y - pred]}
    out = {"contexts": ctxs, "per_context": {str(c): v for c, v in per.items()}, "joint": joint,
           "small_batch_regime": bool(small),
           "dt1_ms": {str(c): (v["small_batch_regime"] or {}).get("dt1_ms") for c, v in per.items()},
           "piecewise_demanded": any(v["piecewise_demanded"] for v in per.values())}
    if any(q.get("server_ms_per_token") is not None for q in points):
        srv = {}
        ratios = []
        for c in ctxs:
            pts = [q for q in points if float(q.get("context", q.get("prompt_tokens", 0))) == c]
            Bm, sm, _ = _medians(pts, "B", "server_ms_per_token")
            Bc, dc, _ = _medians(pts, "B", "dt_ms")
            srv[str(c)] = {"B": Bm.tolist(), "ms_per_token_median": sm.tolist()}
            for b, d in zip(Bc, dc):
                if b in set(Bm) and b <= max_batch:
                    ratios.append(d / sm[list(Bm).index(b)])
        out["server"] = {"per_context": srv, "client_over_server": [float(r) for r in ratios],
                         "client_over_server_median": float(np.median(ratios)) if ratios else None,
                         "source": next(q["server_source"] for q in points if q.get("server_source"))}
    if any(q.get("server_hist_itl_ms") is not None for q in points):
        Bh, hm, _ = _medians(points, "B", "server_hist_itl_ms")
        _, tpi, _ = _medians(points, "B", "server_hist_tokens_per_iteration")
        out["server_histograms"] = {"B": Bh.tolist(), "mean_itl_ms_median_over_contexts": hm.tolist(),
                                    "tokens_per_iteration_median": tpi.tolist()}
    return out


def fit_prefill(points: Sequence[dict]) -> dict:
    """``TTFT = c + prefill * P`` over the per-P medians (client TTFT), a quadratic beside it, and
    the server's own prefill time against ``P`` (llama.cpp ``prompt_ms``; vLLM server TTFT minus
    queue time)."""
    ok = [q for q in points if q.get("error_class") == "none"]
    P, ttft, spread = _medians(ok, "P", "ttft_ms")
    lin = linear_fit(P, ttft)
    out = {"P": P.tolist(), "ttft_ms_median": ttft.tolist(), "ttft_ms_range": {str(int(k)): v for k, v in spread.items()},
           "linear": _lin(lin)}
    if P.size >= 3:
        c2, c1, c0 = np.polyfit(P, ttft, 2)
        out["quadratic"] = {"c0": float(c0), "c1": float(c1), "c2": float(c2),
                            "slope_at_256": float(c1 + 2 * c2 * 256), "slope_at_768": float(c1 + 2 * c2 * 768)}
    srv = [q for q in ok if q.get("server_prefill_ms") is not None]
    if srv:
        Ps, sp, _ = _medians(srv, "P", "server_prefill_ms")
        sl = linear_fit(Ps, sp)
        out["server"] = {"P": Ps.tolist(), "prefill_ms_median": sp.tolist(), "linear": _lin(sl)}
        if sl["slope"] and lin["slope"]:
            out["server"]["client_slope_over_server_slope"] = lin["slope"] / sl["slope"]
    return out
