"""Plain-Python reference implementation of the engine model (book/engine-model.md).

Written independently of ``fairlib`` so that agreement between the two means something.
Standard library only; a pandas DataFrame is accepted as input (read column by column).

The simulation follows the book's numbered steps literally:

    while t < horizon_ms:
        1. arrivals (engine rejection, then policy admission control)
        2. KV preemption (latest entry into the batch first; ties: later table position)
        3. admission (policy names the next request; stop at the first one that does not fit)
        4. idle jump to the next undelivered arrival (or end)
        5. cost dt = base + slope * B + prefill_ms_per_token * P
        6. charges (prefill charges + per_seq for each running sequence)
        7. tokens: t += dt, one token per running sequence, finishes
        8. policy bookkeeping (running set, finishes), then the preempted go back to waiting

Decisions (the book's, plus the ones taken here where the book is silent):
- Waiting lines are ordered by table position (= arrival order, ties by table order); a
  preempted request returns at its original position, not at the back.
- Counter policies (vtc, lcf, residency) add the admission charge at the moment of
  admission (step 3), so it already counts for the next selection in the same iteration,
  as in the VTC paper's Algorithm 2. Per-sequence charges are added in step 8.
- A preempted request is held aside during the iteration that preempted it and goes back to
  the waiting line after step 8 (no counter lift, no rate-limit check).
"""

import bisect
import heapq
import math

NAN = float("nan")


def _column(requests, name, cast, default=None):
    if name in requests:
        return [cast(v) for v in list(requests[name])]
    return default


# --------------------------------------------------------------------------------------
# Policies.  Interface used by the engine:
#   arrive(i, t) -> bool       accept (join the waiting line) or reject at arrival
#   select(t) -> i or None     the next request to admit (a peek; does not remove it)
#   admit(i, prefill_tokens)   the request named by the last select() was admitted
#   end_iteration(ran, per_seq, finished)   step 8 bookkeeping
#   requeue(i)                 a preempted request goes back to its waiting line
# --------------------------------------------------------------------------------------


class _Policy:
    def __init__(self, sim):
        self.sim = sim

    def arrive(self, i, t):
        self.push(i)
        return True

    def admit(self, i, prefill_tokens):
        self.remove(i)

    def end_iteration(self, ran, per_seq, finished):
        pass

    def requeue(self, i):
        self.push(i)


class _FCFS(_Policy):
    """Global arrival order: a min-heap of table positions."""

    def __init__(self, sim):
        super().__init__(sim)
        self.heap = []

    def push(self, i):
        heapq.heappush(self.heap, i)

    def select(self, t):
        return self.heap[0] if self.heap else None

    def remove(self, i):
        assert self.heap[0] == i
        heapq.heappop(self.heap)


class _RpmQuota(_FCFS):
    def __init__(self, sim, limit):
        super().__init__(sim)
        self.limit = int(limit)
        if self.limit < 1:
            raise ValueError("rpm_quota limit must be >= 1")
        self.accepted = [[] for _ in range(sim.n_tenants)]  # accepted arrival times, ascending

    def arrive(self, i, t):
        a = self.sim.arrival[i]
        times = self.accepted[self.sim.tenant[i]]
        lo = a - 60000.0
        # accepted requests with arrival in (a - 60000, a]; all delivered ones are <= a
        n_in_window = len(times) - bisect.bisect_right(times, lo)
        if n_in_window >= self.limit:
            return False
        times.append(a)
        self.push(i)
        return True


class _SlotCap(_Policy):
    """FCFS, skipping requests whose tenant already runs `cap` sequences."""

    def __init__(self, sim, cap):
        super().__init__(sim)
        self.cap = int(cap)
        if self.cap < 1:
            raise ValueError("slot_cap cap must be >= 1")
        self.waiting = []  # sorted table positions

    def push(self, i):
        bisect.insort(self.waiting, i)

    def select(self, t):
        counts = self.sim.running_per_tenant()
        for i in self.waiting:
            if counts.get(self.sim.tenant[i], 0) < self.cap:
                return i
        return None

    def remove(self, i):
        self.waiting.remove(i)


