"""rpm_quota(limit): a requests-per-minute limit per tenant, checked at arrival.

Reject request r of tenant i if i already had `limit` accepted requests with arrival in
(arrival_r - 60000, arrival_r]; accepted ones are served FCFS. A ring of each tenant's last
`limit` accepted arrival times makes the check O(1): reject iff the ring is full and its oldest
entry is > arrival_r - 60000. A table of n requests never reaches a limit above n, so the ring
holds min(limit, n) entries.

pf = [limit, ring size, rings...];  pi = [ring pointer per tenant, ring fill per tenant]."""
import numpy as np

from fairlib.sim import jit
from fairlib.sim.policies.base import Policy, check_int
from fairlib.sim.policies.fcfs import select  # noqa: F401  (served FCFS)
from fairlib.sim.state import ARRIVAL, TENANT

PID = 1
WINDOW_MS = 60000.0
ONLINE_MAX_LIMIT = 1 << 20


@jit.inline
def accept(pf, pi, RF, RI, TI, BT, heap, heap_n, r, t):
    if pf[0] > pf[1]:
        return True                          # fewer requests than the limit: it never binds
    n_t = TI.shape[1]
    limit = np.int64(pf[0])
    tn = RI[TENANT, r]
    a = RF[ARRIVAL, r]
    ptr = pi[tn]
    slot = 2 + tn * limit + ptr
    if pi[n_t + tn] >= limit:
        if pf[slot] > a - WINDOW_MS:
            return False
    else:
        pi[n_t + tn] += 1
    pf[slot] = a
    pi[tn] = (ptr + 1) % limit
    return True


class RpmQuota(Policy):
    name, pid = "rpm_quota", PID
    params = {"limit": None}
    required = ("limit",)

    def validate(self, v):
        return {"limit": check_int(self.name, "limit", v["limit"])}

    def state(self, n_tenants, n_requests=None):
        limit = self.values["limit"]
        if n_requests is None and limit > ONLINE_MAX_LIMIT:
            raise ValueError(f"policy {self.name!r}: parameter 'limit' above {ONLINE_MAX_LIMIT} requests/min is not "
                             f"supported when requests arrive one by one, got {limit}")
        ring = limit if n_requests is None else max(1, min(limit, int(n_requests)))
        pf = np.zeros(2 + (n_tenants * ring if ring == limit else 0))
        pf[0], pf[1] = limit, ring
        return pf, np.zeros(2 * n_tenants, np.int64)   # ring pointer, ring fill

    def retry_after_ms(self, pf, pi, n_tenants: int, tenant: int, t_ms: float):
        """How long until ``tenant``'s oldest accepted arrival in the window leaves it (60 s after
        it arrived): then one more request is accepted. 0 when the limit does not bind now."""
        limit = int(pf[0])
        if pf[0] > pf[1] or pi[n_tenants + tenant] < limit:
            return 0.0
        oldest = pf[2 + tenant * limit + pi[tenant]]
        return max(0.0, oldest + WINDOW_MS - t_ms)
