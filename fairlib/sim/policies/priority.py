"""priority: the lowest `priority` value first (lower is served earlier, as in vLLM), FCFS within.
Uses the `priority` column, or `klass` when there is none. One line ordered by (priority, arrival):
its head is the next request, whatever the number of distinct priorities."""
import numpy as np

from fairlib.sim.policies.base import Policy
from fairlib.sim.policies.fcfs import select  # noqa: F401  (the head of the single line)

PID = 6


class Priority(Policy):
    name, pid = "priority", PID
    needs = ("priority",)

    def lines(self, rows, tenant, klass, priority, est, n_tenants, n_classes=None, priority_levels=None):
        values = np.asarray(priority if priority is not None else klass, np.int64)
        if priority_levels is not None and len(values):
            bad = values[~np.isin(values, priority_levels)]
            if len(bad):
                raise ValueError(f"policy {self.name!r}: priority must be one of "
                                 f"{priority_levels.min()}..{priority_levels.max()}, got {bad[0]}")
        return np.zeros(len(values), np.int64), values.astype(np.float64), 1
