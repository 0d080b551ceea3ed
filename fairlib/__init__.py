"""fairlib: fairness in multi-tenant LLM serving, computed.

The engine model of one replica under continuous batching (book/engine-model.md), compiled with
numba, its scheduling policies, seeded multi-tenant workloads and the metrics the book reports.

The names below load on first use (PEP 562), so that ``import fairlib.x`` does not compile the
simulator first: the command line starts in a fraction of a second and a Ctrl-C while it loads
ends with one line (``fairlib.__main__``)."""
import importlib as _importlib

__version__ = "0.1.0"

_API = {"Engine": "fairlib.sim.engine", "SEED000_ENGINE": "fairlib.sim.engine",
        "POLICIES": "fairlib.sim.policies", "make_policy": "fairlib.sim.policies",
        "simulate": "fairlib.sim.simulate", "SimResult": "fairlib.sim.simulate"}
__all__ = ["Engine", "SEED000_ENGINE", "POLICIES", "make_policy", "simulate", "SimResult", "__version__"]
assert set(__all__) == {*_API, "__version__"}


def __getattr__(name: str):
    if name in _API:
        value = getattr(_importlib.import_module(_API[name]), name)
        globals()[name] = value          # once: later lookups do not come here
        return value
    raise AttributeError(f"module 'fairlib' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_API))
