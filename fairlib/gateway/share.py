"""Each tenant's share of the slots: no tenant holds more than ``cap`` of them, under any policy.

A policy that charges by tokens (vtc, residency, ...) keeps admitting a tenant whose streams
stall (a client that stops reading, an answer that never comes): they cost it nothing while they
hold their slots, so one such tenant can take every slot and the others wait (the fault
harness: the other tenant's TTFT 4.26 s under ``vtc``, 0.01 s under ``slot_cap``). So when the
policy admits a request of a tenant that already has ``cap`` requests in the upstreams, the
gateway parks it: the policy counts it as running (its order, admission control and charges are
untouched; nothing is charged until tokens flow), the gateway opens one more slot to the policy
for each parked request (so the free upstream slot goes to someone else), and dispatches the
parked request, in admission order, as soon as one of its tenant's requests leaves an upstream.
``cap = max(1, min(slots - 1, floor(share x slots)))`` (``--tenant-max-share``, default 0.9; 1,
or a single slot: no cap) always leaves a slot for the others when there are two or more.
"""
from __future__ import annotations

import math
from collections import defaultdict, deque
from typing import Optional

__all__ = ["TenantShare", "share_cap", "NO_CAP"]

NO_CAP = 1 << 62


def share_cap(share: float, slots: int) -> int:
    """The most upstream slots one tenant may hold: ``max(1, min(slots - 1, floor(share x
    slots)))``; ``share >= 1`` or a single slot: no cap (:data:`NO_CAP`)."""
    if share >= 1 or slots < 2:
        return NO_CAP
    return max(1, min(int(slots) - 1, math.floor(share * slots)))


class TenantShare:
    """Each tenant's requests in the upstreams, and the admitted ones parked until it has room."""

    def __init__(self, cap: int):
        self.cap = int(cap)
        self.running: dict = defaultdict(int)     # tenant -> requests holding an upstream slot
        self.rid_tenant: dict = {}
        self.parked: dict = {}                    # tenant -> deque of Pending (admitted, not sent)
        self.n_parked = 0

    def full(self, tenant: int) -> bool:
        """``tenant`` holds its share: a request admitted now is parked."""
        return self.running[tenant] >= self.cap

    def sent(self, rid: int, tenant: int) -> None:
        self.running[tenant] += 1
        self.rid_tenant[rid] = tenant

    def freed(self, rid: int) -> None:
        """Request ``rid`` left its upstream slot (its stream ended, failed, or was never sent)."""
        t = self.rid_tenant.pop(rid, None)
        if t is not None:
            self.running[t] -= 1

    def park(self, p) -> None:
        self.parked.setdefault(p.tenant, deque()).append(p)
        self.n_parked += 1

    def ready(self) -> list:
        """Parked requests whose tenant has room now, in admission order per tenant (taken out)."""
        out = []
        for t in [t for t in self.parked if self.running[t] + 0 < self.cap]:
            q = self.parked[t]
            room = self.cap - self.running[t]
            while q and room > 0:
                p = q.popleft()
                self.n_parked -= 1
                if not p.future.done():
                    out.append(p)
                    room -= 1
            if not q:
                del self.parked[t]
        return out

    def unpark(self, p) -> bool:
        """A parked request leaves (its client went, it timed out): True if it was parked."""
        q = self.parked.get(p.tenant)
        if q and p in q:
            q.remove(p)
            self.n_parked -= 1
            if not q:
                del self.parked[p.tenant]
            return True
        return False

    def back(self, p) -> None:
        """A request taken by :meth:`ready` that found no free upstream slot: first in line again."""
        self.parked.setdefault(p.tenant, deque()).appendleft(p)
        self.n_parked += 1

    def count(self, tenant: Optional[int] = None) -> int:
        return self.n_parked if tenant is None else len(self.parked.get(tenant, ()))
