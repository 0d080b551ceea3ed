"""The compiled loop calls only hooks that some policy implements (fairlib/sim/policies/dispatch.py):
a routed hook no policy has is a dead call on the per-request or per-iteration path, and a policy
hook the dispatcher does not route silently never runs."""
import ast
from pathlib import Path

import fairlib.sim.loop as loop
import fairlib.sim.observed as observed
import fairlib.sim.policies.dispatch as dispatch

POLICY_DIR = Path(dispatch.__file__).parent


def functions(path):
    """Names of the top-level functions defined in a module's source."""
    return {n.name for n in ast.parse(Path(path).read_text()).body if isinstance(n, ast.FunctionDef)}


def calls(path, owner):
    """Names called as ``owner.NAME(...)`` in a module's source."""
    return {n.func.attr for n in ast.walk(ast.parse(Path(path).read_text()))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Name) and n.func.value.id == owner}


HOOKS = functions(dispatch.__file__)
MODULES = {p.stem: functions(p) for p in POLICY_DIR.glob("*.py") if p.stem not in ("__init__", "dispatch", "base")}


def test_the_loop_calls_exactly_the_dispatched_hooks():
    """The engine loop calls four; a gateway (observed.py) also tells a policy of a withdrawal and
    of its clock (token_pool); together they call every routed hook."""
    assert calls(loop.__file__, "dispatch") == {"accept", "select", "on_admit", "on_iteration"}
    assert calls(observed.__file__, "dispatch") == {"on_iteration", "on_withdraw", "on_clock"}
    assert calls(loop.__file__, "dispatch") | calls(observed.__file__, "dispatch") == HOOKS


def test_every_dispatched_hook_is_implemented_by_a_policy():
    for hook in HOOKS:
        assert any(hook in defined for defined in MODULES.values()), f"dispatch.{hook}: no policy implements it"


def test_every_policy_hook_is_dispatched():
    for module, defined in MODULES.items():
        routed = calls(dispatch.__file__, module)
        for hook in defined & HOOKS:
            assert hook in routed, f"{module}.{hook} is never called by dispatch.{hook}"
