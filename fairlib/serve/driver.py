"""The real-time driver: one asyncio task runs the engine model (``fairlib.sim.online.OnlineEngine``)
against the wall clock.

Time: ``now_ms`` is milliseconds since the server started (``perf_counter``). An arriving request
is submitted with ``arrival_ms = now_ms()`` at once. The driver loop:

1. nothing to do: wait for an arrival;
2. ``step()``: one iteration of the engine model at the model clock (an idle engine jumps to the
   earliest waiting arrival, exactly as the model says); arrivals that came while the previous
   iteration ran are delivered here, at its end, as in the model;
3. sleep until the iteration's end, ``t0 + end_ms`` on the monotonic clock (an ``asyncio.sleep``
   to ``spin_ms`` before it, then a cooperative spin), and hand one token to every request that
   ran, finishing those that finished.

The model clock never waits for the server: if an emission is late, the next iteration still
ends where the model says, so lateness never accumulates. The lateness itself (actual emission
minus the model's intended time) is the server's timing error; it is recorded per iteration
(``fairlib_serve_emission_lag_seconds``) and per written chunk (``fairlib_serve_write_lag_seconds``).

Disconnects: a request whose client went away is ended in the model at its next token, as if it
had produced EOS (its ``output_tokens`` is cut to ``generated + 1``; no compiled code changes).
A running request thus leaves the batch after at most one more iteration. The compiled waiting
lines have no removal operation, so a request that never ran is shrunk instead, to a one-token
prompt with a one-token output: when its turn comes it passes through the batch in one
iteration at a cost of ``prefill_ms_per_token`` and one slot (vLLM frees a waiting request at
once; this is the one place where the server differs from it). Its tokens are not sent; it is
counted as ``vllm:request_success_total{finished_reason="abort"}``.
"""
from __future__ import annotations

import asyncio
import collections
import time
import traceback
from typing import Optional

import numpy as np

from fairlib.protocol.prometheus import (
    ITERATION_TOKENS_BUCKETS,
    ITL_BUCKETS,
    LAG_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    Counter,
    Gauge,
    Histogram,
    Registry,
)
from fairlib.sim import loop
from fairlib.sim.online import OnlineEngine
from fairlib.sim import state

__all__ = ["Driver", "RequestState", "QueueFull"]


class QueueFull(Exception):
    """The waiting-queue cap (``max_waiting``) is reached."""


class RequestState:
    """What a handler waits on: tokens handed over by the driver, and how the request ended."""

    __slots__ = ("rid", "tenant", "prompt_tokens", "output_tokens", "max_tokens", "event", "pending",
                 "emitted", "finished", "rejected", "aborted", "last_target", "last_token_ms")

    def __init__(self, rid, tenant, prompt_tokens, output_tokens, max_tokens):
        self.rid, self.tenant = rid, tenant
        self.prompt_tokens, self.output_tokens, self.max_tokens = prompt_tokens, output_tokens, max_tokens
        self.event = asyncio.Event()
        self.pending = 0          # tokens handed over, not yet taken by the handler
        self.emitted = 0          # tokens handed over in all
        self.finished = False     # the model finished it (all tokens handed over)
        self.rejected = False     # the policy turned it away at delivery
        self.aborted = False      # its client went away
        self.last_target = 0.0    # intended perf_counter time of the latest hand-over
        self.last_token_ms = 0.0  # model time of its latest token

    @property
    def finish_reason(self) -> str:
        return "length" if self.output_tokens >= self.max_tokens else "stop"