class _KeyHeap(_Policy):
    """Lowest static key first, ties by table position (priority, sjf)."""

    def __init__(self, sim, keys):
        super().__init__(sim)
        self.keys = keys
        self.heap = []

    def push(self, i):
        heapq.heappush(self.heap, (self.keys[i], i))

    def select(self, t):
        return self.heap[0][1] if self.heap else None

    def remove(self, i):
        assert self.heap[0][1] == i
        heapq.heappop(self.heap)


class _PerClass(_Policy):
    """Waiting lines per class, each a min-heap of table positions."""

    def __init__(self, sim):
        super().__init__(sim)
        if sim.klass is None:
            raise ValueError("this policy needs a `klass` column")
        self.lines = {}

    def push(self, i):
        heapq.heappush(self.lines.setdefault(self.sim.klass[i], []), i)

    def remove(self, i):
        line = self.lines[self.sim.klass[i]]
        assert line[0] == i
        heapq.heappop(line)


class _Weighted(_PerClass):
    def __init__(self, sim, w):
        super().__init__(sim)
        self.rotation = []
        for k, wk in enumerate(w):
            self.rotation.extend([k] * int(wk))
        if not self.rotation:
            raise ValueError("weighted needs a positive weight")
        self.pointer = 0
        self.chosen_slot = None

    def select(self, t):
        L = len(self.rotation)
        for step in range(L):
            slot = (self.pointer + step) % L
            line = self.lines.get(self.rotation[slot])
            if line:
                self.chosen_slot = slot
                return line[0]
        self.chosen_slot = None
        return None

    def admit(self, i, prefill_tokens):
        assert self.chosen_slot is not None and self.rotation[self.chosen_slot] == self.sim.klass[i]
        self.remove(i)
        self.pointer = (self.chosen_slot + 1) % len(self.rotation)
        self.chosen_slot = None


class _Aging(_PerClass):
    def __init__(self, sim, rate):
        super().__init__(sim)
        self.rate = float(rate)

    def score(self, i, t):
        return self.sim.klass[i] - self.rate * (t - self.sim.arrival[i]) / 1000

    def select(self, t):
        if self.rate >= 0:
            # within a class the oldest request has the lowest score (monotone in arrival)
            candidates = [line[0] for line in self.lines.values() if line]
        else:
            candidates = [i for line in self.lines.values() for i in line]
        best = None
        best_key = None
        for i in candidates:
            key = (self.score(i, t), i)
            if best_key is None or key < best_key:
                best, best_key = i, key
        return best

    def remove(self, i):
        line = self.lines[self.sim.klass[i]]
        line.remove(i)
        heapq.heapify(line)


class _Counter(_Policy):
    """vtc / lcf / residency: a counter per tenant; serve the backlogged tenant with the
    lowest counter (ties: lowest tenant index), its oldest request first."""

    def __init__(self, sim, kind, wp=1.0, wq=2.0, weights=None):
        super().__init__(sim)
        n = sim.n_tenants
        self.kind = kind  # "vtc", "lcf" or "residency"
        self.wp = float(wp)
        self.wq = float(wq)
        self.weights = [1.0] * n if weights is None else [float(x) for x in weights]
        if len(self.weights) != n:
            raise ValueError("weights must have one entry per tenant")
        self.counter = [0.0] * n
        self.lines = [[] for _ in range(n)]  # min-heaps of table positions

    def arrive(self, i, t):
        u = self.sim.tenant[i]
        if self.kind != "lcf" and not self.lines[u]:
            others = [self.counter[v] for v in range(self.sim.n_tenants) if v != u and self.lines[v]]
            if others:
                self.counter[u] = max(self.counter[u], min(others))
        heapq.heappush(self.lines[u], i)
        return True

    def push(self, i):
        heapq.heappush(self.lines[self.sim.tenant[i]], i)

    def select(self, t):
        best = None
        for u in range(self.sim.n_tenants):
            if self.lines[u] and (best is None or self.counter[u] < self.counter[best]):
                best = u
        return None if best is None else self.lines[best][0]

    def admit(self, i, prefill_tokens):
        u = self.sim.tenant[i]
        assert self.lines[u][0] == i
        heapq.heappop(self.lines[u])
        if self.kind == "residency":
            self.counter[u] += self.sim.prefill_ms_per_token * prefill_tokens / self.weights[u]
        else:
            self.counter[u] += self.wp * prefill_tokens / self.weights[u]

    def end_iteration(self, ran, per_seq, finished):
        for i in ran:
            u = self.sim.tenant[i]
            if self.kind == "residency":
                self.counter[u] += per_seq / self.weights[u]
            else:
                self.counter[u] += self.wq / self.weights[u]


