"""The engine loop (book/engine-model.md), one iteration per `step`.

`run` drives `step` to a horizon for a whole table; an online server calls `step_once`, one
iteration at a time, appending arrivals as they come: the same compiled code. The loop knows no
policy: it calls the hooks in fairlib/sim/policies/dispatch.py with the policy's id.

E = [iter_base_ms, iter_slope_ms, prefill_ms_per_token, max_batch, max_prefill_tokens,
kv_capacity_tokens, static (1: static batches, 0: continuous), fill_wait_ms] (inf = no limit). The state arrays are described in fairlib/sim/state.py.
"""
import numpy as np

from fairlib.sim import jit, lines
from fairlib.sim.policies import dispatch
from fairlib.sim.state import (
    ADMITTED,
    ARRIVAL,
    BUSY_MS,
    CHARGED,
    DECODE_TOKENS,
    ENTERED,
    FINISH,
    FILL_START,
    FINISHED,
    FIRST,
    GENERATED,
    HELD,
    HELD_IDS,
    ITERATIONS,
    LAST_B,
    LAST_IDS,
    LINE,
    N_HELD,
    N_REQ,
    N_RUNNING,
    NEXT_ARRIVAL,
    OUTPUT,
    PRE_TOK,
    PREEMPT,
    PROMPT,
    REJECTED,
    RUN_IDS,
    RUNNING,
    STATUS,
    T_ADMITTED,
    T_DECODE,
    T_FINISHED,
    T_MACHINE,
    T_NOW,
    T_PREFILL,
    T_REJECTED,
    T_RUNNING,
    T_TOKENS,
    TENANT,
    WAITING,
)

# step() results
ENDED, RAN, IDLE_JUMP = 0, 1, 2


@jit.inline
def _deliver(RF, RI, TI, BT, heap, heap_n, si, E, pid, pf, pi, t):
    """Step 1: hand every arrival with arrival <= t to the policy, in table order."""
    n = si[N_REQ]
    r = si[NEXT_ARRIVAL]
    while r < n and RF[ARRIVAL, r] <= t:
        if RI[PROMPT, r] > E[4] or RI[PROMPT, r] + RI[OUTPUT, r] > E[5]:
            RI[STATUS, r] = REJECTED          # the engine could never run it
            TI[T_REJECTED, RI[TENANT, r]] += 1
        elif dispatch.accept(pid, pf, pi, RF, RI, TI, BT, heap, heap_n, r, t):
            RI[STATUS, r] = WAITING
            lines.push(heap, heap_n, RF, RI[LINE, r], r)
        else:
            RI[STATUS, r] = REJECTED
            TI[T_REJECTED, RI[TENANT, r]] += 1
        r += 1
    si[NEXT_ARRIVAL] = r


@jit.inline
def _preempt(RI, TI, BT, si, E):
    """Step 2: recompute-preempt the latest entrant while the running set needs more KV than
    there is; need(S) = sum over S of (prompt + generated + 1). Returns need(running)."""
    need = 0
    for i in range(si[N_RUNNING]):
        r = BT[RUN_IDS, i]
        need += RI[PROMPT, r] + RI[GENERATED, r] + 1
    while need > E[5]:
        nrun = si[N_RUNNING]
        j = 0
        for i in range(1, nrun):
            a, b = BT[RUN_IDS, i], BT[RUN_IDS, j]
            if RI[ENTERED, a] > RI[ENTERED, b] or (RI[ENTERED, a] == RI[ENTERED, b] and a > b):
                j = i
        r = BT[RUN_IDS, j]
        BT[RUN_IDS, j] = BT[RUN_IDS, nrun - 1]
        si[N_RUNNING] = nrun - 1
        RI[STATUS, r] = HELD
        RI[PREEMPT, r] += 1
        TI[T_RUNNING, RI[TENANT, r]] -= 1
        BT[HELD_IDS, si[N_HELD]] = r
        si[N_HELD] += 1
        need -= RI[PROMPT, r] + RI[GENERATED, r] + 1
    return need


@jit.inline
def _admit(RF, RI, TF, TI, BT, heap, heap_n, si, E, pid, pf, pi, t, need):
    """Step 3: admit what the policy names while slots, prefill budget and KV allow. Returns P."""
    P = 0
    nrun = si[N_RUNNING]
    while nrun < E[3]:
        line = dispatch.select(pid, pf, pi, RF, RI, TI, BT, heap, heap_n, t)
        if line < 0:
            break
        r = lines.head(heap, line)
        tokens = RI[PROMPT, r] + RI[GENERATED, r]
        if P + tokens > E[4] or need + tokens + 1 > E[5]:
            break
        lines.pop(heap, heap_n, RF, line)
        RI[STATUS, r] = RUNNING
        BT[RUN_IDS, nrun] = r
        nrun += 1
        si[N_RUNNING] = nrun
        need += tokens + 1
        P += tokens
        RI[PRE_TOK, r] = tokens
        RI[ENTERED, r] = si[ITERATIONS]
        tn = RI[TENANT, r]
        pre = E[2] * tokens                 # step 6, prefill part: the admitted request's own
        RF[CHARGED, r] += pre
        TF[T_MACHINE, tn] += pre
        TF[T_PREFILL, tn] += pre
        if np.isnan(RF[ADMITTED, r]):
            RF[ADMITTED, r] = t
            TI[T_ADMITTED, tn] += 1
        TI[T_RUNNING, tn] += 1
        dispatch.on_admit(pid, pf, pi, RF, RI, TI, BT, heap, heap_n, r, line, tokens, E)
    return P


