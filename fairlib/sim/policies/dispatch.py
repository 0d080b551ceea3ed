"""Route the engine loop's hook calls to the policy named by its id.

The loop (fairlib/sim/loop.py) calls the first four functions (a gateway, fairlib/sim/observed.py, also the last two) and knows no policy. A new policy is a
module beside the others plus one line per hook it implements here and one in the registry
(fairlib/sim/policies/__init__.py). A policy without a hook gets the default: accept everything,
do nothing."""

from fairlib.sim import jit
from fairlib.sim.policies import aging, fcfs, priority, rpm_quota, rr, slot_cap, token_pool, vtc, vtc_predict, weighted


@jit.inline
def accept(pid, pf, pi, RF, RI, TI, BT, heap, heap_n, r, t):
    if pid == rpm_quota.PID:
        return rpm_quota.accept(pf, pi, RF, RI, TI, BT, heap, heap_n, r, t)
    if pid == vtc.PID_VTC or pid == vtc.PID_LCF or pid == vtc.PID_RESIDENCY:
        return vtc.accept(pf, pi, RF, RI, TI, BT, heap, heap_n, r, t)
    if pid == vtc_predict.PID:
        return vtc_predict.accept(pf, pi, RF, RI, TI, BT, heap, heap_n, r, t)
    if pid == token_pool.PID:
        return token_pool.accept(pf, pi, RF, RI, TI, BT, heap, heap_n, r, t)
    return True


@jit.inline
def select(pid, pf, pi, RF, RI, TI, BT, heap, heap_n, t):
    if pid == vtc.PID_VTC or pid == vtc.PID_LCF or pid == vtc.PID_RESIDENCY:
        return vtc.select(pf, pi, RF, RI, TI, BT, heap, heap_n, t)
    if pid == slot_cap.PID:
        return slot_cap.select(pf, pi, RF, RI, TI, BT, heap, heap_n, t)
    if pid == priority.PID:
        return priority.select(pf, pi, RF, RI, TI, BT, heap, heap_n, t)
    if pid == weighted.PID:
        return weighted.select(pf, pi, RF, RI, TI, BT, heap, heap_n, t)
    if pid == aging.PID:
        return aging.select(pf, pi, RF, RI, TI, BT, heap, heap_n, t)
    if pid == rr.PID:
        return rr.select(pf, pi, RF, RI, TI, BT, heap, heap_n, t)
    if pid == vtc_predict.PID:
        return vtc_predict.select(pf, pi, RF, RI, TI, BT, heap, heap_n, t)
    if pid == token_pool.PID:
        return token_pool.select(pf, pi, RF, RI, TI, BT, heap, heap_n, t)
    return fcfs.select(pf, pi, RF, RI, TI, BT, heap, heap_n, t)   # fcfs, rpm_quota, sjf: the head of the single line


@jit.inline
def on_admit(pid, pf, pi, RF, RI, TI, BT, heap, heap_n, r, line, prefill_tokens, E):
    if pid == vtc.PID_VTC or pid == vtc.PID_LCF or pid == vtc.PID_RESIDENCY:
        vtc.on_admit(pf, pi, RF, RI, TI, BT, heap, heap_n, r, line, prefill_tokens, E)
    elif pid == weighted.PID:
        weighted.on_admit(pf, pi, RF, RI, TI, BT, heap, heap_n, r, line, prefill_tokens, E)
    elif pid == rr.PID:
        rr.on_admit(pf, pi, RF, RI, TI, BT, heap, heap_n, r, line, prefill_tokens, E)
    elif pid == vtc_predict.PID:
        vtc_predict.on_admit(pf, pi, RF, RI, TI, BT, heap, heap_n, r, line, prefill_tokens, E)
    elif pid == token_pool.PID:
        token_pool.on_admit(pf, pi, RF, RI, TI, BT, heap, heap_n, r, line, prefill_tokens, E)


@jit.inline
def on_iteration(pid, pf, pi, RF, RI, TI, BT, heap, heap_n, B, per_seq, E):
    if pid == vtc.PID_VTC or pid == vtc.PID_LCF or pid == vtc.PID_RESIDENCY:
        vtc.on_iteration(pf, pi, RF, RI, TI, BT, heap, heap_n, B, per_seq, E)
    elif pid == vtc_predict.PID:
        vtc_predict.on_iteration(pf, pi, RF, RI, TI, BT, heap, heap_n, B, per_seq, E)
    elif pid == token_pool.PID:
        token_pool.on_iteration(pf, pi, RF, RI, TI, BT, heap, heap_n, B, per_seq, E)


@jit.inline
def on_clock(pid, pf, pi, RF, RI, TI, BT, heap, heap_n, t):
    """The clock reached t with nothing else happening (a gateway about to change the pool's
    capacity, fairlib/sim/observed.py)."""
    if pid == token_pool.PID:
        token_pool.on_clock(pf, pi, RF, RI, TI, BT, heap, heap_n, t)


@jit.inline
def on_withdraw(pid, pf, pi, RF, RI, TI, BT, heap, heap_n, r, t):
    """r is about to leave before finishing (a gateway's withdrawal, fairlib/sim/observed.py): still
    in its line or the batch."""
    if pid == token_pool.PID:
        token_pool.on_withdraw(pf, pi, RF, RI, TI, BT, heap, heap_n, r, t)
