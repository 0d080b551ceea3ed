"""One streamed response folded into the facts a record needs (``StreamAccumulator``).

It reads the chunks ``fairlib.protocol.sse`` decodes and interprets: the arrival time and token
count of each token-bearing chunk (completions ``choices[0].text``, chat
``choices[0].delta.content``; a chat role-only chunk carries no token), ``finish_reason``,
``usage`` (vLLM's ``choices: []`` chunk, llama.cpp's final chunk), llama.cpp's ``timings``, and
token ids (vLLM ``return_token_ids``). The completion length comes from ``usage`` or token ids,
never from chunks; the tokens of each chunk (``chunk_tokens``) come from the first source the
server gives for every token chunk (``StreamAccumulator.resolve_chunk_tokens``):

1. ``usage``: per-chunk usage (vLLM ``continuous_usage_stats``): the chunk's tokens are the rise
   of the cumulative ``usage.completion_tokens`` since the chunk before;
2. ``token_ids``: ``len(token_ids)``;
3. ``text``: the chunk's whitespace-separated words ``w_i`` (at least 1). When the total ``N``
   is known (``usage``, or token ids on some chunks) and ``N >= k`` (the number of token
   chunks), chunk ``i`` gets ``1 + e_i``, the ``N - k`` extra tokens ``e_i`` shared in
   proportion to ``w_i - 1`` (to the text's characters when every chunk is one word) by largest
   remainder: the counts sum to ``N`` and equal ``w_i`` whenever ``sum(w_i) = N``. When
   ``N < k``, ``N`` is shared in proportion to ``w_i``; when ``N`` is unknown, the counts are ``w_i``.

Where a chunk held ``NaN`` or ``Infinity`` (read as ``None`` by ``loads_finite``) is kept in
``StreamAccumulator.nonfinite`` (``"usage.completion_tokens=NaN"``) for the record to flag.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from fairlib.protocol.sse import ChunkInfo, interpret_chunk

__all__ = ["StreamAccumulator", "MAX_NONFINITE"]

MAX_NONFINITE = 20  # paths kept per record


def _apportion(total: int, weights: list) -> list:
    """``total`` split in proportion to ``weights`` by largest remainder (ties: the earlier)."""
    w_sum = sum(weights)
    if w_sum <= 0:
        weights, w_sum = [1] * len(weights), len(weights)
    quotas = [total * w / w_sum for w in weights]
    out = [int(q) for q in quotas]
    order = sorted(range(len(quotas)), key=lambda i: (out[i] - quotas[i], i))
    for i in order[:total - sum(out)]:
        out[i] += 1
    return out


@dataclass
class StreamAccumulator:
    """Folds one response's chunks (with their arrival times) into timing and token facts."""

    chunk_times: list = field(default_factory=list)   # arrival of each token-bearing chunk
    finish_reason: Optional[str] = None
    usage: Optional[dict] = None
    server_timings: Optional[dict] = None
    token_id_count: int = 0
    saw_token_ids: bool = False
    done: bool = False
    n_chunks: int = 0  # every decoded JSON chunk, token-bearing or not
    text_chars: int = 0
    streamed: Optional[bool] = None  # True: an SSE stream; False: one JSON body (stream ignored)
    nonfinite: list = field(default_factory=list)  # where NaN/Infinity were, as loads_finite says
    # per token chunk, for resolve_chunk_tokens: token ids (None if absent), the cumulative
    # usage.completion_tokens it carried (None if absent), its words and characters
    _ids: list = field(default_factory=list, repr=False)
    _usage_ct: list = field(default_factory=list, repr=False)
    _words: list = field(default_factory=list, repr=False)
    _chars: list = field(default_factory=list, repr=False)
    _last_usage_ct: int = field(default=0, repr=False)

    def add(self, payload: dict, t: float, nonfinite=()) -> ChunkInfo:
        """Fold one decoded chunk arrived at run time ``t``; ``nonfinite`` as ``decode_event`` gives it."""
        for where in nonfinite:  # each place once, at most MAX_NONFINITE
            if where not in self.nonfinite and len(self.nonfinite) < MAX_NONFINITE:
                self.nonfinite.append(where)
        info = interpret_chunk(payload)
        self.n_chunks += 1
        ct = info.usage.get("completion_tokens") if info.usage is not None else None
        ct = ct if isinstance(ct, int) and not isinstance(ct, bool) else None
        if info.is_token_chunk:
            self.chunk_times.append(t)
            self.text_chars += len(info.text)
            self._ids.append(None if info.token_ids is None else len(info.token_ids))
            self._usage_ct.append(None if ct is None else ct - self._last_usage_ct)
            self._words.append(max(1, len(info.text.split())))
            self._chars.append(max(1, len(info.text)))
        if ct is not None:
            self._last_usage_ct = ct
        if info.token_ids is not None:
            self.saw_token_ids = True
            self.token_id_count += len(info.token_ids)
        if info.finish_reason is not None:
            self.finish_reason = info.finish_reason
        if info.usage is not None:
            self.usage = info.usage
        if info.timings is not None or info.extra:
            st = dict(self.server_timings or {})
            st.update(info.timings or {})
            st.update(info.extra or {})
            self.server_timings = st
        return info

    def resolve_chunk_tokens(self) -> tuple:
        """``(tokens per token chunk, source)``, source ``"usage"``, ``"token_ids"`` or ``"text"``
        (``None`` without token chunks): the rules in the module's docstring."""
        if not self.chunk_times:
            return [], None
        if None not in self._usage_ct:
            return list(self._usage_ct), "usage"
        if None not in self._ids:
            return list(self._ids), "token_ids"
        words, k = self._words, len(self._words)
        n = self.completion_tokens
        if n is None or n == sum(words):
            return list(words), "text"
        if n < k:
            return _apportion(n, words), "text"
        extra = [w - 1 for w in words]
        extra = _apportion(n - k, extra if sum(extra) > 0 else self._chars)
        return [1 + e for e in extra], "text"

    @property
    def chunk_tokens(self) -> list:
        """Tokens each token chunk carried (``resolve_chunk_tokens``)."""
        return self.resolve_chunk_tokens()[0]

    @property
    def first_token_t(self) -> Optional[float]:
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def last_token_t(self) -> Optional[float]:
        return self.chunk_times[-1] if self.chunk_times else None

    @property
    def completion_tokens(self) -> Optional[int]:
        """From ``usage.completion_tokens``, else from token ids; ``None`` if neither was sent."""
        src = self.tokens_source
        if src == "usage" and self.usage is not None:
            return int(self.usage["completion_tokens"])
        if src == "token_ids":
            return self.token_id_count
        return None

    @property
    def tokens_source(self) -> Optional[str]:
        if self.usage is not None and isinstance(self.usage.get("completion_tokens"), int):
            return "usage"
        if self.saw_token_ids:
            return "token_ids"
        return None
