"""Synchronising on states, never on sleeps: poll a predicate until it holds or a deadline passes.

A deadline is not a claim about speed: it only turns a hang into a failure that says what was
awaited (and, for a child process, what it printed), so every wait names its state in ``msg``.
"""
from __future__ import annotations

import queue
import signal
import subprocess
import threading
import time
from typing import Callable, Optional

__all__ = ["wait_until", "LineReader", "stack_of"]

POLL_S = 0.01


def wait_until(pred: Callable[[], object], timeout: float = 60.0, msg: str = "a state",
               proc: Optional[subprocess.Popen] = None, every: float = POLL_S):
    """``pred()``'s first truthy value, polled every ``every`` s; AssertionError naming ``msg`` after
    ``timeout`` s, or at once when ``proc`` (a child the state depends on) has exited."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            v = pred()          # the state may have come with the exit
            if v:
                return v
            raise AssertionError(f"waiting for {msg}: the child exited with {proc.returncode} first")
        if time.monotonic() > deadline:
            raise AssertionError(f"waiting for {msg}: not reached within {timeout:g} s")
        time.sleep(every)


class LineReader:
    """The lines a child writes to one pipe, read by a thread as they come: ``lines`` so far, and
    ``wait_for(prefix)`` (polls with :func:`wait_until`)."""

    def __init__(self, pipe, proc: subprocess.Popen):
        self.lines: list = []
        self.proc = proc
        self._q: queue.Queue = queue.Queue()
        self._t = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._t.start()

    def _read(self, pipe) -> None:
        for line in pipe:
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pred: Callable[[str], bool], timeout: float = 120.0, msg: str = "a line") -> str:
        def found():
            return next((ln for ln in list(self.lines) if pred(ln)), None)
        return wait_until(found, timeout, msg, proc=self.proc)

    def join(self, timeout: float = 10.0) -> None:
        self._t.join(timeout)


def stack_of(proc: subprocess.Popen, stderr: Optional[LineReader] = None) -> str:
    """A hung Python child started with ``PYTHONFAULTHANDLER=1``: SIGABRT makes it print every
    thread's stack on stderr (faulthandler); returns what its stderr holds then."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGABRT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if stderr is not None:
        stderr.join()
        return stderr.text()
    return ""
