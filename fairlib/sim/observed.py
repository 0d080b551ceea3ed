"""The engine loop's decisions driven by what a real engine is seen to do (the fairness gateway).

A gateway in front of a real engine cannot run the engine model's clock: the iterations happen in
the engine and show only as tokens arriving on the streams. These entry points run the engine
loop's own steps (fairlib/sim/loop.py) and the policies' hooks on the same state, with each
iteration's facts observed instead of computed:

- ``arrive``: step 1 for the requests appended since the last call: the engine's limits (E[4],
  E[5]; a gateway passes inf), the policy's ``accept``, the waiting line.
- ``admit``: step 2 while fewer than ``E[3]`` requests are in flight (``E[3]``: the slots of the
  upstreams that take requests now): the policy's ``select``, the line's head, ``on_admit``, the
  prefill charge ``E[2] * prompt`` (as the engine model charges it at admission).
- ``observe``: one decode step seen on the streams: ``ids[:n]`` emitted ``tokens[:n]`` tokens in
  a step of ``dt`` ms ending at ``t``, ``finished[:n]`` those whose stream ended with it. Charges,
  as step 5 of the engine model with the step's time measured:

      per_seq = max(0, dt - E[2] * P) / n        P = prompt tokens of the emitters' first tokens

  (their prefill was charged at admission). A stream that brought k > 1 tokens in one event ran k
  engine iterations the gateway saw as one: the step is run as k sub-iterations, the first with
  every emitter and ``per_seq``, the j-th with the emitters of at least j tokens and no time,
  each one handed to the policy's ``on_iteration`` (so a token counter charges every token, the
  residency counter the step's time once, vtc_predict sees the tokens one by one). During
  ``on_iteration``, ``TI[T_RUNNING]`` counts each tenant's sequences in that sub-iteration, as in
  the engine loop, where every running sequence emits; it is the tenant's requests in flight
  again afterwards. The finished ones then leave the batch (``_retire``'s bookkeeping).
- ``clock``: the policy's ``on_clock`` hook (token_pool: its debts brought to t before the gateway
  changes the pool's capacity).
- ``withdraw``: a request leaves outside a step (its client went away, its upstream failed, it
  waited too long): out of its line, or out of the batch, status ``WITHDRAWN``. The policy's
  bookkeeping sees no finish (vtc_predict learns no length from it); what it was charged stays;
  its ``on_withdraw`` hook is told first, while r is still where it was (token_pool brings
  its debts to t, then returns the unused reservation).

Nothing here reads ``RI[OUTPUT]`` of a request in flight: a gateway does not know it. It holds a
large number until the step that finishes the request sets it to the tokens generated.
"""
from fairlib.sim import jit, lines, loop
from fairlib.sim.policies import dispatch
from fairlib.sim.state import (
    BUSY_MS,
    CHARGED,
    DECODE_TOKENS,
    FINISH,
    FINISHED,
    FIRST,
    GENERATED,
    ITERATIONS,
    LAST_B,
    LAST_IDS,
    LINE,
    N_REQ,
    N_RUNNING,
    NEXT_ARRIVAL,
    OUTPUT,
    PRE_TOK,
    RUN_IDS,
    RUNNING,
    STATUS,
    T_DECODE,
    T_FINISHED,
    T_MACHINE,
    T_NOW,
    T_RUNNING,
    T_TOKENS,
    TENANT,
    WAITING,
    WITHDRAWN,
)


@jit.entry
def arrive(S, E, pid, pf, pi, t):
    """Deliver the appended requests (arrival <= t) as step 1 does. Returns how many were delivered."""
    RF, RI, TF, TI, BT, heap, heap_n, sf, si = S
    before = si[NEXT_ARRIVAL]
    loop._deliver(RF, RI, TI, BT, heap, heap_n, si, E, pid, pf, pi, t)
    if t > sf[T_NOW]:
        sf[T_NOW] = t
    return si[NEXT_ARRIVAL] - before


@jit.entry
def admit(S, E, pid, pf, pi, t):
    """Admit as step 2 does while fewer than E[3] run; the admitted are ``BT[RUN_IDS]`` from the
    old ``si[N_RUNNING]`` on. Returns how many were admitted."""
    RF, RI, TF, TI, BT, heap, heap_n, sf, si = S
    before = si[N_RUNNING]
    loop._admit(RF, RI, TF, TI, BT, heap, heap_n, si, E, pid, pf, pi, t, 0)
    return si[N_RUNNING] - before