class _RoundRobin(_Policy):
    """rr: per-tenant FIFO lines and a pointer over tenants (starting at tenant 0). Select scans
    tenants pointer, pointer + 1, ... (mod n) for the first with a request waiting and names its
    oldest; admitting it moves the pointer to the tenant after the admitted request's tenant."""

    def __init__(self, sim):
        super().__init__(sim)
        self.lines = [[] for _ in range(sim.n_tenants)]  # min-heaps of table positions
        self.pointer = 0

    def push(self, i):
        heapq.heappush(self.lines[self.sim.tenant[i]], i)

    def select(self, t):
        n = self.sim.n_tenants
        for step in range(n):
            u = (self.pointer + step) % n
            if self.lines[u]:
                return self.lines[u][0]
        return None

    def admit(self, i, prefill_tokens):
        u = self.sim.tenant[i]
        assert self.lines[u][0] == i
        heapq.heappop(self.lines[u])
        self.pointer = (u + 1) % self.sim.n_tenants


class _VTCPredict(_Counter):
    """vtc_predict (book/engine-model.md): vtc's lines, selection and lift. Each tenant has a
    predicted output length (`init` until its first finish; then the first finished output; then
    (pred * (window - 1) + actual) / window at every finish). A request's first admission fixes
    its prediction p and charges wp * prefill / w + wq * p / w; a re-admission after a preemption
    charges wp * prefill / w only. Each iteration a sequence that ran is charged wq / w if its
    token count (the token just emitted included) exceeds p. Then the iteration's finishes, in
    table order: with actual < p the tenant gets wq * (p - actual) / w back, then its prediction
    is updated."""

    def __init__(self, sim, wp=1.0, wq=2.0, weights=None, window=5, init=0.0):
        super().__init__(sim, "vtc", wp=wp, wq=wq, weights=weights)
        self.window = int(window)
        if self.window < 1:
            raise ValueError("vtc_predict window must be >= 1")
        self.prediction = [float(init)] * sim.n_tenants
        self.has_finished = [False] * sim.n_tenants
        self.p = {}        # request -> its prediction, fixed at its first admission
        self.tokens = {}   # request -> tokens emitted so far

    def admit(self, i, prefill_tokens):
        u = self.sim.tenant[i]
        assert self.lines[u][0] == i
        heapq.heappop(self.lines[u])
        w = self.weights[u]
        if i not in self.p:
            self.p[i] = self.prediction[u]
            self.tokens[i] = 0
            self.counter[u] += self.wp * prefill_tokens / w + self.wq * self.p[i] / w
        else:
            self.counter[u] += self.wp * prefill_tokens / w

    def end_iteration(self, ran, per_seq, finished):
        for i in ran:
            self.tokens[i] += 1
            if self.tokens[i] > self.p[i]:
                u = self.sim.tenant[i]
                self.counter[u] += self.wq / self.weights[u]
        for i in sorted(finished):  # the iteration's finishes in table order
            u = self.sim.tenant[i]
            actual = self.tokens[i]
            if actual < self.p[i]:
                self.counter[u] -= self.wq * (self.p[i] - actual) / self.weights[u]
            if not self.has_finished[u]:
                self.prediction[u] = float(actual)
                self.has_finished[u] = True
            else:
                self.prediction[u] = (self.prediction[u] * (self.window - 1) + actual) / self.window


