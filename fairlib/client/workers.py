"""Sharding one run over several client processes (spawn), aligned to one absolute start time.

Each worker imports, opens its event loop and reports ready; the parent then picks the start
time (now + ``start_delay_s``) and releases them all at once. Records come back through one queue
and are written by the parent as they arrive. Workers ignore SIGINT; the parent turns Ctrl-C into
a shared stop flag that each worker polls (every 20 ms), so in-flight requests still produce
``interrupted`` records.
"""
from __future__ import annotations

import asyncio
import gc
import multiprocessing as mp
import queue
import signal
import threading
import time
import traceback

from fairlib.client.runner import RunClock, send_shard

__all__ = ["run_sharded"]

READY_TIMEOUT_S = 120.0


def _worker_main(i, shard, endpoint, spin_s, q, go, stop, t0v):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        gc.collect()
        gc.freeze()
        q.put(("ready", i, None))
        while not go.wait(0.05):
            if stop.is_set():
                break
        if stop.is_set() and not go.is_set():
            q.put(("done", i, {"interrupted": True}))
            return
        clock = RunClock(t0v.value)

        async def main():
            st = asyncio.Event()

            async def watch():
                while not stop.is_set():
                    await asyncio.sleep(0.02)
                st.set()

            watcher = asyncio.create_task(watch())
            try:
                return await send_shard(shard, endpoint, clock, lambda rec: q.put(("record", i, rec)),
                                        worker=i, spin_s=spin_s, stop=st)
            finally:
                watcher.cancel()

        q.put(("done", i, asyncio.run(main())))
    except BaseException:
        q.put(("failed", i, traceback.format_exc()))


def run_sharded(schedule, endpoint, n: int, on_record, on_start, *, start_delay_s: float = 0.2,
                spin_s: float = 1e-3, handle_sigint: bool = True) -> tuple:
    """Run ``schedule`` over ``n`` processes; returns ``(interrupted, failures)``."""
    ctx = mp.get_context("spawn")
    q, go, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    t0v = ctx.Value("d", 0.0, lock=False)
    shards = schedule.shard(n)
    procs = [ctx.Process(target=_worker_main, args=(i, shards[i], endpoint, spin_s, q, go, stop, t0v),
                         name=f"fairlib-client-{i}", daemon=True) for i in range(n)]
    state = {"interrupted": False}
    failures, done, ready = [], set(), set()

    def on_sigint(signum, frame):
        state["interrupted"] = True
        stop.set()

    old = None
    if handle_sigint and threading.current_thread() is threading.main_thread():
        old = signal.signal(signal.SIGINT, on_sigint)

    def handle(msg):
        kind, i, payload = msg
        if kind == "record":
            on_record(payload)
        elif kind == "ready":
            ready.add(i)
        elif kind == "done":
            done.add(i)
            state["interrupted"] |= bool(payload and payload.get("interrupted"))
        elif kind == "failed":
            done.add(i)
            failures.append({"worker": i, "traceback": payload})

    def dead_without_word(grace_s=1.0):
        """Workers that exited without a done/failed message (after a grace period)."""
        now = time.monotonic()
        for i, p in enumerate(procs):
            if i not in done and p.exitcode is not None:
                since = dead_at.setdefault(i, now)
                if now - since > grace_s:
                    done.add(i)
                    failures.append({"worker": i, "traceback": f"exited with code {p.exitcode} without a report"})

    dead_at: dict = {}
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while len(ready | done) < n and not stop.is_set():
            if time.monotonic() > deadline:
                stop.set()
                failures.append({"worker": None, "traceback": "workers not ready in time"})
                break
            try:
                handle(q.get(timeout=0.1))
            except queue.Empty:
                dead_without_word()
        t0 = time.time() + (0.0 if stop.is_set() else start_delay_s)
        t0v.value = t0
        on_start(t0)
        go.set()
        while len(done) < n:
            try:
                handle(q.get(timeout=0.2))
            except queue.Empty:
                dead_without_word()
    finally:
        if len(done) < n:  # an exception in the parent: stop the workers
            stop.set()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        if old is not None:
            signal.signal(signal.SIGINT, old)
    return state["interrupted"], failures
