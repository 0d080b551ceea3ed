"""slot_cap(cap): FCFS, skipping requests of tenants that already run `cap` sequences.
One line per tenant; the next request is the oldest head among tenants under their cap."""
import numpy as np

from fairlib.sim import jit
from fairlib.sim.policies.base import Policy, check_int
from fairlib.sim.state import T_RUNNING

PID = 5


@jit.inline
def select(pf, pi, RF, RI, TI, BT, heap, heap_n, t):
    cap = pf[0]
    best = -1
    for j in range(heap_n.shape[0]):
        if heap_n[j] > 0 and TI[T_RUNNING, j] < cap:
            if best < 0 or heap[heap[j]] < heap[heap[best]]:
                best = j
    return best


class SlotCap(Policy):
    name, pid = "slot_cap", PID
    params = {"cap": None}
    required = ("cap",)

    def validate(self, v):
        return {"cap": check_int(self.name, "cap", v["cap"])}

    def lines(self, rows, tenant, klass, priority, est, n_tenants, n_classes=None, priority_levels=None):
        return np.asarray(tenant, np.int64), np.asarray(rows, np.float64), n_tenants

    def online_lines(self, n_tenants, n_classes):
        return n_tenants

    def state(self, n_tenants, n_requests=None):
        return np.array([float(self.values["cap"])]), np.zeros(1, np.int64)
