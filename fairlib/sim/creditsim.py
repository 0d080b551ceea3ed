"""The credit controller (fairlib/sim/credit.py) in front of the engine model, stepped: a gateway
that keeps at most ``credit`` requests in one replica, backlogged by a closed loop of clients.

Per engine iteration (``OnlineEngine.step``): the gateway first fills the credit from its own
queue (each request enters the engine's waiting line at the current clock, as the real gateway
dispatches the moment a slot frees), then the iteration runs; a finished request's client sends
its next one at once (the gateway's queue never empties: a backlogged run). Every
``options.interval_s`` of model time the controller observes the engine as a scrape would,
during the iteration that covers the scrape's time: ``running`` its batch, ``waiting = in flight -
running`` (the requests the engine holds but does not run).

    df = simulate_credit(CreditRun(engine=Engine(max_batch=40), start=4))
    df.credit.iloc[-1]        # 41: max_batch + headroom
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fairlib.sim import loop
from fairlib.sim.credit import CreditController, CreditOptions
from fairlib.sim.engine import Engine
from fairlib.sim.online import OnlineEngine

__all__ = ["CreditRun", "simulate_credit"]


@dataclass(frozen=True)
class CreditRun:
    """One stepped run: the replica (``engine``), the credit's ``start`` (``fixed``: held there, the
    fixed-cap baseline), ``clients`` in a closed loop, each request ``prompt_tokens`` long with a
    geometric output of mean ``mean_output_tokens`` (seeded), ``duration_s`` of model time."""

    engine: Engine = field(default_factory=lambda: Engine(max_batch=40))
    start: int = 16
    fixed: bool = False
    clients: int = 128
    prompt_tokens: int = 128
    mean_output_tokens: int = 64
    duration_s: float = 20.0
    seed: int = 0
    options: CreditOptions = field(default_factory=CreditOptions)

    def __post_init__(self):
        for name in ("start", "clients", "prompt_tokens", "mean_output_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"CreditRun.{name} must be an integer >= 1, got {v!r}")
        d = self.duration_s
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d) or d <= 0:
            raise ValueError(f"CreditRun.duration_s must be a finite number of seconds > 0, got {d!r}")


def simulate_credit(run: CreditRun) -> pd.DataFrame:
    """One row per observation: ``t_s``, ``waiting`` and ``running`` (the engine's, as scraped),
    ``in_flight`` (the gateway's there), ``credit`` (after the observation), ``tokens_per_s``
    (output tokens over the interval)."""
    opt = run.options
    eng = OnlineEngine(run.engine, "fcfs", n_tenants=1, capacity=4 * run.clients)
    ctl = CreditController(run.start, opt)
    rng = np.random.default_rng(run.seed)
    interval_ms, end_ms = opt.interval_s * 1e3, run.duration_s * 1e3
    queued, in_flight, tokens = run.clients, 0, 0
    next_obs, rows = interval_ms, []
    while eng.now_ms < end_ms:
        while queued and in_flight < ctl.credit:
            out = max(1, int(rng.geometric(1.0 / run.mean_output_tokens)))
            eng.submit(0, run.prompt_tokens, out, arrival_ms=eng.now_ms)
            queued, in_flight = queued - 1, in_flight + 1
        it = eng.step()
        if it.code == loop.ENDED:
            break
        r, held = len(it.ran), in_flight        # during the iteration: its batch, the gateway's in flight
        done = len(it.finished)
        in_flight, queued, tokens = in_flight - done, queued + done, tokens + r
        while it.end_ms >= next_obs and next_obs <= end_ms:
            q = held - r
            credit = ctl.credit if run.fixed else ctl.observe(q, r, held)
            rows.append((next_obs / 1e3, q, r, held, credit, tokens / opt.interval_s))
            tokens = 0
            next_obs += interval_ms
    return pd.DataFrame(rows, columns=["t_s", "waiting", "running", "in_flight", "credit", "tokens_per_s"])
