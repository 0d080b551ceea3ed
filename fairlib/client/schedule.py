"""The precomputed request schedule an open-loop run sends.

``build_schedule(requests, seed)`` turns the simulator's workload table (columns ``arrival_ms``,
``tenant``, ``prompt_tokens``, ``output_tokens``, optional ``priority`` and ``headers``: a mapping
of more headers for that request, e.g. chapter 5's ``x-fairlib-category``) into ``PlannedRequest``s: when to
send (seconds after the run starts), to whom it belongs, the prompt, and ``max_tokens`` (the forced
output length). Prompt content is deterministic per (seed, tenant, the tenant's request number)
and starts with a prefix unique to the request, so prefix caching cannot hit. It is sized in a
tokenizer (any object with ``encode``/``decode``) when given one, else as N whitespace-separated
words. One seed gives a byte-identical schedule (``Schedule.to_jsonl`` / ``Schedule.sha256``).
"""
from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence, Union

import pandas as pd

__all__ = ["PlannedRequest", "Schedule", "build_schedule", "make_prompt", "WORDS"]

APIS = ("completions", "chat")

# A fixed word list (never reorder: prompt content depends on it). engines/make_models.py reads
# the same file, so the tiny models' vocabulary holds these words whole.
WORDS = tuple(Path(__file__).with_name("words.txt").read_text().split())

Prompt = Union[str, tuple]


@dataclass(frozen=True)
class PlannedRequest:
    """One request of the schedule."""

    request_id: int
    tenant: int                 # tenant index (0..n-1), as in the workload table
    tenant_name: str            # sent in the tenant header
    send_offset_s: float        # intended send time, seconds after the run's start
    prompt: Prompt              # text, or a tuple of token ids
    prompt_tokens: int
    max_tokens: int             # = the workload's output_tokens (forced output length)
    priority: int = 0
    api: str = "completions"    # "completions" or "chat"
    headers: tuple = ()         # more (name, value) headers for this request (a workload's "headers")

    def to_dict(self) -> dict:
        d = asdict(self)
        if isinstance(self.prompt, tuple):
            d["prompt"] = list(self.prompt)
        if self.headers:            # absent when empty: schedules without them hash as before
            d["headers"] = [list(h) for h in self.headers]
        else:
            d.pop("headers")
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "PlannedRequest":
        d = dict(d)
        if isinstance(d.get("prompt"), list):
            d["prompt"] = tuple(d["prompt"])
        d["headers"] = tuple(tuple(h) for h in d.get("headers") or ())
        return cls(**d)


