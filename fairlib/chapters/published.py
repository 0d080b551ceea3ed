"""The published figures the book compares against (data/published_figures.toml).

    fig = published.figure("ch1.share.fcfs")   # value, tolerance, source, what
    published.compare("ch1.maxmin.vtc", 3.21)  # a row: published, computed, difference, within
"""
from __future__ import annotations

import tomllib
from functools import lru_cache

import numpy as np
import pandas as pd

from fairlib.paths import data_path

DATA_FILE = data_path("published_figures.toml")

__all__ = ["figure", "figures", "source", "compare", "asserted", "within", "SHOWN", "DATA_FILE"]


@lru_cache(maxsize=None)
def _load(path: str = str(DATA_FILE)) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def figures(chapter=None) -> pd.DataFrame:
    """All figures (of one chapter) as a table."""
    rows = [f for f in _load()["figure"] if chapter is None or f["chapter"] == chapter]
    return pd.DataFrame(rows).set_index("id")


def figure(fid: str) -> dict:
    """One figure by id, with its source expanded."""
    for f in _load()["figure"]:
        if f["id"] == fid:
            return {**f, "source_info": _load()["sources"][f["source"]]}
    known = ", ".join(f["id"] for f in _load()["figure"])
    raise ValueError(f"published figure id {fid!r} not found; known ids: {known}")


def source(name: str) -> dict:
    return _load()["sources"][name]


def within(fid: str, computed) -> np.ndarray:
    """Whether `computed` lies within the figure's tolerance: |c - p| <= abs, or <= rel * |p|."""
    f = figure(fid)
    tol = f.get("tolerance")
    if tol is None:
        raise ValueError(f"published figure {fid!r} has no tolerance: it is shown, not asserted")
    p = np.asarray(f["value"], float)
    c = np.asarray(computed, float)
    bound = tol["abs"] if "abs" in tol else tol["rel"] * np.abs(p)
    return np.abs(c - p) <= bound + 1e-12


#: The tolerance column's text for a figure that has no tolerance.
SHOWN = "shown, not asserted"


def compare(fid: str, computed, labels=None) -> pd.DataFrame:
    """Published next to computed, with the difference, the tolerance and whether it holds.

    Columns: ``published``, ``computed``, ``difference`` (computed - published), ``basis``
    (``"published"``, ``"inferred"`` when the file marks the value as read from the source
    rather than stated in it, or ``"published, unverified"`` when the source states it but the
    book could not check it against the source's own data or code), ``tolerance`` (a number, or :data:`SHOWN` when the figure has none)
    and ``within`` (bool; ``None`` where nothing is asserted). :func:`asserted` keeps the rows
    that carry a tolerance."""
    f = figure(fid)
    p = np.atleast_1d(np.asarray(f["value"], float))
    c = np.atleast_1d(np.asarray(computed, float))
    if p.shape != c.shape:
        raise ValueError(f"{fid}: computed has shape {c.shape}, published {p.shape}")
    out = pd.DataFrame({"published": p, "computed": c, "difference": c - p}, index=labels)
    out["basis"] = ("inferred" if f.get("inferred", False) else
                    "published, unverified" if f.get("unverified", False) else "published")
    if f.get("tolerance") is not None:
        tol = f["tolerance"]
        out["tolerance"] = np.broadcast_to(tol["abs"] if "abs" in tol else tol["rel"] * np.abs(p),
                                           p.shape).astype(object)
        ok = np.atleast_1d(within(fid, c.reshape(p.shape) if p.size > 1 else c[0]))
        out["within"] = pd.Series([bool(x) for x in ok], index=out.index, dtype=object)
    else:
        out["tolerance"] = SHOWN
        out["within"] = None
    return out


def asserted(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of a :func:`compare` table (or a concatenation of them) that carry a tolerance."""
    return table[table["tolerance"].map(lambda t: not isinstance(t, str))]
