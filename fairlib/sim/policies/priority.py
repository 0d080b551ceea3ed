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

    allowed = None

    def online_lines(self, n_tenants, n_classes, priority_levels):
        self.allowed = np.unique(np.asarray(list(priority_levels), np.int64))
        return 1

    def lines(self, rows, tenant, klass, priority, est, n_tenants):
        values = np.asarray(priority if priority is not None else klass, np.int64)
        if self.allowed is not None and len(values) and not np.isin(values, self.allowed).all():
            raise ValueError(f"policy {self.name!r}: priority must be one of {self.allowed.min()}..{self.allowed.max()}, "
                             f"got {values[~np.isin(values, self.allowed)][0]}")
        return np.zeros(len(values), np.int64), values.astype(np.float64), 1
