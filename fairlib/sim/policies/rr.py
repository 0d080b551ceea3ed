"""rr: round robin by request across backlogged tenants.

One FIFO line per tenant and a rotating pointer over tenants ``0..n-1`` (starting at 0). Select
scans the tenants from the pointer, ``pointer, pointer+1, ... (mod n)``, and names the oldest
request of the first tenant with a request waiting. When that request is admitted the pointer
moves to the tenant after the chosen one: ``pointer = (tenant + 1) mod n``. A tenant with nothing
waiting is skipped without losing anything (there is no credit). Every admission is one request,
whatever its length: round robin equalises requests, not machine time.

pi = [pointer]."""
import numpy as np

from fairlib.sim import jit
from fairlib.sim.policies.base import Policy
from fairlib.sim.state import TENANT

PID = 10


@jit.inline
def select(pf, pi, RF, RI, TI, BT, heap, heap_n, t):
    n_t = TI.shape[1]
    for j in range(n_t):
        k = (pi[0] + j) % n_t
        if heap_n[k] > 0:
            return k
    return -1


@jit.inline
def on_admit(pf, pi, RF, RI, TI, BT, heap, heap_n, r, line, prefill_tokens, E):
    pi[0] = (RI[TENANT, r] + 1) % TI.shape[1]


class RoundRobin(Policy):
    name, pid = "rr", PID

    def lines(self, rows, tenant, klass, priority, est, n_tenants, n_classes=None, priority_levels=None):
        return np.asarray(tenant, np.int64), np.asarray(rows, np.float64), n_tenants

    def online_lines(self, n_tenants, n_classes):
        return n_tenants

    def state(self, n_tenants, n_requests=None):
        return np.zeros(1), np.zeros(1, np.int64)
