"""fairlib: fairness in multi-tenant LLM serving, computed.

The engine model of one replica under continuous batching (book/engine-model.md), compiled with
numba, its scheduling policies, seeded multi-tenant workloads and the metrics the book reports."""
from fairlib.sim.engine import SEED000_ENGINE, Engine
from fairlib.sim.policies import POLICIES, make_policy
from fairlib.sim.simulate import SimResult, simulate

__version__ = "0.1.0"
__all__ = ["Engine", "SEED000_ENGINE", "POLICIES", "make_policy", "simulate", "SimResult", "__version__"]
