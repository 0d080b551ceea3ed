"""weighted(w): weighted round robin over classes. The rotation repeats class k w[k] times in
class order (5/3/2 -> 0,0,0,0,0,1,1,1,2,2). Select scans from the rotation pointer for the
first slot whose class has a request waiting (FCFS within the class); when that request is
admitted the pointer moves to the slot after the chosen one.

pi = [pointer, chosen slot, rotation...]."""
import numpy as np

from fairlib.sim import jit
from fairlib.sim.policies.base import Policy, check_int

PID = 7


@jit.inline
def select(pf, pi, RF, RI, TI, BT, heap, heap_n, t):
    n_slots = pi.shape[0] - 2
    for j in range(n_slots):
        s = (pi[0] + j) % n_slots
        k = pi[2 + s]
        if heap_n[k] > 0:
            pi[1] = s
            return k
    return -1


@jit.inline
def on_admit(pf, pi, RF, RI, TI, BT, heap, heap_n, r, line, prefill_tokens, E):
    pi[0] = (pi[1] + 1) % (pi.shape[0] - 2)


class Weighted(Policy):
    name, pid = "weighted", PID
    params = {"w": None}
    required = ("w",)
    needs = ("klass",)

    def validate(self, v):
        w = [check_int(self.name, "w", x, low=0) for x in np.atleast_1d(v["w"])]
        if sum(w) == 0:
            raise ValueError(f"policy {self.name!r}: parameter 'w' needs at least one weight > 0, got {w}")
        return {"w": w}

    def lines(self, rows, tenant, klass, priority, est, n_tenants, n_classes=None, priority_levels=None):
        k = np.asarray(klass, np.int64)
        n = len(self.values["w"])
        if len(k) and (k.min() < 0 or k.max() >= n):
            raise ValueError(f"policy {self.name!r}: column 'klass' must lie in 0..{n - 1} (one weight per class), "
                             f"got values {k.min()}..{k.max()}")
        return k, np.asarray(rows, np.float64), n

    def online_lines(self, n_tenants, n_classes):
        return len(self.values["w"])

    def state(self, n_tenants, n_requests=None):
        rotation = [k for k, wk in enumerate(self.values["w"]) for _ in range(wk)]
        return np.zeros(1), np.array([0, 0] + rotation, np.int64)
