"""Small helpers the chapter notebooks share: backend checks, chart set-up, Markdown from values.

The policy colours and labels are the analysis' (``fairlib.analysis.charts``), re-exported here."""
from __future__ import annotations

from fairlib.analysis.charts import POLICY_COLOURS, POLICY_LABELS, policy_colour, policy_scale

__all__ = ["require_backend", "BACKENDS", "setup_charts", "POLICY_COLOURS", "POLICY_LABELS", "policy_colour",
           "policy_scale", "md"]

BACKENDS = ("sim", "http")


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
        ip = get_ipython()  # noqa: F821 - defined inside IPython kernels
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
