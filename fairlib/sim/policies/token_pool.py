"""token_pool: capacity as three resources, entitlements by class, debt, admission with 429
(chapter 6; the rules as formulas in fairlib/pools.py's docstring, which this module implements).

Units: work in machine-ms (residency, chapter 1: what a replica supplies is 1 ms of machine time
per ms of wall time, so a pool of ``R`` replicas serves ``R`` machine-ms per ms). A request of
``P`` prompt tokens and estimated output ``Ê`` (``est_output_tokens``) reserves

    c = p * P + u * Ê        (p = prefill_price_ms per prompt token, u = decode_price_ms per output token)

of the horizon's work, one slot and ``P + Ê`` KV tokens. Tenant ``i`` has class ``k_i``
(guaranteed 0, elastic 1, spot 2), share ``e_i`` (spot: 0), TTFT SLO ``s_i``.

Admission (``accept``, at arrival t), with ``Q_j`` the work tenant j holds reserved in the queue
(accepted, not yet dispatched: the horizon bounds the work waiting to start; what runs holds
slots and KV instead), ``cap_j = e_j R H``:

    within:  k_i != spot and Q_i + c <= cap_i                               -> accept
    else:    W + c <= R H - A,   W = sum_j Q_j,
             A = sum over active non-spot j != i of max(0, cap_j - Q_j)    -> accept, else 429
             (active: a request of it waiting or running, or accepted in the last H ms)
    Retry-After of a refused request: (W + c - (R H - A)) / R ms.
    A request with c > R H, or P + Ê above the pool's KV tokens, is refused with no Retry-After.

Dispatch (``select``, at t), over the tenants with a request waiting, the head ``r`` of each line:
eligible if ``i`` is guaranteed within its slots (``n_i < ceil(e_i N)``, ``N = replica_slots x R``), else
if ``n + 1 + G_slots <= N`` and ``K + P_r + Ê_r + G_kv <= X`` (``n``, ``K``: requests and reserved
KV in flight; ``X = kv_tokens x R``; ``G_slots``, ``G_kv``: what the guaranteed tenants other than
i hold unused of their ``ceil(e_g N)`` slots and ``e_g X`` KV tokens; at most ``N - 1`` slots and
``X - P_r - Ê_r`` tokens, so that a request always runs on an otherwise idle pool; the slots at
most ``guaranteed_headroom`` if given: a guaranteed request beyond them waits for the next free
slot, which its class wins). The eligible
head of the highest priority goes first (ties: the earlier request):

    w_i = K[k_i] + min(1, (t - arrival_r) / s_i) + beta clip(d_i / (e_i h), -1, 1)
    K = (10, 3, 0): the ranges never overlap (beta <= 1), so a class is never served after a lower
    one; beta = ``debt_weight`` (default 1; 0 switches the debt off); spot, and a tenant of share 0,
    has no debt term.

Settlement. At dispatch the reservation leaves the queue (``Q_i -= c``) and runs with the request
as its rest ``rest_r = c``. Every charge ``x`` to it (``on_admit``: the prefill; ``on_iteration``:
each step's ``per_seq``) is service, ``S_i += x``, and is taken from the rest as far as it goes;
what it runs beyond (overrun) is service like the rest: it pays back the tenant's debt while the
tenant is in demand (below), as the unused part of a short answer is owed to nobody. A request
withdrawn while waiting leaves the queue (``Q_i -= c``).

Debt (``_advance``, at every hook with a clock, over the interval since the last one): a
non-spot tenant in demand accrues ``d_i += e_i R dt - S_i`` (what it was owed less what it
got); one not in demand decays, ``d_i *= 2 ** (-dt / h)``. In demand: a
request of it waits, or it had one refused (429, a fundable one) within H before the interval:
a tenant the pool turns away is as under-served as one it keeps waiting. Both change only at
those hooks (an arrival, an admission, a withdrawal), so the rule holds over each interval
exactly; the one exception, a request the engine's own KV limit preempts back into its line,
counts from the next hook on.

``R`` changes (a replica lost or back) through ``PolicyGate.set_replicas``: the debts are brought
to that time (the ``on_clock`` hook), then R is set.

pf = [H, h, R, u, p, kv_tokens, t_last, slots, beta, headroom, then per tenant: class, share, SLO, Q, debt,
S, last accept, retry_ms, open reservations, last refusal]; RF[AUX] = a request's unused reservation."""
import math

