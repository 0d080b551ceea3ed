"""Test-session set-up shared by every test file.

SIGTERM (CI cancellation, `timeout`, `docker stop`) ends the session as Ctrl-C does: Python's
default for SIGTERM is to die at once, skipping the fixtures' teardown, which leaves engine
servers and papermill children running (and still sending requests). As KeyboardInterrupt, pytest
stops, tears the fixtures down (engines stopped with their process groups) and `subprocess.run`
kills the child it waits on.

Also here: the work units of ``pytest -n N`` (tests/xdist_units.py), the real engines started
once per session (:func:`engines`), and under ``CI=true`` a skipped ``engine`` test reported as
a failure (tests/ci.py). Every gateway the tests start (in process or as a child) validates
each decode step it hands the policy (``FAIRLIB_CHECK_STEPS=1``: off in production, where the
step tracker builds them well formed).
"""
import os
import signal

import pytest

from ci import in_ci


os.environ["FAIRLIB_CHECK_STEPS"] = "1"


def _sigterm(signum, frame):
    raise KeyboardInterrupt(f"SIGTERM ({signum})")


def pytest_configure(config):
    signal.signal(signal.SIGTERM, _sigterm)
    # A session started as a background job (``make test &`` in a shell without job control, a CI
    # runner's step) begins with SIGINT ignored, and every child inherits that: the servers the
    # tests interrupt with SIGINT, to check a foreground command's Ctrl-C, then ignore it (they ran
    # on and a test waited 60 s for nothing). The session takes SIGINT back; a test that wants a
    # background job's disposition sets it in its child (test_fit_endpoint.py). The price: such a
    # session now stops on a Ctrl-C meant for the foreground command, as a foreground one would.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(optionalhook=True)      # a hook of pytest-xdist's: absent under -p no:xdist
def pytest_xdist_make_scheduler(config, log):
    from xdist_units import FileUnits
    return FileUnits(config, log)


def pytest_collection_modifyitems(config, items):
    """Mark ``timing`` the tests in tests/xdist_units.py's TIMING_TESTS, and run the ``engine``
    tests last (stable): an engine started for the session idles beside the timing tests otherwise."""
    from xdist_units import is_timing
    for item in items:
        if is_timing(item.nodeid):
            item.add_marker(pytest.mark.timing)
    items.sort(key=lambda item: item.get_closest_marker("engine") is not None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI, an ``engine`` test that skipped (any cause) fails: CI must not be green with
    the real engines unmeasured."""
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and in_ci() and item.get_closest_marker("engine") is not None and not hasattr(rep, "wasxfail"):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"an engine test skipped under CI=true: {reason}"


@pytest.fixture(scope="session")
def engines():
    """``engines(kind)``: the real engine ``kind`` started as the book starts it
    (``fairlib.calibrate.fit.start``), once per session and shared by every test that asks (vLLM
    takes 60-90 s to start on 2 cores). At the end each is stopped and checked gone: nothing left
    in its process group, its port free."""
    from fairlib.calibrate.lifecycle import group_members, port_is_free
    from ci import start_engine_or_fail
    started: dict = {}

    def get(kind: str):
        if kind not in started:
            started[kind] = start_engine_or_fail(kind)
        return started[kind]

    yield get
    left = {}
    for kind, eng in started.items():
        pgid, port = eng.pid, eng.port
        eng.stop()
        if group_members(pgid) or not port_is_free(port):
            left[kind] = {"processes": group_members(pgid), "port_free": port_is_free(port)}
    assert not left, f"engines not gone after stop: {left}"
