"""fcfs: first come, first served, in global arrival order (one line)."""

from fairlib.sim import jit
from fairlib.sim.policies.base import Policy

PID = 0


@jit.inline
def select(pf, pi, RF, RI, TI, BT, heap, heap_n, t):
    return 0 if heap_n[0] > 0 else -1


class FCFS(Policy):
    name, pid = "fcfs", PID