class _TokenPool(_Policy):
    """token_pool (fairlib/pools.py's rules, written again from its docstring): per-tenant FIFO
    lines; admission by reserved work over the horizon (within the entitlement, else the pool's
    headroom less the active tenants' unused entitlements), dispatch by class weight + SLO
    urgency + clipped debt among the heads the guaranteed tenants' unused slots and KV allow,
    every charge counted as service, debt accrual while in demand (waiting, or refused within H)
    and decay with the half-life otherwise."""

    K = {"guaranteed": 10.0, "elastic": 3.0, "spot": 0.0}

    def __init__(self, sim, classes, shares, decode_price_ms, replica_slots, slo_ms=None, prefill_price_ms=0.0,
                 pool_horizon_ms=5000.0, half_life_ms=10000.0, replicas=1, kv_tokens=None, debt_weight=1.0,
                 guaranteed_headroom=None):
        super().__init__(sim)
        n = sim.n_tenants
        if sim.est is None:
            raise ValueError("token_pool needs an `est_output_tokens` column")
        self.cls, self.e = list(classes), [float(x) for x in shares]
        self.slo = [math.inf] * n if slo_ms is None else [math.inf if x is None else float(x) for x in slo_ms]
        self.beta = float(debt_weight)
        self.headroom = math.inf if guaranteed_headroom is None else float(guaranteed_headroom)
        self.u, self.p, self.H, self.h = float(decode_price_ms), float(prefill_price_ms), float(pool_horizon_ms), \
            float(half_life_ms)
        self.R, self.slots = float(replicas), float(replica_slots)
        self.kv = math.inf if kv_tokens is None else float(kv_tokens)
        self.Q, self.d, self.S = [0.0] * n, [0.0] * n, [0.0] * n
        self.open = [0] * n        # reservations not yet ended
        self.last = [-math.inf] * n
        self.refused = [-math.inf] * n
        self.rest = {}
        self.t_last = 0.0
        self.lines = [[] for _ in range(n)]

    def push(self, i):
        heapq.heappush(self.lines[self.sim.tenant[i]], i)

    def _advance(self, t):
        dt = t - self.t_last
        if dt > 0:
            for u in range(self.sim.n_tenants):
                if self.cls[u] != "spot":
                    if self.lines[u] or self.t_last - self.refused[u] <= self.H:
                        self.d[u] += self.e[u] * self.R * dt - self.S[u]
                    else:
                        self.d[u] *= 0.5 ** (dt / self.h)
                self.S[u] = 0.0
            self.t_last = t

    def arrive(self, i, t):
        self._advance(t)
        u = self.sim.tenant[i]
        c = self.p * self.sim.prompt[i] + self.u * self.sim.est[i]
        rh = self.R * self.H
        if c > rh or self.sim.prompt[i] + self.sim.est[i] > self.kv * self.R:
            return False                     # larger than the whole pool
        ok = self.cls[u] != "spot" and self.Q[u] + c <= self.e[u] * rh
        if not ok:
            w = sum(self.Q)
            a = 0.0
            for j in range(self.sim.n_tenants):
                active = self.open[j] > 0 or self.sim.running_per_tenant().get(j, 0) > 0 or \
                    t - self.last[j] <= self.H
                if j != u and self.cls[j] != "spot" and active:
                    a += max(0.0, self.e[j] * rh - self.Q[j])
            ok = w + c <= rh - a
            if not ok:
                self.refused[u] = t
        if ok:
            self.rest[i] = c
            self.Q[u] += c
            self.open[u] += 1
            self.last[u] = t
            self.push(i)
        return ok

    def select(self, t):
        self._advance(t)
        run = self.sim.running_ids()
        n_slots, kv_tot = self.slots * self.R, self.kv * self.R
        per = self.sim.running_per_tenant()
        kv_of = lambda seqs: sum(self.sim.prompt[j] + self.sim.est[j] for j in seqs)  # noqa: E731
        best, best_key = None, None
        for u in range(self.sim.n_tenants):
            if not self.lines[u]:
                continue
            r = self.lines[u][0]
            mine = math.ceil(self.e[u] * n_slots - 1e-9)
            ok = self.cls[u] == "guaranteed" and per.get(u, 0) < mine
            if not ok:
                g_slots = g_kv = 0.0
                for g in range(self.sim.n_tenants):
                    if g != u and self.cls[g] == "guaranteed":
                        g_slots += max(0, math.ceil(self.e[g] * n_slots - 1e-9) - per.get(g, 0))
                        g_kv += max(0.0, self.e[g] * kv_tot - kv_of([j for j in run if self.sim.tenant[j] == g]))
                need = self.sim.prompt[r] + self.sim.est[r]
                g_slots = min(g_slots, self.headroom)
                g_slots = min(g_slots, n_slots - 1.0)     # an otherwise idle pool always runs it
                g_kv = min(g_kv, kv_tot - need)
                ok = len(run) + 1 + g_slots <= n_slots and kv_of(run) + need + g_kv <= kv_tot
            if not ok:
                continue
            w = self.K[self.cls[u]] + min(1.0, max(0.0, (t - self.sim.arrival[r]) / self.slo[u]))
            if self.cls[u] != "spot" and self.e[u] > 0:
                w += self.beta * min(1.0, max(-1.0, self.d[u] / (self.e[u] * self.h)))
            key = (-w, r)
            if best_key is None or key < best_key:
                best, best_key = r, key
        return best

    def _settle(self, i, x):
        u = self.sim.tenant[i]
        y = max(0.0, min(x, self.rest[i]))
        self.rest[i] -= y
        self.S[u] += x

    def admit(self, i, prefill_tokens):
        u = self.sim.tenant[i]
        assert self.lines[u][0] == i
        heapq.heappop(self.lines[u])
        if self.sim.preemptions[i] == 0:          # its first admission: the reservation leaves the queue
            self.open[u] -= 1
            self.Q[u] = max(0.0, self.Q[u] - self.rest[i]) if self.open[u] > 0 else 0.0
        self._settle(i, self.sim.prefill_ms_per_token * prefill_tokens)

    def end_iteration(self, ran, per_seq, finished):
        done = set(finished)
        for i in ran:
            if per_seq > 0:
                self._settle(i, per_seq)
            if i in done:
                self.rest[i] = 0.0


