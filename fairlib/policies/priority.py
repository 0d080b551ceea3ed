"""priority: the lowest `priority` value first (lower is served earlier, as in vLLM), FCFS within.
Uses the `priority` column, or `klass` when there is none. Lines are the priority values' ranks."""
import numpy as np

from ..sim import jit
from .base import Policy

PID = 6


@jit.inline
def select(pf, pi, RF, RI, TI, BT, heap, heap_n, t):
    for j in range(heap_n.shape[0]):
        if heap_n[j] > 0:
            return j
    return -1


class Priority(Policy):
    name, pid = "priority", PID
    needs = ("priority",)

    fixed_levels = None

    def online_lines(self, n_tenants, n_classes, priority_levels):
        self.fixed_levels = np.unique(np.asarray(list(priority_levels), np.int64))
        return len(self.fixed_levels)

    def lines(self, rows, tenant, klass, priority, est, n_tenants):
        values = np.asarray(priority if priority is not None else klass, np.int64)
        levels = self.fixed_levels if self.fixed_levels is not None else np.unique(values)
        line = np.searchsorted(levels, values).astype(np.int64)
        if len(values) and (line.max() >= len(levels) or np.any(levels[np.minimum(line, len(levels) - 1)] != values)):
            raise ValueError(f"policy {self.name!r}: priority must be one of {levels.min()}..{levels.max()}, got "
                             f"{values[~np.isin(values, levels)][0]}")
        return line, np.asarray(rows, np.float64), len(levels)
