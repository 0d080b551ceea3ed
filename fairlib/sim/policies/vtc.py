"""vtc(wp, wq, weights): the Virtual Token Counter (Sheng et al., OSDI '24), and its relatives.

One counter c_i per tenant, one FIFO line per tenant. Serve the backlogged tenant with the
lowest counter (ties: lowest index), its oldest request first. Charges:
  admission:   c_i += wp * prefill_tokens / w_i
  iteration:   c_i += wq / w_i for each of i's running sequences
Counter lift at an arrival that makes i's line non-empty:
  c_i = max(c_i, min_{j backlogged, j != i} c_j)   (unchanged if no other tenant is backlogged).
`lcf` is vtc without the lift; `residency` charges the machine time itself (step 6 of the engine
model): prefill_ms_per_token * prefill_tokens / w_i at admission, per_seq / w_i per iteration.

pf = [wp, wq, c_0..c_{n-1}, w_0..w_{n-1}];  pi = [lift (0/1), residency mode (0/1)].
"""
import numpy as np

from fairlib.sim import jit
from fairlib.sim.policies.base import Policy, check_number
from fairlib.sim.state import T_RUNNING, TENANT

PID_VTC, PID_LCF, PID_RESIDENCY = 2, 3, 4


@jit.inline
def accept(pf, pi, RF, RI, TI, BT, heap, heap_n, r, t):
    if pi[0] == 1:
        n_t = TI.shape[1]
        tn = RI[TENANT, r]
        if heap_n[tn] == 0:
            low = np.inf
            for j in range(n_t):
                if j != tn and heap_n[j] > 0 and pf[2 + j] < low:
                    low = pf[2 + j]
            if low < np.inf and low > pf[2 + tn]:
                pf[2 + tn] = low
    return True


@jit.inline
def select(pf, pi, RF, RI, TI, BT, heap, heap_n, t):
    best = -1
    for j in range(heap_n.shape[0]):
        if heap_n[j] > 0 and (best < 0 or pf[2 + j] < pf[2 + best]):
            best = j
    return best


@jit.inline
def on_admit(pf, pi, RF, RI, TI, BT, heap, heap_n, r, line, prefill_tokens, E):
    n_t = TI.shape[1]
    tn = RI[TENANT, r]
    rate = E[2] if pi[1] == 1 else pf[0]
    pf[2 + tn] += rate * prefill_tokens / pf[2 + n_t + tn]


@jit.inline
def on_iteration(pf, pi, RF, RI, TI, BT, heap, heap_n, B, per_seq, E):
    # each running sequence adds unit / w_i; TI[T_RUNNING, i] counts tenant i's running sequences
    n_t = TI.shape[1]
    unit = per_seq if pi[1] == 1 else pf[1]
    for j in range(n_t):
        inc = unit / pf[2 + n_t + j]
        for _ in range(TI[T_RUNNING, j]):
            pf[2 + j] += inc


class VTC(Policy):
    name, pid = "vtc", PID_VTC
    params = {"wp": 1.0, "wq": 2.0, "weights": None}
    lift, residency = 1, 0
    counter_unit = "tokens"

    def validate(self, v):
        out = {"wp": check_number(self.name, "wp", v["wp"]), "wq": check_number(self.name, "wq", v["wq"])}
        w = v["weights"]
        if w is not None:
            w = [check_number(self.name, "weights", x, 0.0, strict=True) for x in np.atleast_1d(w)]
        out["weights"] = w
        return out

    def lines(self, rows, tenant, klass, priority, est, n_tenants, n_classes=None, priority_levels=None):
        return np.asarray(tenant, np.int64), np.asarray(rows, np.float64), n_tenants

    def online_lines(self, n_tenants, n_classes):
        return n_tenants

    def state(self, n_tenants, n_requests=None):
        w = self.values["weights"]
        if w is None:
            w = [1.0] * n_tenants
        if len(w) != n_tenants:
            raise ValueError(f"policy {self.name!r}: parameter 'weights' needs one weight per tenant "
                             f"({n_tenants}), got {len(w)}")
        pf = np.concatenate([[self.values["wp"], self.values["wq"]], np.zeros(n_tenants), np.asarray(w, float)])
        return pf, np.array([self.lift, self.residency], np.int64)

    def counters(self, pf, n_tenants):
        return pf[2:2 + n_tenants].copy()
