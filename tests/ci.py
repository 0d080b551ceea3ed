"""What the test suite does differently under CI (``CI=true``, as CI sets it).

A real-engine test that cannot run must not pass CI as a skip: under ``CI=true``
:func:`require_engine` fails where it would skip locally (an engine that is set up but does not
start raises ``EngineStartError`` with its log tail either way), and tests/conftest.py turns any
other skip of an ``engine`` test into a failure.
"""
from __future__ import annotations

import contextlib
import os

import pytest

__all__ = ["in_ci", "require_engine", "start_engine_or_fail", "engine_cpus", "placement", "beside"]

#: engines confined to one CPU when started for the tests, the rest of the machine left to the
#: client, the gateway and the test itself (:func:`beside`). vLLM-CPU spread over both CPUs of the
#: 2-vCPU test machine stalled every other process for 0.3-4.6 s at a time under load (whatever its
#: priority: fairlib.calibrate.processes.split_cpus), so the client's schedule lag made the live
#: runs invalid (fresh clone, 2026-12-07: chapter 8 0 of 5 valid with p99 lag 0.3-1.2 s after two
#: retries; chapters 1-4 16 min of retries). llama.cpp (one thread, no busy poll) never did.
CONFINED = ("vllm",)


def in_ci() -> bool:
    """``CI`` set to a true value (``true``, ``1``, ``yes``)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def require_engine(kind: str) -> None:
    """Skip (locally) or fail (CI) with the reason when ``kind`` is not set up here."""
    from fairlib.calibrate.lifecycle import engine_available
    ok, why = engine_available(kind)
    if ok:
        return
    if in_ci():
        pytest.fail(f"{kind} engine not set up under CI=true: {why}", pytrace=False)
    pytest.skip(f"{kind} engine not set up: {why}")


def engine_cpus(kind: str):
    """``(engine's CPUs, the others)`` for a :data:`CONFINED` engine on a machine with two CPUs or
    more, else ``(None, None)``."""
    from fairlib.calibrate.processes import split_cpus
    split = split_cpus() if kind in CONFINED else None
    return split if split is not None else (None, None)


def placement(kind: str) -> dict:
    """``start_engine``'s placement flags for ``kind``: a :data:`CONFINED` engine's compute on its
    CPU (vLLM's OpenMP threads bound to it too: its flag names CPUs, not a share), its HTTP server
    on the others; nothing for the rest."""
    cpus, rest = engine_cpus(kind)
    if cpus is None:
        return {}
    out = {"cpus": cpus, "front_cpus": rest}
    if kind == "vllm":
        out["omp_threads_bind"] = ",".join(str(c) for c in sorted(cpus))
    return out


@contextlib.contextmanager
def beside(kind: str):
    """This thread (and the processes and threads it starts meanwhile: papermill, its kernel, a
    gateway, the client) on the CPUs a :data:`CONFINED` engine ``kind`` is not on; restored after."""
    _, rest = engine_cpus(kind)
    before = os.sched_getaffinity(0) if rest else None
    if rest:
        os.sched_setaffinity(0, rest)
    try:
        yield
    finally:
        if before is not None:
            os.sched_setaffinity(0, before)


def start_engine_or_fail(kind: str, **overrides):
    """``fairlib.calibrate.fit.start(kind)`` after :func:`require_engine`, a :data:`CONFINED`
    engine's compute on its own CPU and its HTTP server, once up, on the others with the client
    (:func:`engine_cpus`); a start that fails fails the test with the
    engine's log tail (``EngineStartError`` carries it), never skips it."""
    from fairlib.calibrate import fit
    from fairlib.calibrate.lifecycle import EngineStartError
    require_engine(kind)
    overrides = {**placement(kind), **overrides}
    try:
        return fit.start(kind, **overrides)
    except EngineStartError as e:
        pytest.fail(f"{kind} engine did not start:\n{e}", pytrace=False)
