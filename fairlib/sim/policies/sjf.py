"""sjf: the lowest `est_output_tokens` first, ties by arrival; no starvation guard.
One line ordered by the estimate (key = est_output_tokens)."""
import numpy as np

from fairlib.sim.policies.base import Policy
from fairlib.sim.policies.fcfs import select  # noqa: F401  (the head of the single line)

PID = 8


class SJF(Policy):
    name, pid = "sjf", PID
    needs = ("est_output_tokens",)

    def lines(self, rows, tenant, klass, priority, est, n_tenants, n_classes=None, priority_levels=None):
        return np.zeros(len(rows), np.int64), np.asarray(est, np.float64), 1
