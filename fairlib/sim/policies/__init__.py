"""Scheduling policies: each one a small module; `make_policy(name, **params)` builds one."""
import json

from fairlib.sim.policies.aging import Aging
from fairlib.sim.policies.base import Policy
from fairlib.sim.policies.fcfs import FCFS
from fairlib.sim.policies.lcf import LCF
from fairlib.sim.policies.priority import Priority
from fairlib.sim.policies.residency import Residency
from fairlib.sim.policies.rpm_quota import RpmQuota
from fairlib.sim.policies.rr import RoundRobin
from fairlib.sim.policies.sjf import SJF
from fairlib.sim.policies.slot_cap import SlotCap
from fairlib.sim.policies.token_pool import TokenPool
from fairlib.sim.policies.vtc import VTC
from fairlib.sim.policies.vtc_predict import VTCPredict
from fairlib.sim.policies.weighted import Weighted

POLICIES = {cls.name: cls for cls in (FCFS, RpmQuota, VTC, LCF, Residency, SlotCap, Priority, Weighted, SJF, Aging,
                                        RoundRobin, VTCPredict, TokenPool)}

__all__ = ["POLICIES", "Policy", "make_policy", "parse_policy_param"]


def make_policy(policy, **params) -> Policy:
    """A policy object from its name and parameters (or the object itself, unchanged).

    Parameters
    ----------
    policy : str or Policy
        A name in :data:`POLICIES` (``fcfs``, ``rpm_quota``, ``vtc``, ``lcf``, ``residency``,
        ``slot_cap``, ``priority``, ``weighted``, ``sjf``, ``aging``, ``rr``, ``vtc_predict``,
        ``token_pool``), or a :class:`Policy`, returned as it is.
    **params
        The named policy's parameters (its class's ``params``: name -> default, ``None`` =
        required); none with a Policy object.

    Returns
    -------
    Policy
        The policy, its parameters validated (``Policy.values``).

    Raises
    ------
    ValueError
        An unknown name (the known ones listed), parameters given with a Policy object, an
        unknown, missing or out-of-range parameter (naming it).
    """
    if isinstance(policy, Policy):
        if params:
            raise ValueError("policy: pass parameters either to the policy object or to simulate(), not both")
        return policy
    if not isinstance(policy, str) or policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
    return POLICIES[policy](**params)


def parse_policy_param(text: str) -> tuple:
    """``"NAME=VALUE"`` (a ``--policy-param``) as ``(name, value)``; the value read as JSON when it
    parses (numbers, lists, true/false), else kept as text."""
    if "=" not in text:
        raise ValueError(f"--policy-param takes NAME=VALUE, got {text!r}")
    k, v = text.split("=", 1)
    try:
        val = json.loads(v)
    except ValueError:
        val = v
    return k.strip(), val
