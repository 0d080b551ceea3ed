"""Scheduling policies: each one a small module; `make_policy(name, **params)` builds one."""
from .aging import Aging
from .base import Policy
from .fcfs import FCFS
from .lcf import LCF
from .priority import Priority
from .residency import Residency
from .rpm_quota import RpmQuota
from .rr import RoundRobin
from .sjf import SJF
from .slot_cap import SlotCap
from .vtc import VTC
from .vtc_predict import VTCPredict
from .weighted import Weighted

POLICIES = {cls.name: cls for cls in (FCFS, RpmQuota, VTC, LCF, Residency, SlotCap, Priority, Weighted, SJF, Aging,
                                        RoundRobin, VTCPredict)}

__all__ = ["POLICIES", "Policy", "make_policy"]


def make_policy(policy, **params) -> Policy:
    """A policy object from its name and parameters (or the object itself, unchanged)."""
    if isinstance(policy, Policy):
        if params:
            raise ValueError("policy: pass parameters either to the policy object or to simulate(), not both")
        return policy
    if not isinstance(policy, str) or policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
    return POLICIES[policy](**params)
