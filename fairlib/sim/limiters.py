"""Rate limits that count a request's cost *after* its response, as the field's gateways do (a
token limit read from the response's ``usage``: LiteLLM's TPM, the AI gateways' token rate
limits; ../shared/reference/gateways.md), to put in front of ``PolicyGate`` in
``fairlib.sim.cluster.simulate_gateway`` (``limiter=``): the comparison with a pool that reserves
at admission (chapter 6).

``CountAfterResponse``: per tenant ``i`` a limit ``L_i`` of machine-ms per fixed window of ``W`` ms
(``[kW, (k+1)W)``). A request arriving at ``t`` passes iff ``U_i(k(t)) < L_i``, with ``U_i(k)`` the
cost counted in window ``k``: a request's ``c = p P + u O`` (its prompt and its output tokens,
priced as the pool prices them) is counted when it finishes, in its finish's window. Nothing
waiting or in flight is counted, so a tenant can exceed ``L_i`` in a window by the cost of what it
has waiting and in flight when the count reaches ``L_i``. A refused request's Retry-After: to
the next window."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["CountAfterResponse"]


class CountAfterResponse:
    def __init__(self, limits_ms: Sequence[float], window_ms: float, prefill_price_ms: float, decode_price_ms: float):
        lim = np.asarray(limits_ms, float)
        if lim.ndim != 1 or lim.size < 1 or not np.all(np.isfinite(lim)) or np.any(lim <= 0):
            raise ValueError(f"limits_ms: one finite number > 0 per tenant, got {list(np.atleast_1d(limits_ms))}")
        for name, v, strict in (("window_ms", window_ms, True), ("prefill_price_ms", prefill_price_ms, False),
                                ("decode_price_ms", decode_price_ms, True)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (strict and v == 0):
                raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} 0, got {v!r}")
        self.limits = lim
        self.window_ms, self.p, self.u = float(window_ms), float(prefill_price_ms), float(decode_price_ms)
        self.window = np.full(lim.size, -1, np.int64)     # the window each tenant's count is for
        self.used = np.zeros(lim.size)

    def _roll(self, tenant: int, t_ms: float) -> None:
        k = int(t_ms // self.window_ms)
        if self.window[tenant] != k:
            self.window[tenant], self.used[tenant] = k, 0.0

    def _check(self, tenant) -> int:
        if isinstance(tenant, bool) or not float(tenant).is_integer() or not 0 <= tenant < self.limits.size:
            raise ValueError(f"tenant must be an index in 0..{self.limits.size - 1} (one limit each), got {tenant!r}")
        return int(tenant)

    def allow(self, tenant: int, t_ms: float) -> bool:
        """Whether a request of ``tenant`` arriving at ``t_ms`` passes: ``U_i(k(t)) < L_i``."""
        tenant = self._check(tenant)
        self._roll(tenant, t_ms)
        return bool(self.used[tenant] < self.limits[tenant])

    def finished(self, tenant: int, prompt_tokens: int, output_tokens: int, t_ms: float) -> None:
        """A request's response ended at ``t_ms``: count ``p P + u O`` in that window."""
        tenant = self._check(tenant)
        self._roll(tenant, t_ms)
        self.used[tenant] += self.p * prompt_tokens + self.u * output_tokens

    def retry_after_ms(self, tenant: int, t_ms: float) -> float:
        return (math.floor(t_ms / self.window_ms) + 1) * self.window_ms - t_ms
