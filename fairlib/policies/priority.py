"""priority: the lowest `priority` value first (lower is served earlier, as in vLLM), FCFS within.
Uses the `priority` column, or `klass` when there is none. Lines are the priority values' ranks."""
import numba as nb
import numpy as np

from .base import Policy

PID = 6


@nb.njit(cache=True, inline="always")
def select(pf, pi, RF, RI, TI, BT, heap, heap_n, t):
    for j in range(heap_n.shape[0]):
        if heap_n[j] > 0:
            return j
    return -1


class Priority(Policy):
    name, pid = "priority", PID
    needs = ("priority",)

    def lines(self, rows, tenant, klass, priority, est, n_tenants):
        values = np.asarray(priority if priority is not None else klass, np.int64)
        self.levels = np.unique(values)
        return np.searchsorted(self.levels, values).astype(np.int64), np.asarray(rows, np.float64), len(self.levels)