class Driver:
    """Owns the ``OnlineEngine``, the request table and the metrics; ``run()`` is the loop task."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.eng = OnlineEngine(cfg.engine, cfg.policy, n_tenants=cfg.n_tenants, n_classes=cfg.n_classes,
                                priority_levels=range(cfg.priority_min, cfg.priority_max + 1), capacity=4096,
                                **cfg.policy_params)
        self._warm_up()
        self.t0 = time.perf_counter()
        self.t0_wall = time.time()
        self.spin_s = cfg.spin_ms / 1e3
        self.wake = asyncio.Event()
        self.reqs: dict = {}
        self.rng = np.random.default_rng(cfg.seed)
        self.lags = collections.deque(maxlen=100_000)       # emission lag (s), latest iterations
        self.write_lags = collections.deque(maxlen=100_000)  # write lag (s), latest chunks
        self.lag_max = 0.0
        self.n_submitted = 0
        self.n_rejected_429 = 0
        self.busy_ms = 0.0
        self.tenant_map = {s: i for i, s in enumerate(cfg.tenant_names)}
        self.failed: Optional[BaseException] = None
        self._build_metrics()

    def _warm_up(self) -> None:
        """Load the compiled step (numba) before the clock starts: a throwaway engine, one request."""
        cfg = self.cfg
        tmp = OnlineEngine(cfg.engine, cfg.policy, n_tenants=cfg.n_tenants, n_classes=cfg.n_classes,
                           priority_levels=range(cfg.priority_min, cfg.priority_max + 1), capacity=4,
                           **cfg.policy_params)
        tmp.submit(0, 1, 2, 0.0, priority=max(cfg.priority_min, min(0, cfg.priority_max)))
        while tmp.has_work() and tmp.step().code != loop.ENDED:
            pass

    # --- clock ------------------------------------------------------------------------------
    def now_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1e3

    async def sleep_until(self, target: float) -> None:
        """Return at ``perf_counter() >= target``: sleep to ``spin_s`` before, then yield-spin."""
        delay = target - time.perf_counter()
        if delay > self.spin_s:
            await asyncio.sleep(delay - self.spin_s)
        while time.perf_counter() < target:
            await asyncio.sleep(0)

    # --- metrics ----------------------------------------------------------------------------
    def _build_metrics(self):
        L = ("model_name", "engine")
        self.labels = (self.cfg.model, "0")
        r = self.registry = Registry()
        self.m_running = r.add(Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", L))
        self.m_waiting = r.add(Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", L))
        self.m_kv = r.add(Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", L))
        self.m_preempt = r.add(Counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", L))
        self.m_prompt = r.add(Counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", L))
        self.m_gen = r.add(Counter("vllm:generation_tokens_total", "Number of generation tokens processed.", L))
        self.m_success = r.add(Counter("vllm:request_success_total", "Count of successfully processed requests.",
                                       L + ("finished_reason",)))
        self.m_iter_tokens = r.add(Histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                                             L, ITERATION_TOKENS_BUCKETS))
        self.m_ttft = r.add(Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                                      L, TTFT_BUCKETS))
        self.m_itl = r.add(Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                                     L, ITL_BUCKETS))
        self.m_e2e = r.add(Histogram("vllm:e2e_request_latency_seconds",
                                     "Histogram of e2e request latency in seconds.", L, REQUEST_LATENCY_BUCKETS))
        self.m_queue = r.add(Histogram("vllm:request_queue_time_seconds",
                                       "Histogram of time spent in WAITING phase for request.", L, REQUEST_LATENCY_BUCKETS))
        # fairlib's own: the server's timing error and the model's per-tenant view
        self.m_lag = r.add(Histogram("fairlib_serve_emission_lag_seconds",
                                     "Actual token hand-over time minus the engine model's intended iteration end.",
                                     L, LAG_BUCKETS))
        self.m_wlag = r.add(Histogram("fairlib_serve_write_lag_seconds",
                                      "Time a token chunk was written to its socket minus the intended iteration end.",
                                      L, LAG_BUCKETS))
        self.m_lag_max = r.add(Gauge("fairlib_serve_emission_lag_max_seconds", "Largest emission lag so far.", L))
        self.m_iters = r.add(Counter("fairlib_serve_iterations_total", "Engine-model iterations run.", L))
        self.m_busy = r.add(Counter("fairlib_serve_busy_seconds_total", "Model time spent in iterations.", L))
        self.m_rej = r.add(Counter("fairlib_serve_requests_rejected_total", "Requests turned away (HTTP 429).",
                                   L + ("reason",)))
        self.m_t_tokens = r.add(Counter("fairlib_serve_tenant_generation_tokens_total",
                                        "Tokens emitted per tenant (engine model).", L + ("tenant",)))
        self.m_t_machine = r.add(Counter("fairlib_serve_tenant_machine_seconds_total",
                                         "Machine time charged per tenant (residency accounting).", L + ("tenant",)))
        unit = self.eng.policy.counter_unit
        self.counter_scale = 1e-3 if unit == "ms" else 1.0
        self.m_t_counter = None if unit is None else r.add(Gauge(
            f"fairlib_serve_policy_score_{'seconds' if unit == 'ms' else 'tokens'}",
            f"The policy's per-tenant counter ({self.eng.policy.name}; {'machine seconds' if unit == 'ms' else 'weighted service tokens'}).",
            L + ("tenant",)))
        # series exist from the start, at 0 (as prometheus_client's labelled children in vLLM do)
        for m in (self.m_preempt, self.m_prompt, self.m_gen, self.m_iters, self.m_busy):
            m.inc(0, self.labels)
        for reason in ("stop", "length", "abort"):
            self.m_success.inc(0, self.labels + (reason,))
        for reason in ("queue_full", "policy"):
            self.m_rej.touch(self.labels + (reason,))
        for h in (self.m_iter_tokens, self.m_ttft, self.m_itl, self.m_e2e, self.m_queue, self.m_lag, self.m_wlag):
            h.touch(self.labels)

    def render_metrics(self) -> str:
        """The metrics as Prometheus text (0.0.4)."""
        self.update_metrics()
        return self.registry.render()

    def metrics_exposition(self, accept=None) -> tuple:
        """``(body, content type)`` for ``/metrics`` (the scraper's ``Accept``: text or OpenMetrics)."""
        self.update_metrics()
        return self.registry.exposition(accept)

    def update_metrics(self) -> None:
        """The gauges and totals that come from the engine model's state, brought to now."""
        S, lab = self.eng.S, self.labels
        n = int(S.si[state.N_REQ])
        self.m_running.set(int(S.si[state.N_RUNNING]), lab)
        self.m_waiting.set(self.n_waiting(), lab)
        kv = self.cfg.engine.kv_capacity_tokens
        if kv:
            ids = S.BT[state.RUN_IDS, :int(S.si[state.N_RUNNING])]
            need = (float((S.RI[state.PROMPT, ids] + S.RI[state.GENERATED, ids] + 1).sum())
                    if ids.size else 0.0)
            self.m_kv.set(need / kv, lab)
        else:
            self.m_kv.set(0.0, lab)
        self.m_preempt.set_total(float(S.RI[state.PREEMPT, :n].sum()) if n else 0.0, lab)
        self.m_lag_max.set(self.lag_max, lab)
        names = self.tenant_names()
        counters = self.eng.policy.counters(self.eng.pf, self.eng.n_tenants)
        for i, name in enumerate(names):
            tl = lab + (name,)
            self.m_t_tokens.set_total(float(S.TI[state.T_TOKENS, i]), tl)
            self.m_t_machine.set_total(float(S.TF[state.T_MACHINE, i]) / 1e3, tl)
            if counters is not None and self.m_t_counter is not None:
                self.m_t_counter.set(float(counters[i]) * self.counter_scale, tl)

    # --- tenants ----------------------------------------------------------------------------
    def tenant_index(self, name: str) -> Optional[int]:
        """The index of tenant ``name`` (new names take the next free index); None when full."""
        i = self.tenant_map.get(name)
        if i is None:
            if len(self.tenant_map) >= self.cfg.n_tenants:
                return None
            i = self.tenant_map[name] = len(self.tenant_map)
        return i

    def tenant_names(self) -> list:
        return sorted(self.tenant_map, key=self.tenant_map.get)

    # --- requests ---------------------------------------------------------------------------
    def n_waiting(self) -> int:
        """Waiting in the model: undelivered arrivals, waiting lines, preempted-and-held."""
        S = self.eng.S
        return int(S.si[state.N_REQ] - S.si[state.NEXT_ARRIVAL] + S.heap_n.sum() + S.si[state.N_HELD])

    def output_length(self, max_tokens: int, min_tokens: int, forced: bool) -> int:
        if forced:
            return max_tokens
        draw = int(self.rng.geometric(1.0 / self.cfg.mean_output_tokens))
        return max(min_tokens, 1, min(draw, max_tokens))

    def submit(self, tenant: int, prompt_tokens: int, output_tokens: int, max_tokens: int, *,
               est_output_tokens: Optional[int] = None, klass: int = 0, priority: int = 0) -> RequestState:
        """Submit now (``arrival_ms = now_ms()``); raises ``QueueFull`` at the waiting cap."""
        cap = self.cfg.max_waiting
        if cap is not None and self.n_waiting() >= cap:
            self.n_rejected_429 += 1
            self.m_rej.inc(1, self.labels + ("queue_full",))
            raise QueueFull(f"the waiting queue is full ({cap} requests wait; max_waiting={cap})")
        rid = self.eng.submit(tenant, prompt_tokens, output_tokens, self.now_ms(),
                              est_output_tokens=max_tokens if est_output_tokens is None else est_output_tokens,
                              klass=klass, priority=priority)
        st = RequestState(rid, tenant, prompt_tokens, output_tokens, max_tokens)
        self.reqs[rid] = st
        self.n_submitted += 1
        self.wake.set()
        return st

    def abort(self, st: RequestState) -> None:
        """The client went away: end the request at its next token (see the module docstring)."""
        if st.finished or st.rejected or st.aborted:
            return
        st.aborted = True
        RI = self.eng.S.RI
        r = st.rid
        status = RI[state.STATUS, r]
        if status in (state.UNDELIVERED, state.WAITING) and RI[state.GENERATED, r] == 0:
            RI[state.PROMPT, r] = 1     # never ran: pass through the batch at (almost) no cost
            RI[state.OUTPUT, r] = 1
        elif status in (state.UNDELIVERED, state.WAITING, state.RUNNING, state.HELD):
            RI[state.OUTPUT, r] = min(int(RI[state.OUTPUT, r]), int(RI[state.GENERATED, r]) + 1)

    # --- the loop ---------------------------------------------------------------------------
    def on_done(self, task) -> None:
        """The loop task ended: if by an exception, fail every waiting request (HTTP 500)."""
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        traceback.print_exception(exc)
        self.failed = exc
        for st in list(self.reqs.values()):
            st.event.set()

    async def run(self) -> None:
        eng = self.eng
        while True:
            self.wake.clear()
            if not eng.has_work():
                await self.wake.wait()
                continue
            it = eng.step()
            if it.rejected.size:
                self._rejected(it.rejected)
            if it.code == loop.IDLE_JUMP:
                continue
            if it.code == loop.ENDED:  # nothing can run (e.g. a request that can never be re-admitted)
                await self.wake.wait()
                continue
            target = self.t0 + it.end_ms / 1e3
            await self.sleep_until(target)
            lag = time.perf_counter() - target
            self._emit(it, target, lag)

    def _rejected(self, rids) -> None:
        for r in rids.tolist():
            st = self.reqs.pop(r, None)
            self.m_rej.inc(1, self.labels + ("policy",))
            if st is not None:
                st.rejected = True
                st.event.set()

    def _emit(self, it, target: float, lag: float) -> None:
        S, lab = self.eng.S, self.labels
        RF, RI = S.RF, S.RI
        self.lags.append(lag)
        if lag > self.lag_max:
            self.lag_max = lag
        self.m_lag.observe(max(lag, 0.0), lab)
        ran = it.ran
        B = int(ran.size)
        end, dt = it.end_ms, it.end_ms - it.start_ms
        self.busy_ms += dt
        # prefill tokens of this iteration: requests that entered the batch in it
        entered = ran[RI[state.ENTERED, ran] == S.si[state.ITERATIONS] - 1]
        P = int((RI[state.PROMPT, entered] + RI[state.GENERATED, entered] - 1).sum()) if entered.size else 0
        self.m_iter_tokens.observe(B + P, lab)
        self.m_iters.inc(1, lab)
        self.m_busy.inc(dt / 1e3, lab)
        self.m_gen.inc(B, lab)
        first = set(it.first.tolist())
        for r in it.first.tolist():
            self.m_prompt.inc(int(RI[state.PROMPT, r]), lab)
            self.m_ttft.observe((RF[state.FIRST, r] - RF[state.ARRIVAL, r]) / 1e3, lab)
            self.m_queue.observe((RF[state.ADMITTED, r] - RF[state.ARRIVAL, r]) / 1e3, lab)
        reqs = self.reqs
        for r in ran.tolist():
            st = reqs.get(r)
            if st is None:
                continue
            if r not in first:
                self.m_itl.observe((end - st.last_token_ms) / 1e3, lab)
            st.last_token_ms = end
            st.emitted += 1
            if not st.aborted:
                st.pending += 1
                st.last_target = target
                st.event.set()
        for r in it.finished.tolist():
            st = reqs.pop(r, None)
            self.m_e2e.observe((RF[state.FINISH, r] - RF[state.ARRIVAL, r]) / 1e3, lab)
            if st is None:
                continue
            reason = ("abort" if st.aborted else
                      "length" if RI[state.GENERATED, r] >= st.max_tokens else "stop")
            self.m_success.inc(1, lab + (reason,))
            st.finished = True
            st.event.set()

    # --- introspection ----------------------------------------------------------------------
    def stats(self) -> dict:
        """The server's own view: configuration, counts and its timing error so far."""
        lags = np.asarray(self.lags, float) * 1e3
        wl = np.asarray(self.write_lags, float) * 1e3

        def pct(a):
            if a.size == 0:
                return {"n": 0}
            p50, p90, p99 = np.percentile(a, [50, 90, 99])
            return {"n": int(a.size), "p50": float(p50), "p90": float(p90), "p99": float(p99),
                    "max": float(a.max()), "mean": float(a.mean())}

        S = self.eng.S
        return {
            "config": self.cfg.to_dict(),
            "uptime_s": time.perf_counter() - self.t0,
            "model_clock_ms": self.eng.now_ms,
            "requests_submitted": self.n_submitted,
            "requests_rejected_queue_full": self.n_rejected_429,
            "running": int(S.si[state.N_RUNNING]),
            "waiting": self.n_waiting(),
            "iterations": int(S.si[state.ITERATIONS]),
            "busy_ms": self.busy_ms,
            "tenants": dict(self.tenant_map),
            "tenant_machine_ms": {name: float(S.TF[state.T_MACHINE, i])
                                  for name, i in self.tenant_map.items()},
            "emission_lag_ms": pct(lags),
            "write_lag_ms": pct(wl),
            "timing_note": "lag = actual emission (or socket write) minus the engine model's intended iteration end",
        }
