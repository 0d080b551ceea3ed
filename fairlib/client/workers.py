"""Sharding one run over several client processes (spawn), aligned to one absolute start time.

Each worker imports, opens its event loop and reports ready; the parent then picks the start
time (now + ``start_delay_s``) and releases them all at once. Records come back through one queue
and are written by the parent as they arrive.

Stopping: the parent owns the run's stop flag (``measure.RunStop``: the first of ``SIGNALS``,
SIGINT, SIGTERM, SIGHUP or SIGQUIT: every signal that would end the process and can be caught)
and turns it into a shared stop event that each worker polls every ``STOP_POLL_S``; in-flight
requests still produce ``interrupted`` records, unsent ones are dropped. A signal during start-up
stops the workers before any request leaves. Workers start with ``SIGNALS`` blocked (a Ctrl-C or
a terminal's hang-up to the whole process group cannot kill one mid-import) and then treat each
as a stop of their own shard, which stops the run. A worker dies with its parent (``PR_SET_PDEATHSIG``, and a
parent-pid check for the moment before it is set, or where prctl does not exist): a killed
client leaves no process sending.
"""
from __future__ import annotations

import asyncio
import ctypes
import gc
import multiprocessing as mp
from multiprocessing import resource_tracker
import os
import queue
import signal
import time
import traceback
from typing import Optional

from fairlib.client.runner import STOP_POLL_S, RunClock, send_shard

__all__ = ["run_sharded", "SIGNALS"]

READY_TIMEOUT_S = 120.0   # every worker imported and ready within this
STOP_GRACE_S = 15.0       # after a stop, workers report within this, else they are terminated
# every signal that would end the process and can be caught: a run stopped by one writes its summary
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies (Linux prctl ``PR_SET_PDEATHSIG``); exit now if
    the parent already died (before the call, or where prctl does not exist it is checked later)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        os._exit(1)


def _worker_main(i, shard, endpoint, spin_s, q, go, stop, t0v, parent_pid, sent=None):
    _die_with_parent(parent_pid)
    own = {"stop": False}

    def on_signal(signum, frame):   # this worker's own stop signal: stop the shard (the run follows)
        own["stop"] = True

    for s in SIGNALS:
        signal.signal(s, on_signal)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)   # blocked by the parent while it spawned us

    def stopped() -> bool:
        if os.getppid() != parent_pid:   # orphaned (no prctl): nobody reads the records
            os._exit(1)
        return own["stop"] or stop.is_set()

    try:
        gc.collect()
        gc.freeze()
        q.put(("ready", i, None))
        while not go.wait(STOP_POLL_S) and not stopped():
            pass
        if stopped():   # stopped before the start: not one request sent
            q.put(("done", i, {"interrupted": True}))
            return
        clock = RunClock(t0v.value)

        def count_send():   # this worker's own slot of the shared count (no lock: one writer)
            if sent is not None:
                sent[i] += 1

        async def main():
            st = asyncio.Event()

            async def watch():
                while not stopped():
                    await asyncio.sleep(STOP_POLL_S)
                st.set()

            watcher = asyncio.create_task(watch())
            try:
                return await send_shard(shard, endpoint, clock, lambda rec: q.put(("record", i, rec)),
                                        worker=i, spin_s=spin_s, stop=st, on_send=count_send)
            finally:
                watcher.cancel()

        q.put(("done", i, asyncio.run(main())))
    except BaseException:
        q.put(("failed", i, traceback.format_exc()))


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (else the first semaphore starts it) with every
    one of ``SIGNALS`` blocked, a mask it keeps: it ignores SIGINT and SIGTERM itself, but a
    SIGHUP or SIGQUIT to the process group (a closed terminal) would kill it, and the run would
    end with its warning and traceback on stderr. A tracker already running is left as it is."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)   # a signal that came meanwhile lands now


class _Never:
    def is_set(self) -> bool:
        return False


