"""Small helpers the chapter notebooks share: backend checks and chart set-up."""
from __future__ import annotations

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


#: One colour per policy, the same in every chart of the book (keys: the policy's registry name
#: or the reference grid's label; values: Tableau-10 colours). Display labels map to the same
#: colour through :data:`POLICY_LABELS`.
POLICY_COLOURS = {
    "fcfs": "#4c78a8", "rpm_quota": "#e45756", "vtc": "#f58518", "vtc_derived": "#b279a2",
    "lcf": "#eeca3b", "residency": "#54a24b", "slot_cap": "#72b7b2", "rr": "#9d755d",
    "vtc_predict": "#ff9da6", "priority": "#79706e", "weighted": "#bab0ac", "sjf": "#d67195",
    "aging": "#8cd17d",
}
#: Display labels of the policies as the chapters name them in tables and legends.
POLICY_LABELS = {
    "fcfs": "FCFS", "rpm_quota": "equal quota", "vtc": "VTC 1/2", "vtc_derived": "VTC derived",
    "lcf": "LCF", "residency": "charge dt/B", "slot_cap": "slot cap", "rr": "round robin",
    "vtc_predict": "VTC predict", "priority": "priority", "weighted": "weighted", "sjf": "SJF",
    "aging": "aging",
}


def policy_colour(name: str) -> str:
    """The book's colour of a policy, by registry name, grid label or display label."""
    if name in POLICY_COLOURS:
        return POLICY_COLOURS[name]
    for key, label in POLICY_LABELS.items():
        if name == label:
            return POLICY_COLOURS[key]
    raise KeyError(f"no colour for policy {name!r}; known: {sorted(POLICY_COLOURS)} "
                   f"or labels {sorted(POLICY_LABELS.values())}")


def policy_scale(domain):
    """An altair colour scale giving each policy in ``domain`` (names or labels, in legend order)
    its book colour: ``alt.Color("policy:N", scale=policy_scale(order), sort=order)``."""
    import altair as alt
    domain = list(domain)
    return alt.Scale(domain=domain, range=[policy_colour(d) for d in domain])


def md(text: str):
    """Display Markdown written from computed values (numbers in prose come from the data)."""
    from IPython.display import Markdown, display
    display(Markdown(text))
