"""fairlib: fairness in multi-tenant LLM serving, computed.

The engine model of one replica under continuous batching (book/engine-model.md), compiled with
numba, its scheduling policies, seeded multi-tenant workloads and the metrics the book reports."""
import os as _os
import sys as _sys


def _one_line_interrupt(kind, value, tb, _hook=_sys.excepthook):
    """The command line's ``sys.excepthook``: Ctrl-C before a command handles it (while its
    modules load, a second or so) ends with one line on stderr, not a traceback."""
    if issubclass(kind, KeyboardInterrupt):
        print("fairlib: interrupted (SIGINT) while starting", file=_sys.stderr, flush=True)
    else:
        _hook(kind, value, tb)


if _sys.argv[:1] == ["-m"] or _os.path.basename(_sys.argv[0] if _sys.argv else "") == "fairlib":
    _sys.excepthook = _one_line_interrupt   # `python -m fairlib...` or the `fairlib` script only

from fairlib.sim.engine import SEED000_ENGINE, Engine  # noqa: E402
from fairlib.sim.policies import POLICIES, make_policy  # noqa: E402
from fairlib.sim.simulate import SimResult, simulate  # noqa: E402

__version__ = "0.1.0"
__all__ = ["Engine", "SEED000_ENGINE", "POLICIES", "make_policy", "simulate", "SimResult", "__version__"]