def run_sharded(schedule, endpoint, n: int, on_record, on_start, *, start_delay_s: float = 0.2,
                spin_s: float = 1e-3, stop=None, sent_count=None) -> tuple:
    """Run ``schedule`` over ``n`` processes; returns ``(interrupted, failures)``.

    ``sent_count``: called once, before the workers start, with a function that returns how many
    requests the workers have sent so far (a progress count; one shared slot per worker).

    ``stop``: the run's stop flag (anything with ``is_set()``, e.g. ``measure.RunStop``), read
    every ``STOP_POLL_S`` from start-up on; once set no worker starts sending and the sending
    ones stop. ``on_start(t0_wall)`` is called once, when the workers are released (not at all
    when the run stops during start-up)."""
    ctx = mp.get_context("spawn")
    _start_resource_tracker()
    w = _Workers(ctx, n, on_record, stop if stop is not None else _Never())
    if sent_count is not None:
        sent_count(lambda: sum(w.sent))
    shards = schedule.shard(n)
    procs = [ctx.Process(target=_worker_main, args=(i, shards[i], endpoint, spin_s, w.q, w.go, w.halt, w.t0v,
                                                    os.getpid(), w.sent),
                         name=f"fairlib-client-{i}", daemon=True) for i in range(n)]
    try:
        w.start(procs)
        w.wait_ready()
        if not w.check_stop():
            t0 = time.time() + start_delay_s
            w.t0v.value = t0
            on_start(t0)
            w.go.set()
        w.wait_done()
    finally:
        w.finish()
    return w.interrupted, w.failures


class _Workers:
    """The parent's side of :func:`run_sharded`: the queue the workers report on, the start and halt
    events, and what each worker said (ready, done, failed) or did (exited without a word)."""

    def __init__(self, ctx, n: int, on_record, flag):
        self.n, self.on_record, self.flag = n, on_record, flag
        self.q, self.go, self.halt = ctx.Queue(), ctx.Event(), ctx.Event()
        self.t0v = ctx.Value("d", 0.0, lock=False)
        self.sent = ctx.Array("q", n, lock=False)
        self.interrupted = False
        self.halted_at: Optional[float] = None
        self.failures: list = []
        self.done: set = set()
        self.ready: set = set()
        self.started: list = []
        self.dead_at: dict = {}

    def halt_all(self, interrupted: bool) -> None:
        self.interrupted |= interrupted
        if not self.halt.is_set():
            self.halt.set()   # set here, never in a signal handler (it takes a lock)
            self.halted_at = time.monotonic()

    def check_stop(self) -> bool:
        if self.flag.is_set() and not self.halt.is_set():
            self.halt_all(True)
        return self.halt.is_set()

    def handle(self, msg) -> None:
        kind, i, payload = msg
        if kind == "record":
            self.on_record(payload)
        elif kind == "ready":
            self.ready.add(i)
        elif kind == "done":
            self.done.add(i)
            if payload and payload.get("interrupted"):
                self.halt_all(True)   # one shard stopped early: the run is over
        elif kind == "failed":
            self.done.add(i)
            self.failures.append({"worker": i, "traceback": payload})

    def dead_without_word(self, grace_s=1.0) -> None:
        """Workers that exited without a done/failed message (after a grace period)."""
        now = time.monotonic()
        for i, p in enumerate(self.started):
            if i not in self.done and p.exitcode is not None:
                since = self.dead_at.setdefault(i, now)
                if now - since > grace_s:
                    self.done.add(i)
                    self.failures.append({"worker": i, "traceback": f"exited with code {p.exitcode} without a report"})

    def pump(self, timeout_s=STOP_POLL_S) -> None:
        try:
            self.handle(self.q.get(timeout=timeout_s))
        except queue.Empty:
            self.dead_without_word()

    def start(self, procs: list) -> None:
        """Start the workers with ``SIGNALS`` blocked (inherited: they start immune)."""
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        try:
            for p in procs:
                p.start()
                self.started.append(p)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)       # a signal that came meanwhile lands now

    def wait_ready(self) -> None:
        """Until every worker is ready (or done), the run stops, or ``READY_TIMEOUT_S`` passes."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while len(self.ready | self.done) < self.n and not self.check_stop():
            if time.monotonic() > deadline:
                self.failures.append({"worker": None, "traceback": "workers not ready in time"})
                self.halt_all(False)
                break
            self.pump()

    def wait_done(self) -> None:
        """Until every worker is done, or ``STOP_GRACE_S`` after a stop."""
        while len(self.done) < self.n:
            if self.check_stop() and time.monotonic() - (self.halted_at or 0.0) > STOP_GRACE_S:
                self.failures.append({"worker": None,
                                      "traceback": f"workers still running {STOP_GRACE_S} s after the stop"})
                break
            self.pump()

    def finish(self) -> None:
        """On every way out: halt the workers still running (their records kept), then join them."""
        if len(self.done) < self.n:   # an exception in the parent, or workers that do not stop
            self.halt_all(False)
            end = time.monotonic() + 5.0
            while len(self.done) < self.n and time.monotonic() < end:
                try:
                    self.pump()
                except Exception:
                    break
        for p in self.started:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