@jit.inline
def _leave_batch(RI, TI, BT, si, r):
    nrun = si[N_RUNNING]
    for i in range(nrun):
        if BT[RUN_IDS, i] == r:
            for k in range(i, nrun - 1):      # keep the batch in admission order
                BT[RUN_IDS, k] = BT[RUN_IDS, k + 1]
            si[N_RUNNING] = nrun - 1
            TI[T_RUNNING, RI[TENANT, r]] -= 1
            return 1
    return 0


@jit.entry
def observe(S, E, pid, pf, pi, ids, tokens, finished, n, dt, t, saved):
    """One decode step seen on the streams (the module's docstring). ``saved``: an int64 scratch
    array of one entry per tenant. Returns per_seq, or -1 (and changes nothing) when an id is
    not in flight."""
    RF, RI, TF, TI, BT, heap, heap_n, sf, si = S
    n_t = TI.shape[1]
    for i in range(n):
        r = ids[i]
        if r < 0 or r >= si[N_REQ] or RI[STATUS, r] != RUNNING:
            return -1.0
    P = 0
    kmax = 0
    for i in range(n):
        r = ids[i]
        if RI[GENERATED, r] == 0:
            P += RI[PRE_TOK, r]
        if tokens[i] > kmax:
            kmax = tokens[i]
    base = dt - E[2] * P
    if base < 0.0:
        base = 0.0
    per_seq = base / n if n > 0 else 0.0
    for j in range(n_t):
        saved[j] = TI[T_RUNNING, j]
    t_end = t
    for s in range(kmax):
        for j in range(n_t):
            TI[T_RUNNING, j] = 0
        B = 0
        for i in range(n):
            if tokens[i] > s:
                r = ids[i]
                BT[LAST_IDS, B] = r
                B += 1
                RI[GENERATED, r] += 1
                if RI[GENERATED, r] == 1:
                    RF[FIRST, r] = t_end
                if finished[i] == 1 and tokens[i] == s + 1:
                    RI[OUTPUT, r] = RI[GENERATED, r]     # known now: the policy sees the finish
                tn = RI[TENANT, r]
                TI[T_RUNNING, tn] += 1
                TI[T_TOKENS, tn] += 1
                if s == 0:
                    RF[CHARGED, r] += per_seq
        if s == 0:
            for j in range(n_t):
                k = TI[T_RUNNING, j]
                if k > 0:
                    TF[T_MACHINE, j] += per_seq * k
                    TF[T_DECODE, j] += per_seq * k
        si[LAST_B] = B
        si[DECODE_TOKENS] += B
        dispatch.on_iteration(pid, pf, pi, RF, RI, TI, BT, heap, heap_n, B, per_seq if s == 0 else 0.0, E)
    for j in range(n_t):
        TI[T_RUNNING, j] = saved[j]
    for i in range(n):
        if finished[i] == 1:
            r = ids[i]
            if _leave_batch(RI, TI, BT, si, r) == 1:
                RI[STATUS, r] = FINISHED
                RF[FINISH, r] = t_end
                TI[T_FINISHED, RI[TENANT, r]] += 1
    sf[BUSY_MS] += dt
    si[ITERATIONS] += 1
    if t_end > sf[T_NOW]:
        sf[T_NOW] = t_end
    return per_seq


@jit.entry
def withdraw(S, pid, pf, pi, r, t):
    """Take request r out of its line or the batch (the module's docstring). Returns 1 if it was
    waiting, 2 if it was in flight, 0 if it had already left."""
    RF, RI, TF, TI, BT, heap, heap_n, sf, si = S
    st = RI[STATUS, r]
    if st == WAITING:
        dispatch.on_withdraw(pid, pf, pi, RF, RI, TI, BT, heap, heap_n, r, t)
        lines.remove(heap, heap_n, RF, RI[LINE, r], r)
        RI[STATUS, r] = WITHDRAWN
        return 1
    if st == RUNNING:
        dispatch.on_withdraw(pid, pf, pi, RF, RI, TI, BT, heap, heap_n, r, t)
        _leave_batch(RI, TI, BT, si, r)
        RI[STATUS, r] = WITHDRAWN
        return 2
    return 0


@jit.entry
def clock(S, pid, pf, pi, t):
    """The policy's ``on_clock`` hook at t (token_pool: its debts brought to t)."""
    RF, RI, TF, TI, BT, heap, heap_n, sf, si = S
    dispatch.on_clock(pid, pf, pi, RF, RI, TI, BT, heap, heap_n, t)
    if t > sf[T_NOW]:
        sf[T_NOW] = t