import numpy as np

from fairlib.sim import jit
from fairlib.sim.policies.base import Policy, check_int, check_number
from fairlib.sim.state import (ARRIVAL, AUX, EST, GENERATED, LAST_IDS, OUTPUT, PREEMPT, PROMPT, RUN_IDS, STATUS,
                               T_RUNNING, TENANT, WAITING)

PID = 12
GUARANTEED, ELASTIC, SPOT = 0, 1, 2
CLASSES = ("guaranteed", "elastic", "spot")
#: the class base weights K of the priority: their ranges (K-1 .. K+2) never overlap
CLASS_WEIGHT = (10.0, 3.0, 0.0)

# pf scalars
H, HALF, R, U, PRE, KV, T_LAST, SLOTS, DEBT_W, HEADROOM = range(10)
N_SCALARS = 10
# per-tenant blocks: pf[N_SCALARS + b * n_t + i]
B_CLASS, B_SHARE, B_SLO, B_Q, B_DEBT, B_SERVED, B_LAST, B_RETRY, B_OPEN, B_REFUSED = range(10)
N_BLOCKS = 10
#: RETRY of a request no state of the pool could fund (its reservation exceeds R H, or its KV
#: tokens the pool's cache): refused with no Retry-After
NEVER = -1.0


@jit.inline
def _at(b, i, n_t):
    return N_SCALARS + b * n_t + i


@jit.inline
def _advance(pf, heap_n, n_t, t):
    """The debt rule over (t_last, t]."""
    dt = t - pf[T_LAST]
    if dt > 0.0:
        for i in range(n_t):
            if pf[_at(B_CLASS, i, n_t)] != SPOT:
                if heap_n[i] > 0 or pf[T_LAST] - pf[_at(B_REFUSED, i, n_t)] <= pf[H]:
                    pf[_at(B_DEBT, i, n_t)] += pf[_at(B_SHARE, i, n_t)] * pf[R] * dt - pf[_at(B_SERVED, i, n_t)]
                else:
                    pf[_at(B_DEBT, i, n_t)] *= 0.5 ** (dt / pf[HALF])
            pf[_at(B_SERVED, i, n_t)] = 0.0
        pf[T_LAST] = t


@jit.inline
def _settle(pf, RF, n_t, r, i, x):
    """A charge of x machine-ms to request r of tenant i: service (S_i += x), taken from its
    reservation's rest as far as it goes."""
    rest = RF[AUX, r]
    y = x if x < rest else rest
    if y < 0.0:
        y = 0.0
    RF[AUX, r] = rest - y
    pf[_at(B_SERVED, i, n_t)] += x


@jit.inline
def _unqueue(pf, RF, n_t, r, i):
    """Request r stops waiting (dispatched, or withdrawn from its line): its reservation leaves
    Q_i (the tenant's last waiting one: Q_i is exactly 0, whatever rounding the sum kept)."""
    q = pf[_at(B_Q, i, n_t)] - RF[AUX, r]
    pf[_at(B_OPEN, i, n_t)] -= 1.0
    if pf[_at(B_OPEN, i, n_t)] <= 0.0:
        pf[_at(B_OPEN, i, n_t)] = 0.0
        q = 0.0
    pf[_at(B_Q, i, n_t)] = q if q > 0.0 else 0.0


@jit.inline
def accept(pf, pi, RF, RI, TI, BT, heap, heap_n, r, t):
    n_t = TI.shape[1]
    _advance(pf, heap_n, n_t, t)
    i = RI[TENANT, r]
    c = pf[PRE] * RI[PROMPT, r] + pf[U] * RI[EST, r]
    rh = pf[R] * pf[H]
    if c > rh or RI[PROMPT, r] + RI[EST, r] > pf[KV] * pf[R]:
        pf[_at(B_RETRY, i, n_t)] = NEVER            # larger than the whole pool: never fundable
        return False
    q_i = pf[_at(B_Q, i, n_t)]
    ok = pf[_at(B_CLASS, i, n_t)] != SPOT and q_i + c <= pf[_at(B_SHARE, i, n_t)] * rh
    if not ok:
        w = 0.0
        a = 0.0
        for j in range(n_t):
            q = pf[_at(B_Q, j, n_t)]
            w += q
            if j != i and pf[_at(B_CLASS, j, n_t)] != SPOT and (pf[_at(B_OPEN, j, n_t)] > 0.0 or
                                                                 TI[T_RUNNING, j] > 0 or
                                                                 t - pf[_at(B_LAST, j, n_t)] <= pf[H]):
                free = pf[_at(B_SHARE, j, n_t)] * rh - q
                if free > 0.0:
                    a += free
        ok = w + c <= rh - a
        if not ok:
            pf[_at(B_RETRY, i, n_t)] = (w + c - (rh - a)) / pf[R]
            pf[_at(B_REFUSED, i, n_t)] = t
    if ok:
        RF[AUX, r] = c
        pf[_at(B_Q, i, n_t)] = q_i + c
        pf[_at(B_OPEN, i, n_t)] += 1.0
        pf[_at(B_LAST, i, n_t)] = t
        pf[_at(B_RETRY, i, n_t)] = 0.0
    return ok


