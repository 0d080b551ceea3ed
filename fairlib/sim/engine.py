"""The replica's cost model (book/engine-model.md).

One iteration with ``B`` running sequences and ``P`` prompt tokens prefilled costs

    dt = iter_base_ms + iter_slope_ms * B + prefill_ms_per_token * P.

``load_engine_params`` reads an engine's fields from JSON or TOML (an ``Engine``'s fields, or a
probe or fit result with an ``"engine"`` table), for the servers' command lines.
"""
from __future__ import annotations

import json
import math
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import numpy as np

__all__ = ["Engine", "SEED000_ENGINE", "BATCHING", "ENGINE_FIELDS", "load_engine_params"]

#: ``continuous``: a request joins the running batch at any iteration (vLLM, the book's default);
#: ``static``: the batch-synchronous worker of DriftSched's code (book/engine-model.md): while a
#: batch runs nothing joins it; a free worker takes up to ``max_batch`` waiting requests, waiting
#: at most ``fill_wait_ms`` from when it holds its first for more to arrive, and runs them until the
#: last one finishes.
BATCHING = ("continuous", "static")


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not float(value).is_integer() or value < 1:
        raise ValueError(f"Engine.{name} must be an integer >= 1, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Engine:
    """Cost and capacity parameters of one replica (times in ms).

    One iteration with ``B`` running sequences and ``P`` prompt tokens prefilled costs
    ``dt = iter_base_ms + iter_slope_ms * B + prefill_ms_per_token * P`` (:meth:`iteration_ms`);
    a running sequence is charged ``(iter_base_ms + iter_slope_ms * B) / B`` per iteration
    (:meth:`per_seq_ms`). The defaults are seed 000's replica (``SEED000_ENGINE``).

    Parameters
    ----------
    iter_base_ms : float, default 9.0
        Fixed cost of one iteration (ms, finite, >= 0).
    iter_slope_ms : float, default 0.55
        Cost per running sequence per iteration (ms, finite, >= 0); ``iter_base_ms +
        iter_slope_ms`` must be > 0.
    prefill_ms_per_token : float, default 0.06
        Cost per prompt token prefilled (ms, finite, >= 0).
    max_batch : int, default 24
        Most sequences running at once (>= 1).
    max_prefill_tokens : int, optional
        Most prompt tokens prefilled in one iteration (>= 1); ``None``: no limit.
    kv_capacity_tokens : int, optional
        KV cache size in tokens (>= 1): the running sequences' prompt + generated tokens must fit;
        ``None``: no limit.
    batching : {"continuous", "static"}, default "continuous"
        ``continuous``: a request joins the running batch at any iteration (vLLM);
        ``static``: a batch runs to its last finish before another forms (``BATCHING``).
    fill_wait_ms : float, default 10.0
        Static batching only: how long (ms, finite, >= 0) a free worker holding its first request
        waits for more to arrive.

    Raises
    ------
    ValueError
        A field out of range, naming it (``Engine.max_batch must be an integer >= 1, ...``).

    Examples
    --------
    >>> from fairlib import Engine
    >>> round(float(Engine().iteration_ms(24, 100)), 9)    # 9 + 0.55 * 24 + 0.06 * 100
    28.2
    """

    iter_base_ms: float = 9.0
    iter_slope_ms: float = 0.55
    prefill_ms_per_token: float = 0.06
    max_batch: int = 24
    max_prefill_tokens: Optional[int] = None
    kv_capacity_tokens: Optional[int] = None
    batching: str = "continuous"
    fill_wait_ms: float = 10.0

    def __post_init__(self):
        for name in ("iter_base_ms", "iter_slope_ms", "prefill_ms_per_token"):
            v = getattr(self, name)
            if not isinstance(v, (int, float, np.floating, np.integer)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"Engine.{name} must be a finite number >= 0, got {v!r}")
            object.__setattr__(self, name, float(v))
        if self.iter_base_ms + self.iter_slope_ms <= 0:
            raise ValueError("Engine: iter_base_ms + iter_slope_ms must be > 0 (an iteration must take time)")
        object.__setattr__(self, "max_batch", _positive_int("max_batch", self.max_batch))
        for name in ("max_prefill_tokens", "kv_capacity_tokens"):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, _positive_int(name, v))
        if self.batching not in BATCHING:
            raise ValueError(f"Engine.batching must be one of {', '.join(BATCHING)}, got {self.batching!r}")
        w = self.fill_wait_ms
        if isinstance(w, bool) or not isinstance(w, (int, float, np.floating, np.integer)) or not math.isfinite(w) \
                or w < 0:
            raise ValueError(f"Engine.fill_wait_ms must be a finite number >= 0, got {w!r}")
        object.__setattr__(self, "fill_wait_ms", float(w))

    # --- the cost model -------------------------------------------------------------------
    def iteration_ms(self, batch, prefill_tokens=0):
        """dt = iter_base_ms + iter_slope_ms * B + prefill_ms_per_token * P."""
        return self.iter_base_ms + self.iter_slope_ms * np.asarray(batch) + self.prefill_ms_per_token * np.asarray(prefill_tokens)

    def per_seq_ms(self, batch):
        """What one running sequence is charged per iteration: (iter_base + iter_slope*B) / B."""
        b = np.asarray(batch, dtype=float)
        return (self.iter_base_ms + self.iter_slope_ms * b) / b

    def request_cost_ms(self, prompt_tokens, output_tokens, batch=None):
        """Machine time one request consumes at a steady batch B (default max_batch):
        prompt * prefill_ms_per_token + output * per_seq(B)."""
        b = self.max_batch if batch is None else batch
        return self.prefill_ms_per_token * np.asarray(prompt_tokens) + np.asarray(output_tokens) * self.per_seq_ms(b)

    def exchange_rate(self, batch):
        """Prompt tokens one output token is worth on this machine at batch B:
        (iter_base + iter_slope*B) / (B * prefill_ms_per_token)."""
        if self.prefill_ms_per_token == 0:
            raise ValueError("Engine.prefill_ms_per_token is 0: the exchange rate is infinite")
        return self.per_seq_ms(batch) / self.prefill_ms_per_token

    def __repr__(self) -> str:
        """The fields ``to_dict`` gives: a continuous-batching engine shows the six it always had."""
        return "Engine(" + ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items()) + ")"

    def to_dict(self) -> dict:
        """The fields; ``batching`` and ``fill_wait_ms`` only for a static-batch engine (a
        continuous-batching engine writes the six fields it always had)."""
        d = asdict(self)
        if self.batching == "continuous":
            d.pop("batching")
            d.pop("fill_wait_ms")
        return d

    def kernel_params(self) -> np.ndarray:
        """The float64 parameter vector the compiled kernel reads (inf = no limit)."""
        inf = np.inf
        return np.array([
            self.iter_base_ms, self.iter_slope_ms, self.prefill_ms_per_token, float(self.max_batch),
            inf if self.max_prefill_tokens is None else float(self.max_prefill_tokens),
            inf if self.kv_capacity_tokens is None else float(self.kv_capacity_tokens),
            1.0 if self.batching == "static" else 0.0, self.fill_wait_ms,
        ], dtype=np.float64)