@jit.inline
def _emit(RF, RI, TF, TI, BT, sf, si, E, B, P, t):
    """Steps 5-7: cost, the per-sequence part of the charges (the prefill part was charged at
    admission), one token per running sequence. Returns (clock, per_seq)."""
    per_seq = (E[0] + E[1] * B) / B
    dt = E[0] + E[1] * B + E[2] * P
    t += dt
    for i in range(B):
        r = BT[RUN_IDS, i]
        BT[LAST_IDS, i] = r
        RF[CHARGED, r] += per_seq
        RI[GENERATED, r] += 1
        if RI[GENERATED, r] == 1:
            RF[FIRST, r] = t
    for j in range(TI.shape[1]):           # TI[T_RUNNING, j]: tenant j's sequences in this batch
        k = TI[T_RUNNING, j]
        if k > 0:
            TF[T_MACHINE, j] += per_seq * k
            TF[T_DECODE, j] += per_seq * k
            TI[T_TOKENS, j] += k
    sf[T_NOW] = t
    sf[BUSY_MS] += dt
    si[ITERATIONS] += 1
    si[LAST_B] = B
    si[DECODE_TOKENS] += B
    return t, per_seq


@jit.inline
def _retire(RF, RI, TI, BT, heap, heap_n, si, B, t):
    """Step 8, after the policy's bookkeeping (on_iteration, which sees the finishes too):
    finishes leave the batch, the preempted go back."""
    k = 0
    for i in range(B):
        r = BT[RUN_IDS, i]
        if RI[GENERATED, r] >= RI[OUTPUT, r]:
            RI[STATUS, r] = FINISHED
            RF[FINISH, r] = t
            tn = RI[TENANT, r]
            TI[T_FINISHED, tn] += 1
            TI[T_RUNNING, tn] -= 1
        else:
            BT[RUN_IDS, k] = r
            k += 1
    si[N_RUNNING] = k
    for i in range(si[N_HELD]):
        r = BT[HELD_IDS, i]
        RI[STATUS, r] = WAITING
        lines.push(heap, heap_n, RF, RI[LINE, r], r)
    si[N_HELD] = 0


@jit.inline
def step(RF, RI, TF, TI, BT, heap, heap_n, sf, si, E, pid, pf, pi, horizon):
    """One iteration at the clock sf[T_NOW]. Returns RAN, IDLE_JUMP or ENDED (nothing runs and
    no arrival is left; an online caller appends arrivals and calls again). A free static-batch
    worker waiting to fill jumps to its deadline, the next known arrival or ``horizon``, whichever
    is first: an online caller that runs to each arrival before it appends it (``run`` to that
    horizon) sees the same batches as a table run."""
    t = sf[T_NOW]
    _deliver(RF, RI, TI, BT, heap, heap_n, si, E, pid, pf, pi, t)
    need = 0
    if E[5] < np.inf:
        need = _preempt(RI, TI, BT, si, E)
    if E[6] > 0.0:                                 # static batches: only a free worker takes more
        P = 0
        if si[N_RUNNING] == 0:
            waiting = 0
            for line in range(heap_n.shape[0]):
                waiting += heap_n[line]
            if waiting > 0:
                if sf[FILL_START] < 0.0:
                    sf[FILL_START] = t
                deadline = sf[FILL_START] + E[7]
                if waiting < E[3] and t < deadline:    # wait for more, up to the deadline
                    nxt = si[NEXT_ARRIVAL]
                    if nxt < si[N_REQ] and RF[ARRIVAL, nxt] < deadline:
                        deadline = RF[ARRIVAL, nxt]
                    sf[T_NOW] = min(deadline, horizon)
                    return IDLE_JUMP
                P = _admit(RF, RI, TF, TI, BT, heap, heap_n, si, E, pid, pf, pi, t, need)
                sf[FILL_START] = -1.0
    else:
        P = _admit(RF, RI, TF, TI, BT, heap, heap_n, si, E, pid, pf, pi, t, need)
    B = si[N_RUNNING]
    if B == 0:                                     # step 4: idle
        nxt = si[NEXT_ARRIVAL]
        if nxt < si[N_REQ]:
            sf[T_NOW] = RF[ARRIVAL, nxt]
            return IDLE_JUMP
        return ENDED
    t, per_seq = _emit(RF, RI, TF, TI, BT, sf, si, E, B, P, t)
    dispatch.on_iteration(pid, pf, pi, RF, RI, TI, BT, heap, heap_n, B, per_seq, E)
    _retire(RF, RI, TI, BT, heap, heap_n, si, B, t)
    return RAN


@jit.entry
def step_once(S, E, pid, pf, pi):
    """One iteration (online use): the same `step` the batch run uses."""
    RF, RI, TF, TI, BT, heap, heap_n, sf, si = S
    return step(RF, RI, TF, TI, BT, heap, heap_n, sf, si, E, pid, pf, pi, np.inf)


@jit.entry
def run(S, E, pid, pf, pi, horizon_ms):
    """Iterate while the clock is below the horizon (the last iteration may end past it)."""
    RF, RI, TF, TI, BT, heap, heap_n, sf, si = S
    while sf[T_NOW] < horizon_ms:
        if step(RF, RI, TF, TI, BT, heap, heap_n, sf, si, E, pid, pf, pi, horizon_ms) == ENDED:
            break