@jit.inline
def select(pf, pi, RF, RI, TI, BT, heap, heap_n, t):
    n_t = TI.shape[1]
    _advance(pf, heap_n, n_t, t)
    n_slots = pf[SLOTS] * pf[R]
    kv_tot = pf[KV] * pf[R]
    nrun = 0
    for j in range(n_t):
        nrun += TI[T_RUNNING, j]
    kv_used = 0.0
    for k in range(nrun):
        q = BT[RUN_IDS, k]
        kv_used += RI[PROMPT, q] + RI[EST, q]
    best = -1
    best_w = -np.inf
    best_r = -1
    for i in range(n_t):
        if heap_n[i] == 0:
            continue
        r = heap[heap[i]]
        cls = pf[_at(B_CLASS, i, n_t)]
        share = pf[_at(B_SHARE, i, n_t)]
        ok = cls == GUARANTEED and TI[T_RUNNING, i] < math.ceil(share * n_slots - 1e-9)
        if not ok:
            g_slots = 0.0
            g_kv = 0.0
            for g in range(n_t):
                if g != i and pf[_at(B_CLASS, g, n_t)] == GUARANTEED:
                    s_g = math.ceil(pf[_at(B_SHARE, g, n_t)] * n_slots - 1e-9) - TI[T_RUNNING, g]
                    if s_g > 0:
                        g_slots += s_g
                    held = 0.0
                    for k in range(nrun):
                        q = BT[RUN_IDS, k]
                        if RI[TENANT, q] == g:
                            held += RI[PROMPT, q] + RI[EST, q]
                    f = pf[_at(B_SHARE, g, n_t)] * kv_tot - held
                    if f > 0.0:
                        g_kv += f
            need = RI[PROMPT, r] + RI[EST, r]
            if g_slots > pf[HEADROOM]:
                g_slots = pf[HEADROOM]
            if g_slots > n_slots - 1.0:      # the holdback never keeps an otherwise idle pool from running
                g_slots = n_slots - 1.0
            if g_kv > kv_tot - need:
                g_kv = kv_tot - need
            ok = nrun + 1 + g_slots <= n_slots and kv_used + need + g_kv <= kv_tot
        if not ok:
            continue
        wait = t - RF[ARRIVAL, r]
        u = wait / pf[_at(B_SLO, i, n_t)]
        if u > 1.0:
            u = 1.0
        elif u < 0.0:
            u = 0.0
        w = u
        if cls == GUARANTEED:
            w += CLASS_WEIGHT[0]
        elif cls == ELASTIC:
            w += CLASS_WEIGHT[1]
        if cls != SPOT and share > 0.0:
            d = pf[_at(B_DEBT, i, n_t)] / (share * pf[HALF])
            if d > 1.0:
                d = 1.0
            elif d < -1.0:
                d = -1.0
            w += pf[DEBT_W] * d
        if best < 0 or w > best_w or (w == best_w and r < best_r):
            best, best_w, best_r = i, w, r
    return best


@jit.inline
def on_admit(pf, pi, RF, RI, TI, BT, heap, heap_n, r, line, prefill_tokens, E):
    n_t = TI.shape[1]
    i = RI[TENANT, r]
    if RI[PREEMPT, r] == 0:                   # its first admission (a re-admission follows a preemption)
        _unqueue(pf, RF, n_t, r, i)
    _settle(pf, RF, n_t, r, i, E[2] * prefill_tokens)


