"""Small helpers the chapter notebooks share: backend checks, chart set-up, Markdown from values.

The policy colours and labels are the analysis' (``fairlib.analysis.charts``), re-exported here."""
from __future__ import annotations

import numpy as np

from fairlib.analysis.charts import POLICY_COLOURS, POLICY_LABELS, policy_colour, policy_scale
from fairlib.backend import BACKENDS

__all__ = ["require_backend", "BACKENDS", "setup_charts", "POLICY_COLOURS", "POLICY_LABELS", "policy_colour",
           "policy_scale", "md", "change", "split_constant", "constants_line"]


def _skip_cell(lines):
    return []


def require_backend(backend: str, supported=("sim",), chapter: str = "", why: str = "") -> bool:
    """True if the chapter can run on `backend`. Otherwise print why, plainly, and turn every
    later cell of the notebook into a no-op, so that papermill finishes cleanly instead of
    failing or faking numbers."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend in supported:
        return True
    print(f"Chapter {chapter} cannot run on backend={backend!r}: {why or 'it needs the simulator.'}\n"
          f"Supported backends: {', '.join(supported)}. Nothing below was executed.")
    try:
        ip = get_ipython()  # type: ignore[name-defined]  # noqa: F821 - defined inside IPython kernels
    except NameError:
        return False
    ip.input_transformers_cleanup.append(_skip_cell)
    return False


def setup_charts():
    """Render altair charts as SVG: deterministic (nbval compares them) and offline in the book."""
    import altair as alt
    alt.renderers.enable("svg")
    alt.data_transformers.disable_max_rows()
    return alt


def md(text: str):
    """Display Markdown written from computed values (numbers in prose come from the data)."""
    from IPython.display import Markdown, display
    display(Markdown(text))


def change(values, what: str, unit: str = "%") -> str:
    """Words for a change given per seed as cuts (positive: lower, negative: higher), from the
    values themselves: with mean ``m`` and sample sd ``s`` over the seeds, ``|m| <= s`` is a tie
    ("leaves WHAT unchanged (m ± s)"), otherwise "lowers WHAT by |m|" or "raises WHAT by |m|".

        change([1.0, -1.9, 2.6], "the 99th percentile")
        -> "leaves the 99th percentile unchanged (+0.6 ± 2.3%, within the seeds' spread)"
    """
    v = np.asarray(values, float)
    if v.size == 0 or not np.isfinite(v).all():
        raise ValueError(f"change: values must be finite numbers, one per seed; got {values!r}")
    m = float(v.mean())
    s = float(v.std(ddof=1)) if v.size > 1 else 0.0
    spread = f"{m:+.1f} ± {s:.1f}{unit}"
    if abs(m) <= s:
        return f"leaves {what} unchanged ({spread}, within the seeds' spread)"
    verb = "lowers" if m > 0 else "raises"
    size = f"{abs(m):.0f}" if abs(m) >= 1 else f"{abs(m):.1f}"
    return f"{verb} {what} by {size}{unit} ({spread})"


def split_constant(table, keep=()):
    """A table without the columns that hold one value on every row (a page shows them once,
    in words), and those values: ``(narrower table, {column: value})``. ``keep``: columns kept
    even when constant."""
    const = {c: table[c].iloc[0] for c in table.columns
             if c not in keep and len(table) > 1 and table[c].nunique(dropna=False) == 1}
    return table.drop(columns=list(const)), const


def constants_line(const: dict, fmt: str = "{:g}") -> str:
    """``{column: value}`` as one line for under a table: ``every row: a 1, b x``."""
    def show(v):
        if isinstance(v, (bool, np.bool_)):
            return str(bool(v))
        try:
            return fmt.format(v)
        except (ValueError, TypeError):
            return str(v)
    return "every row: " + ", ".join(f"{k} {show(v)}" for k, v in const.items()) if const else ""
