"""lcf: least counter first, i.e. vtc without the counter lift (fairlib/sim/policies/vtc.py)."""
from fairlib.sim.policies.vtc import PID_LCF, VTC


class LCF(VTC):
    name, pid = "lcf", PID_LCF
    lift = 0
