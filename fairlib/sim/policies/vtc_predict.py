"""vtc_predict(wp, wq, weights, window, init): VTC with per-tenant output-length prediction, as the
VTC artifact's ``vtc_len_predict`` scheduler does it (Ying1123/VTC-artifact,
slora/server/router/vtc_pred_len_req_queue.py, linear cost function).

Selection, lines and the counter lift are ``vtc``'s (fairlib/sim/policies/vtc.py): serve the backlogged
tenant with the lowest counter (ties: lowest index), its oldest request first; at an arrival that
makes tenant i's line non-empty, ``c_i = max(c_i, min_{j backlogged, j != i} c_j)``.

Prediction. Each tenant i has a predicted output length ``pred_i`` (a float), ``init`` (default 0,
as in the artifact) until its first request finishes. When one of its requests finishes with
``actual`` output tokens:
  first finish of tenant i:  pred_i = actual
  later finishes:            pred_i = (pred_i * (window - 1) + actual) / window      (window = 5)
The artifact calls this a moving average over a window of 5; it is this recursion (an exponential
moving average with weight 1/window, started at the first finished output), not the mean of the
last 5 outputs.

Charges (w_i: the tenant's weight, default 1):
  admission (first):   request r takes p_r = pred_i (the tenant's prediction now; kept with r) and
                       c_i += wp * prefill_tokens / w_i + wq * p_r / w_i
  re-admission after a KV preemption: c_i += wp * prefill_tokens / w_i (the prediction was paid)
  each iteration:      for each sequence r that ran, c_i += wq / w_i iff generated_r > p_r
                       (generated_r counts the token just emitted: tokens beyond the prediction)
  finish:              if actual_r < p_r: c_i -= wq * (p_r - actual_r) / w_i  (refund), then the
                       prediction update above
All of this is the policy's step-8 bookkeeping of the engine model: first the iteration charges
of every sequence that ran, then the iteration's finishes in table order (so that two finishes of
one tenant in one iteration update its prediction in a defined order), as in the artifact
(charges, then finishes).
With ``init = 0`` the policy charges exactly like ``vtc`` until a tenant's first finish.

State: pf = [wp, wq, c_0..c_{n-1}, w_0..w_{n-1}, pred_0..pred_{n-1}, window, init];
pi = [lift = 1, residency mode = 0, finished_0..finished_{n-1} (0/1: has a finish)].
The per-request prediction p_r is kept in the engine state's per-request policy number
``RF[AUX, r]`` (fairlib/sim/state.py).
"""
import numpy as np

from fairlib.sim import jit
from fairlib.sim.policies.base import check_int, check_number
from fairlib.sim.policies.vtc import VTC, accept, select  # noqa: F401  (vtc's lift and selection)
from fairlib.sim.state import AUX, GENERATED, LAST_IDS, OUTPUT, PREEMPT, TENANT

PID = 11


@jit.inline
def on_admit(pf, pi, RF, RI, TI, BT, heap, heap_n, r, line, prefill_tokens, E):
    n_t = TI.shape[1]
    tn = RI[TENANT, r]
    w = pf[2 + n_t + tn]
    if RI[PREEMPT, r] == 0:
        p = pf[2 + 2 * n_t + tn]
        RF[AUX, r] = p
        pf[2 + tn] += pf[0] * prefill_tokens / w + pf[1] * p / w
    else:
        pf[2 + tn] += pf[0] * prefill_tokens / w


@jit.inline
def _finish(pf, pi, RF, RI, n_t, r):
    tn = RI[TENANT, r]
    p = RF[AUX, r]
    actual = RI[OUTPUT, r]
    if actual < p:
        pf[2 + tn] -= pf[1] * (p - actual) / pf[2 + n_t + tn]
    k = 2 + 2 * n_t + tn
    if pi[2 + tn] == 0:
        pf[k] = actual
        pi[2 + tn] = 1
    else:
        window = pf[2 + 3 * n_t]
        pf[k] = (pf[k] * (window - 1) + actual) / window


@jit.inline
def on_iteration(pf, pi, RF, RI, TI, BT, heap, heap_n, B, per_seq, E):
    n_t = TI.shape[1]
    for i in range(B):
        r = BT[LAST_IDS, i]
        if RI[GENERATED, r] > RF[AUX, r]:
            tn = RI[TENANT, r]
            pf[2 + tn] += pf[1] / pf[2 + n_t + tn]
    # then this iteration's finishes, in table order (the batch order is not part of the contract)
    last = -1
    while True:
        nxt = -1
        for i in range(B):
            r = BT[LAST_IDS, i]
            if RI[GENERATED, r] >= RI[OUTPUT, r] and r > last and (nxt < 0 or r < nxt):
                nxt = r
        if nxt < 0:
            break
        _finish(pf, pi, RF, RI, n_t, nxt)
        last = nxt


class VTCPredict(VTC):
    name, pid = "vtc_predict", PID
    params = {"wp": 1.0, "wq": 2.0, "weights": None, "window": 5, "init": 0.0}

    def validate(self, v):
        out = super().validate(v)
        out["window"] = check_int(self.name, "window", v["window"])
        out["init"] = check_number(self.name, "init", v["init"])
        return out

    def state(self, n_tenants, n_requests=None):
        pf, _ = super().state(n_tenants, n_requests)
        pf = np.concatenate([pf, np.full(n_tenants, self.values["init"]),
                             [float(self.values["window"]), self.values["init"]]])
        return pf, np.concatenate([[1, 0], np.zeros(n_tenants, np.int64)]).astype(np.int64)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.values.items())
        return f"{self.name}({args})"
