"""Test-session set-up shared by every test file.

SIGTERM (CI cancellation, `timeout`, `docker stop`) ends the session as Ctrl-C does: Python's
default for SIGTERM is to die at once, skipping the fixtures' teardown, which leaves engine
servers and papermill children running (and still sending requests). As KeyboardInterrupt, pytest
stops, tears the fixtures down (engines stopped with their process groups) and `subprocess.run`
kills the child it waits on.
"""
import signal


def _sigterm(signum, frame):
    raise KeyboardInterrupt(f"SIGTERM ({signum})")


def pytest_configure(config):
    signal.signal(signal.SIGTERM, _sigterm)