@jit.inline
def on_iteration(pf, pi, RF, RI, TI, BT, heap, heap_n, B, per_seq, E):
    n_t = TI.shape[1]
    for k in range(B):
        r = BT[LAST_IDS, k]
        if per_seq > 0.0:
            _settle(pf, RF, n_t, r, RI[TENANT, r], per_seq)
        if RI[GENERATED, r] >= RI[OUTPUT, r]:
            RF[AUX, r] = 0.0                  # its end: what it did not use is not owed


@jit.inline
def on_clock(pf, pi, RF, RI, TI, BT, heap, heap_n, t):
    _advance(pf, heap_n, TI.shape[1], t)


@jit.inline
def on_withdraw(pf, pi, RF, RI, TI, BT, heap, heap_n, r, t):
    _advance(pf, heap_n, TI.shape[1], t)
    if RI[STATUS, r] == WAITING and RI[PREEMPT, r] == 0:
        _unqueue(pf, RF, TI.shape[1], r, RI[TENANT, r])
    RF[AUX, r] = 0.0


class TokenPool(Policy):
    name, pid = "token_pool", PID
    params = {"classes": None, "shares": None, "slo_ms": None, "decode_price_ms": None,
              "prefill_price_ms": 0.0, "pool_horizon_ms": 5000.0, "half_life_ms": 10000.0, "replicas": 1,
              "replica_slots": None, "kv_tokens": None, "debt_weight": 1.0,
              "guaranteed_headroom": None}
    #: accept and select read the clock and move the debts: a gate logs every admission call
    clocked = True
    required = ("classes", "shares", "decode_price_ms", "replica_slots")
    needs = ("est_output_tokens",)

    def validate(self, v):
        n = self.name
        classes = [v["classes"]] if isinstance(v["classes"], str) else list(np.atleast_1d(v["classes"]))
        for c in classes:
            if c not in CLASSES:
                raise ValueError(f"policy {n!r}: parameter 'classes' takes {', '.join(CLASSES)} per tenant, got {c!r}")
        shares = [check_number(n, "shares", x) for x in np.atleast_1d(v["shares"])]
        if len(shares) != len(classes):
            raise ValueError(f"policy {n!r}: 'shares' needs one value per entry of 'classes' ({len(classes)}), "
                             f"got {len(shares)}")
        for i, (c, s) in enumerate(zip(classes, shares)):
            if s > 1:
                raise ValueError(f"policy {n!r}: parameter 'shares' must lie in 0..1, got shares[{i}] = {s!r}")
            if c == "spot" and s != 0:
                raise ValueError(f"policy {n!r}: a spot tenant has no entitlement: shares[{i}] (tenant {i}, spot) "
                                 f"must be 0, got {s!r}")
        if sum(shares) > 1 + 1e-9:
            raise ValueError(f"policy {n!r}: the shares add up to {sum(shares):g}, more than the pool (1): "
                             + ", ".join(f"tenant {i} {s:g}" for i, s in enumerate(shares) if s))
        slo = v["slo_ms"]
        slo = [math.inf] * len(classes) if slo is None else \
            [math.inf if x is None or x == math.inf else check_number(n, "slo_ms", x, 0.0, strict=True)
             for x in (slo if isinstance(slo, (list, tuple)) else np.atleast_1d(slo))]
        if len(slo) != len(classes):
            raise ValueError(f"policy {n!r}: 'slo_ms' needs one value per entry of 'classes' ({len(classes)}), "
                             f"got {len(slo)}")
        kv = v["kv_tokens"]
        return {"classes": [str(c) for c in classes], "shares": shares, "slo_ms": slo,
                "decode_price_ms": check_number(n, "decode_price_ms", v["decode_price_ms"], 0.0, True),
                "prefill_price_ms": check_number(n, "prefill_price_ms", v["prefill_price_ms"]),
                "pool_horizon_ms": check_number(n, "pool_horizon_ms", v["pool_horizon_ms"], 0.0, strict=True),
                "half_life_ms": check_number(n, "half_life_ms", v["half_life_ms"], 0.0, strict=True),
                "replicas": check_int(n, "replicas", v["replicas"], low=0),
                "replica_slots": check_int(n, "replica_slots", v["replica_slots"]),
                "kv_tokens": None if kv is None else check_int(n, "kv_tokens", kv),
                "debt_weight": check_number(n, "debt_weight", v["debt_weight"]),
                "guaranteed_headroom": None if v["guaranteed_headroom"] is None else
                check_int(n, "guaranteed_headroom", v["guaranteed_headroom"], low=0)}

    def lines(self, rows, tenant, klass, priority, est, n_tenants, n_classes=None, priority_levels=None):
        return np.asarray(tenant, np.int64), np.asarray(rows, np.float64), n_tenants

    def online_lines(self, n_tenants, n_classes):
        return n_tenants

    def state(self, n_tenants, n_requests=None):
        v = self.values
        if len(v["classes"]) != n_tenants:
            raise ValueError(f"policy {self.name!r}: 'classes', 'shares' and 'slo_ms' need one value per tenant "
                             f"({n_tenants}), got {len(v['classes'])}")
        pf = np.zeros(N_SCALARS + N_BLOCKS * n_tenants)
        pf[[H, HALF, R, U, PRE, KV, T_LAST, SLOTS, DEBT_W, HEADROOM]] = [
            v["pool_horizon_ms"], v["half_life_ms"], v["replicas"], v["decode_price_ms"], v["prefill_price_ms"],
            np.inf if v["kv_tokens"] is None else v["kv_tokens"], 0.0, v["replica_slots"], v["debt_weight"],
            np.inf if v["guaranteed_headroom"] is None else v["guaranteed_headroom"]]
        blk = lambda b: slice(N_SCALARS + b * n_tenants, N_SCALARS + (b + 1) * n_tenants)  # noqa: E731
        pf[blk(B_CLASS)] = [CLASSES.index(c) for c in v["classes"]]
        pf[blk(B_SHARE)] = v["shares"]
        pf[blk(B_SLO)] = v["slo_ms"]
        pf[blk(B_LAST)] = -np.inf
        pf[blk(B_REFUSED)] = -np.inf
        return pf, np.zeros(1, np.int64)

    counter_unit = "ms"

    def counters(self, pf, n_tenants):
        """The debts d_i (machine-ms the pool owes each tenant; negative: it was served beyond)."""
        return pf[N_SCALARS + B_DEBT * n_tenants:N_SCALARS + (B_DEBT + 1) * n_tenants].copy()

    def pool_state(self, pf, n_tenants, t_ms=None, waiting=None) -> dict:
        """Per tenant (arrays): reserved work waiting Q (ms), debt d (ms), entitlement cap e R H (ms), the
        last Retry-After (ms; -1: never fundable); and the pool's replicas R. As of the last hook;
        with ``t_ms`` and ``waiting`` (requests waiting per tenant since then) the debts brought
        forward to ``t_ms`` by the debt rule (a reading: ``pf`` is not changed)."""
        blk = lambda b: pf[N_SCALARS + b * n_tenants:N_SCALARS + (b + 1) * n_tenants].copy()  # noqa: E731
        d, r = blk(B_DEBT), float(pf[R])
        if t_ms is not None and t_ms > pf[T_LAST]:
            dt = float(t_ms) - float(pf[T_LAST])
            owed = d + blk(B_SHARE) * r * dt - blk(B_SERVED)
            demand = (np.asarray(waiting) > 0) | (pf[T_LAST] - blk(B_REFUSED) <= pf[H])
            d = np.where(blk(B_CLASS) == SPOT, d, np.where(demand, owed, d * 0.5 ** (dt / pf[HALF])))
        return {"reserved_ms": blk(B_Q), "debt_ms": d, "cap_ms": blk(B_SHARE) * r * pf[H],
                "retry_ms": blk(B_RETRY), "replicas": r}

    def apply_replicas(self, pf, replicas: int) -> None:
        """The pool's capacity is ``replicas`` replicas from now on (a replica lost or back). The
        debts must have been brought to the change's time first: ``PolicyGate.set_replicas``
        does that (its clock hook), then calls this."""
        if isinstance(replicas, bool) or not float(replicas).is_integer() or replicas < 0:
            raise ValueError(f"replicas must be an integer >= 0, got {replicas!r}")
        pf[R] = float(replicas)

    def apply_slots(self, pf, slots: int) -> None:
        """Each replica takes ``slots`` requests from now on (``replica_slots``: the gateway's
        in-flight credit moved). Only the admission test reads it; the debts do not."""
        pf[SLOTS] = float(check_int(self.name, "replica_slots", slots))

    def retry_after_ms(self, pf, pi, n_tenants: int, tenant: int, t_ms: float):
        """The Retry-After of ``tenant``'s last refused request: the work over the limit, drained at
        R; None for a request the pool could never fund."""
        ms = float(pf[N_SCALARS + B_RETRY * n_tenants + tenant])
        return None if ms < 0 else ms