def _make_policy(sim, policy, params):
    def take(*names):
        unknown = set(params) - set(names)
        if unknown:
            raise TypeError(f"unknown parameters for {policy!r}: {sorted(unknown)}")
        return {k: params[k] for k in names if k in params}

    if policy == "fcfs":
        take()
        return _FCFS(sim)
    if policy == "rpm_quota":
        p = take("limit")
        return _RpmQuota(sim, p["limit"])
    if policy in ("vtc", "lcf"):
        return _Counter(sim, policy, **take("wp", "wq", "weights"))
    if policy == "residency":
        return _Counter(sim, "residency", **take("weights"))
    if policy == "slot_cap":
        return _SlotCap(sim, take("cap")["cap"])
    if policy == "priority":
        take()
        keys = sim.priority if sim.priority is not None else sim.klass
        if keys is None:
            raise ValueError("priority needs a `priority` or `klass` column")
        return _KeyHeap(sim, keys)
    if policy == "weighted":
        return _Weighted(sim, take("w")["w"])
    if policy == "sjf":
        take()
        if sim.est is None:
            raise ValueError("sjf needs an `est_output_tokens` column")
        return _KeyHeap(sim, sim.est)
    if policy == "aging":
        return _Aging(sim, take("rate")["rate"])
    if policy == "rr":
        take()
        return _RoundRobin(sim)
    if policy == "vtc_predict":
        return _VTCPredict(sim, **take("wp", "wq", "weights", "window", "init"))
    if policy == "token_pool":
        return _TokenPool(sim, **take("classes", "shares", "decode_price_ms", "replica_slots", "slo_ms",
                                      "prefill_price_ms", "pool_horizon_ms", "half_life_ms", "replicas", "kv_tokens",
                                      "debt_weight", "guaranteed_headroom"))
    raise ValueError(f"unknown policy {policy!r}")


# --------------------------------------------------------------------------------------
# The engine.
# --------------------------------------------------------------------------------------