def _dumps(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class Schedule(Sequence):
    """An immutable, ordered list of ``PlannedRequest`` (by send offset) plus build metadata."""

    def __init__(self, requests: Iterable[PlannedRequest], meta: Optional[Mapping] = None):
        self.requests = tuple(sorted(requests, key=lambda r: (r.send_offset_s, r.request_id)))
        self.meta = dict(meta or {})

    def __len__(self):
        return len(self.requests)

    def __getitem__(self, i):
        return self.requests[i]

    def __repr__(self):
        return f"Schedule({len(self)} requests, {self.duration_s:.3f} s, meta={self.meta})"

    @property
    def duration_s(self) -> float:
        """Span of intended send offsets (first to last)."""
        return self.requests[-1].send_offset_s - self.requests[0].send_offset_s if self.requests else 0.0

    @property
    def rate_rps(self) -> Optional[float]:
        """Requested send rate: (n - 1) / span, ``None`` for fewer than 2 requests or a zero span."""
        d = self.duration_s
        return (len(self) - 1) / d if len(self) > 1 and d > 0 else None

    def to_jsonl(self) -> bytes:
        """Canonical serialisation: a ``{"meta": ...}`` line, then one line per request."""
        lines = [_dumps({"meta": self.meta})] + [_dumps(r.to_dict()) for r in self.requests]
        return ("\n".join(lines) + "\n").encode("utf-8")

    @classmethod
    def from_jsonl(cls, data: bytes) -> "Schedule":
        lines = [json.loads(s) for s in data.decode("utf-8").splitlines() if s.strip()]
        return cls([PlannedRequest.from_dict(d) for d in lines[1:]], lines[0]["meta"])

    def sha256(self) -> str:
        return hashlib.sha256(self.to_jsonl()).hexdigest()

    def save(self, path) -> None:
        with open(path, "wb") as f:
            f.write(self.to_jsonl())

    @classmethod
    def load(cls, path) -> "Schedule":
        with open(path, "rb") as f:
            return cls.from_jsonl(f.read())

    def shard(self, n: int) -> list:
        """Split round-robin (in send order) into ``n`` schedules."""
        if n < 1:
            raise ValueError(f"shard count must be >= 1, got {n}")
        return [Schedule(self.requests[i::n], {**self.meta, "shard": i, "shards": n}) for i in range(n)]

    def to_frame(self, with_prompts: bool = False):
        rows = [r.to_dict() for r in self.requests]
        df = pd.DataFrame(rows, columns=[f for f in PlannedRequest.__dataclass_fields__])
        return df if with_prompts else df.drop(columns=["prompt"])


# --- prompts ----------------------------------------------------------------------------------

def _encode(tokenizer, text: str) -> list:
    try:
        out = tokenizer.encode(text, add_special_tokens=False)
    except TypeError:
        out = tokenizer.encode(text)
    ids = getattr(out, "ids", out)  # a `tokenizers.Encoding` has .ids
    return [int(i) for i in ids]


def make_prompt(seed: int, tenant: int, k: int, n_tokens: int, tokenizer=None,
                as_token_ids: bool = False) -> tuple:
    """The prompt of tenant ``tenant``'s ``k``-th request: ``(prompt, prompt_tokens)``.

    Starts with a prefix unique to (seed, tenant, k); the rest are words drawn from ``WORDS`` by a
    RNG seeded with the same triple. Without a tokenizer: exactly ``n_tokens`` words. With one:
    token ids cut to exactly ``n_tokens`` (``as_token_ids``), or their decoded text, adjusted until
    it re-encodes to ``n_tokens`` where possible (the count returned is the re-encoded length).
    """
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    rng = random.Random(f"fairlib.prompt/{seed}/{tenant}/{k}")
    prefix = f"req-s{seed}-t{tenant}-n{k}"
    if tokenizer is None:
        if as_token_ids:
            raise ValueError("token-id prompts need a tokenizer")
        return " ".join([prefix, *rng.choices(WORDS, k=n_tokens - 1)]), n_tokens
    n_words = n_tokens + 8
    while True:
        ids = _encode(tokenizer, " ".join([prefix, *rng.choices(WORDS, k=n_words)]))
        if len(ids) >= n_tokens:
            break
        n_words *= 2
    if as_token_ids:
        return tuple(ids[:n_tokens]), n_tokens
    best, cut = None, n_tokens
    for _ in range(8):  # decode/encode is not always a round trip: nudge the cut point
        text = tokenizer.decode(ids[:cut])
        m = len(_encode(tokenizer, text))
        if best is None or abs(m - n_tokens) < abs(best[1] - n_tokens):
            best = (text, m)
        if m == n_tokens:
            break
        new_cut = max(1, min(len(ids), cut + n_tokens - m))
        if new_cut == cut:
            break
        cut = new_cut
    assert best is not None   # the loop ran at least once
    return best


# --- schedule ---------------------------------------------------------------------------------

_REQUIRED = ("arrival_ms", "tenant", "prompt_tokens", "output_tokens")


def _tenant_maps(values, tenant_names) -> tuple:
    """(index of each row's tenant, name of each index)."""
    if all(isinstance(v, (int,)) or (hasattr(v, "dtype") and v.dtype.kind in "iu") for v in values):
        idx = [int(v) for v in values]
        n = max(idx) + 1 if idx else 0
        if tenant_names is None:
            names = [f"tenant{i}" for i in range(n)]
        elif isinstance(tenant_names, Mapping):
            names = [str(tenant_names.get(i, f"tenant{i}")) for i in range(n)]
        else:
            names = [str(s) for s in tenant_names]
            if len(names) < n:
                raise ValueError(f"tenant_names has {len(names)} names for tenant indices up to {n - 1}")
        return idx, names
    labels = [str(v) for v in values]
    names = [str(s) for s in tenant_names] if tenant_names is not None else sorted(set(labels))
    pos = {s: i for i, s in enumerate(names)}
    missing = sorted(set(labels) - set(pos))
    if missing:
        raise ValueError(f"tenants {missing} are not in tenant_names")
    return [pos[s] for s in labels], names


def _headers(i: int, hd) -> tuple:
    """A row's ``headers`` (a mapping of name to value, or None) as sorted ``(name, value)`` pairs."""
    if hd is None or (isinstance(hd, float) and math.isnan(hd)):
        return ()
    if not isinstance(hd, Mapping):
        raise ValueError(f"row {i}: headers must be a mapping of header name to value, got {hd!r}")
    for k, v in hd.items():
        if not isinstance(k, str) or not k or any(c in k for c in ":\r\n") or any(c in str(v) for c in "\r\n"):
            raise ValueError(f"row {i}: header {k!r}: a name without ':' and a value without line breaks")
    return tuple(sorted((str(k), str(v)) for k, v in hd.items()))


def _positive_int(name, v) -> int:
    f = float(v)
    if not math.isfinite(f) or not f.is_integer() or f < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    return int(f)


def build_schedule(requests, seed: int, *, api: str = "completions", tokenizer=None,
                   token_id_prompts: Optional[bool] = None, tenant_names=None) -> Schedule:
    """Build the schedule for a workload table (a DataFrame with the columns above).

    Rows are sorted by ``arrival_ms`` (stable); ``request_id`` is the position in that order and
    request ``k`` is sent ``arrival_ms / 1000`` s after the run starts. Its prompt is
    ``make_prompt(seed, tenant, j, prompt_tokens)`` for the tenant's ``j``-th request: the same
    seed gives a byte-identical schedule (``Schedule.sha256``).

    Parameters
    ----------
    requests : pandas.DataFrame
        Columns ``arrival_ms`` (ms, finite, >= 0), ``tenant`` (int index or name),
        ``prompt_tokens`` and ``output_tokens`` (ints >= 1, ``output_tokens`` sent as
        ``max_tokens``); optional ``priority`` (int), ``api`` (per row) and ``headers`` (a
        mapping of more headers for that request).
    seed : int
        The seed of the prompts' content.
    api : {"completions", "chat"}, default "completions"
        The API of every row (an ``api`` column overrides it per row).
    tokenizer : object, optional
        Anything with ``encode``/``decode``: prompts are sized in its tokens; default
        whitespace-separated words.
    token_id_prompts : bool, optional
        Send token ids (exact lengths; completions only); default: yes when a tokenizer is given
        and the api is completions.
    tenant_names : list of str or dict, optional
        Names of integer tenants (a list, or ``{index: name}``; default ``tenant{i}``), or the
        order of string tenants (default sorted).

    Returns
    -------
    Schedule
        The planned requests (``PlannedRequest``) in send order and ``meta`` (``seed``, ``api``, ``tokenizer``,
        ``token_id_prompts``, ``tenant_names``, ``n_requests``).

    Raises
    ------
    ValueError
        A missing column, a bad ``arrival_ms``, ``api``, token count or ``headers`` value (naming
        the row), token ids asked for chat, or ``tenant_names`` missing a tenant.
    """
    missing = [c for c in _REQUIRED if c not in requests.columns]
    if missing:
        raise ValueError(f"workload table lacks columns {missing}")
    df = requests.sort_values("arrival_ms", kind="mergesort").reset_index(drop=True)
    tenant_idx, names = _tenant_maps(list(df["tenant"]), tenant_names)
    apis = list(df["api"]) if "api" in df.columns else [api] * len(df)
    prios = list(df["priority"]) if "priority" in df.columns else [0] * len(df)
    hdrs = list(df["headers"]) if "headers" in df.columns else [None] * len(df)
    per_tenant: dict = {}
    out = []
    for i, (arr, t, p, o, a, pr, hd) in enumerate(zip(df["arrival_ms"], tenant_idx, df["prompt_tokens"],
                                                      df["output_tokens"], apis, prios, hdrs)):
        arr = float(arr)
        if not math.isfinite(arr) or arr < 0:
            raise ValueError(f"row {i}: arrival_ms must be finite and >= 0, got {arr!r}")
        if a not in APIS:
            raise ValueError(f"row {i}: api must be one of {APIS}, got {a!r}")
        as_ids = (tokenizer is not None and a == "completions") if token_id_prompts is None else token_id_prompts
        if as_ids and a == "chat":
            raise ValueError("chat requests need text prompts (token_id_prompts=False)")
        k = per_tenant.get(t, 0)
        per_tenant[t] = k + 1
        prompt, n_prompt = make_prompt(seed, t, k, _positive_int("prompt_tokens", p), tokenizer, as_ids)
        prio = 0 if pr is None or (isinstance(pr, float) and math.isnan(pr)) else int(pr)
        extra = _headers(i, hd)
        out.append(PlannedRequest(i, t, names[t], arr / 1000.0, prompt, n_prompt,
                                  _positive_int("output_tokens", o), prio, a, extra))
    tok_name = None if tokenizer is None else str(getattr(tokenizer, "name_or_path", type(tokenizer).__name__))
    meta = {"seed": int(seed), "api": api, "tokenizer": tok_name or "whitespace",
            "token_id_prompts": token_id_prompts, "tenant_names": names, "n_requests": len(out)}
    return Schedule(out, meta)