#: The seed-000 replica: dt = 9 + 0.55 B + 0.06 P ms, max_batch 24.
SEED000_ENGINE = Engine(9.0, 0.55, 0.06, 24)


#: the fields a probe or fit writes of a continuous-batching engine (what ``load_engine_params`` takes)
ENGINE_FIELDS = ("iter_base_ms", "iter_slope_ms", "prefill_ms_per_token", "max_batch", "max_prefill_tokens",
                 "kv_capacity_tokens")


def load_engine_params(spec) -> dict:
    """Engine fields from a JSON string, a ``.json``/``.toml`` file, or a mapping.

    A mapping with an ``"engine"`` key (a probe result, ``fairlib.calibrate.probe``) uses that sub-table.
    Unknown keys are an error (a misspelt parameter must not be silently ignored)."""
    if isinstance(spec, dict):
        d = dict(spec)
    else:
        s = str(spec).strip()
        p = Path(s)
        if s.startswith("{"):
            d = json.loads(s)
        elif p.suffix == ".toml":
            d = tomllib.loads(p.read_text(encoding="utf-8"))
        elif p.exists():
            d = json.loads(p.read_text(encoding="utf-8"))
        else:
            raise ValueError(f"engine params: {s!r} is neither a JSON object nor an existing .json/.toml file")
    if isinstance(d.get("engine"), dict):
        d = d["engine"]
    unknown = sorted(set(d) - set(ENGINE_FIELDS))
    if unknown:
        raise ValueError(f"engine params: unknown field(s) {unknown}; allowed: {', '.join(ENGINE_FIELDS)}")
    return d