class _Sim:
    pass


def reference_simulate(requests, *, n_tenants, iter_base_ms, iter_slope_ms, prefill_ms_per_token,
                       max_batch, max_prefill_tokens=None, kv_capacity_tokens=None,
                       policy="fcfs", horizon_ms=float("inf"), batching="continuous", fill_wait_ms=10.0,
                       **params):
    """requests: a pandas DataFrame (or dict of lists) with columns arrival_ms, tenant, prompt_tokens,
    output_tokens and optionally est_output_tokens, klass, priority (already sorted by arrival, table order = row order).
    Returns (req, ten, run):
      req: dict of lists, one entry per request in table order: rejected (bool), admitted_ms, first_token_ms,
           finish_ms (float, NaN when it did not happen), generated (int), charged_ms (float), preemptions (int)
      ten: dict of lists, one entry per tenant 0..n_tenants-1: machine_ms, prefill_ms, decode_ms, decode_tokens,
           requests_admitted, requests_finished, requests_rejected, share (machine_ms / total; NaN if total is 0)
      run: dict with busy_ms, iterations, decode_tokens
    batching="static": the batch-synchronous worker (book/engine-model.md): nothing joins a running
    batch; a free worker with requests waiting takes up to max_batch of them, waiting up to
    fill_wait_ms from when it first saw one waiting for more to arrive.
    """
    sim = _Sim()
    sim.n_tenants = n_tenants = int(n_tenants)
    sim.arrival = arrival = _column(requests, "arrival_ms", float)
    sim.tenant = tenant = _column(requests, "tenant", int)
    prompt = _column(requests, "prompt_tokens", int)
    output = _column(requests, "output_tokens", int)
    sim.est = _column(requests, "est_output_tokens", int)
    sim.klass = _column(requests, "klass", int)
    sim.priority = _column(requests, "priority", int)
    sim.prefill_ms_per_token = prefill_ms_per_token = float(prefill_ms_per_token)
    iter_base_ms = float(iter_base_ms)
    iter_slope_ms = float(iter_slope_ms)
    max_batch = int(max_batch)
    horizon_ms = float(horizon_ms)
    N = len(arrival)
    for i in range(1, N):
        if arrival[i] < arrival[i - 1]:
            raise ValueError("requests must be sorted by arrival_ms")

    # per-request state
    rejected = [False] * N
    admitted_ms = [NAN] * N
    first_token_ms = [NAN] * N
    finish_ms = [NAN] * N
    generated = [0] * N
    charged_ms = [0.0] * N
    preemptions = [0] * N
    entry_iter = [-1] * N  # iteration of the most recent admission

    # per-tenant state
    machine_ms = [0.0] * n_tenants
    prefill_ms = [0.0] * n_tenants
    decode_ms = [0.0] * n_tenants
    decode_tokens = [0] * n_tenants
    n_admitted = [0] * n_tenants
    n_finished = [0] * n_tenants
    n_rejected = [0] * n_tenants

    running = []  # table positions of running sequences
    waiting = 0   # requests in the policy's lines
    fill_start = None

    def running_per_tenant():
        counts = {}
        for j in running:
            counts[tenant[j]] = counts.get(tenant[j], 0) + 1
        return counts

    sim.running_per_tenant = running_per_tenant
    sim.running_ids = lambda: list(running)
    sim.preemptions = preemptions
    sim.prompt = prompt

    def need(seqs):
        return sum(prompt[j] + generated[j] + 1 for j in seqs)

    pol = _make_policy(sim, policy, params)

    t = 0.0
    next_arrival = 0
    iteration = 0
    busy_ms = 0.0
    run_tokens = 0

    while t < horizon_ms:
        # 1. arrivals
        while next_arrival < N and arrival[next_arrival] <= t:
            i = next_arrival
            next_arrival += 1
            impossible = (
                (max_prefill_tokens is not None and prompt[i] > max_prefill_tokens)
                or (kv_capacity_tokens is not None and prompt[i] + output[i] > kv_capacity_tokens)
            )
            if impossible or not pol.arrive(i, t):
                rejected[i] = True
                n_rejected[tenant[i]] += 1
            else:
                waiting += 1

        # 2. preemption
        held = []
        if kv_capacity_tokens is not None:
            while running and need(running) > kv_capacity_tokens:
                victim = max(running, key=lambda j: (entry_iter[j], j))
                k = running.index(victim)       # the batch's last entry takes its place (the order
                running[k] = running[-1]        # a policy sees the batch in: token_pool settles in it)
                running.pop()
                preemptions[victim] += 1
                held.append(victim)

        # 3. admission (static batches: only a free worker, once it has max_batch or waited enough)
        P = 0
        admitted = []  # (position, prefill tokens)
        may_admit = True
        if batching == "static":
            may_admit = not running and waiting > 0
            if may_admit:
                if fill_start is None:
                    fill_start = t
                deadline = fill_start + fill_wait_ms
                if waiting < max_batch and t < deadline:
                    if next_arrival < N and arrival[next_arrival] < deadline:
                        deadline = arrival[next_arrival]
                    t = min(deadline, horizon_ms)
                    continue
                fill_start = None
        while may_admit and len(running) < max_batch:
            i = pol.select(t)
            if i is None:
                break
            pf = prompt[i] + generated[i]
            if max_prefill_tokens is not None and P + pf > max_prefill_tokens:
                break
            if kv_capacity_tokens is not None and need(running) + pf + 1 > kv_capacity_tokens:
                break
            pol.admit(i, pf)
            waiting -= 1
            if math.isnan(admitted_ms[i]):
                admitted_ms[i] = t
                n_admitted[tenant[i]] += 1
            entry_iter[i] = iteration
            running.append(i)
            admitted.append((i, pf))
            P += pf

        # 4. idle
        if not running:
            for j in sorted(held):  # cannot happen (one sequence always fits), kept for safety
                pol.requeue(j)
                waiting += 1
            if next_arrival < N:
                t = arrival[next_arrival]
                continue
            break

        # 5. cost
        B = len(running)
        dt = iter_base_ms + iter_slope_ms * B + prefill_ms_per_token * P
        per_seq = (iter_base_ms + iter_slope_ms * B) / B

        # 6. charges
        for i, pf in admitted:
            c = prefill_ms_per_token * pf
            u = tenant[i]
            charged_ms[i] += c
            prefill_ms[u] += c
            machine_ms[u] += c
        for i in running:
            u = tenant[i]
            charged_ms[i] += per_seq
            decode_ms[u] += per_seq
            machine_ms[u] += per_seq

        # 7. tokens
        t = t + dt
        busy_ms += dt
        iteration += 1
        finished = []
        for i in running:
            generated[i] += 1
            decode_tokens[tenant[i]] += 1
            run_tokens += 1
            if math.isnan(first_token_ms[i]):
                first_token_ms[i] = t
            if generated[i] >= output[i]:
                finish_ms[i] = t
                n_finished[tenant[i]] += 1
                finished.append(i)

        # 8. bookkeeping, then the preempted go back
        ran = list(running)
        pol.end_iteration(ran, per_seq, finished)
        done = set(finished)
        running = [j for j in running if j not in done]
        for j in sorted(held):
            pol.requeue(j)
            waiting += 1

    total = sum(machine_ms)
    share = [m / total if total > 0 else NAN for m in machine_ms]
    req = {
        "rejected": rejected,
        "admitted_ms": admitted_ms,
        "first_token_ms": first_token_ms,
        "finish_ms": finish_ms,
        "generated": generated,
        "charged_ms": charged_ms,
        "preemptions": preemptions,
    }
    ten = {
        "machine_ms": machine_ms,
        "prefill_ms": prefill_ms,
        "decode_ms": decode_ms,
        "decode_tokens": decode_tokens,
        "requests_admitted": n_admitted,
        "requests_finished": n_finished,
        "requests_rejected": n_rejected,
        "share": share,
    }
    run = {"busy_ms": busy_ms, "iterations": iteration, "decode_tokens": run_tokens}
    return req, ten, run
