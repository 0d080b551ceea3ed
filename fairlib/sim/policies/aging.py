"""aging(rate): score = klass - rate * (t - arrival_ms) / 1000 at selection time t; lowest first
(ties by table order). One FIFO line per class: the oldest request of a class has its lowest score,
so only the heads compete."""
import numpy as np

from fairlib.sim import jit
from fairlib.sim.policies.base import Policy, check_number
from fairlib.sim.state import ARRIVAL, KLASS

PID = 9


@jit.inline
def select(pf, pi, RF, RI, TI, BT, heap, heap_n, t):
    rate = pf[0]
    best = -1
    best_score = np.inf
    for j in range(heap_n.shape[0]):
        if heap_n[j] > 0:
            r = heap[heap[j]]
            score = RI[KLASS, r] - rate * (t - RF[ARRIVAL, r]) / 1000.0
            if best < 0 or score < best_score or (score == best_score and r < heap[heap[best]]):
                best, best_score = j, score
    return best


class Aging(Policy):
    name, pid = "aging", PID
    params = {"rate": 0.01}
    needs = ("klass",)

    def validate(self, v):
        return {"rate": check_number(self.name, "rate", v["rate"])}

    def lines(self, rows, tenant, klass, priority, est, n_tenants, n_classes=None, priority_levels=None):
        k = np.asarray(klass, np.int64)
        if len(k) and k.min() < 0:
            raise ValueError(f"policy {self.name!r}: column 'klass' must be >= 0, got {k.min()}")
        if n_classes is not None and len(k) and k.max() >= n_classes:
            raise ValueError(f"policy {self.name!r}: column 'klass' must be < {n_classes} "
                             "(the classes this engine keeps)")
        return k, np.asarray(rows, np.float64), n_classes or (int(k.max()) + 1 if len(k) else 1)

    def online_lines(self, n_tenants, n_classes):
        return int(n_classes)

    def state(self, n_tenants, n_requests=None):
        return np.array([self.values["rate"]]), np.zeros(1, np.int64)
