"""The gateway's output-length estimate (chapter 5): DriftSched's estimator at admission, corrected
by every answer that comes back (``fairlib.drift``).

A request names its category in the header ``x-fairlib-category`` (short_qa, summary, technical,
report); without it a text prompt is classified by the paper's keywords ("summar" -> summary;
"detailed", "report", "comprehensive" -> report; "architecture", "code", "technical" ->
technical; otherwise short_qa; a chat's message contents are read), a token-id prompt is
short_qa. Its tier (premium, standard, batch) is its tenant's (the tenants file's ``tier``: a
client cannot raise its own safety factor), else the header ``x-fairlib-tier``, else standard. The estimate, ``T = int(T_base x B x S x F_input)``, with ``input_len`` the prompt as the
gateway counts it (words of a text prompt, tokens of a token-id prompt), becomes the request's
estimated budget ``input_len + T``, what ``sjf`` orders by. When an answer finishes, ``B`` learns
from it: its tokens (``counting="tokens"``) or the whitespace words of its text
(``counting="words"``, the paper's whitespace proxy). An answer cut at ``max_tokens`` is taken as
its length, as the paper does (``fairlib.drift`` says why a lower-bound rule would change
nothing).
"""
from __future__ import annotations

from typing import Optional

from fairlib.drift import CATEGORIES, TIERS, DriftEstimator
from fairlib.protocol.wire import ParamError

__all__ = ["GatewayEstimator", "HeaderError", "CATEGORY_HEADER", "TIER_HEADER", "classify", "COUNTINGS"]

CATEGORY_HEADER = "x-fairlib-category"
TIER_HEADER = "x-fairlib-tier"
COUNTINGS = ("tokens", "words")


def classify(prompt) -> str:
    """The paper's keyword classifier on a text prompt; a token-id prompt: short_qa."""
    if not isinstance(prompt, str):
        return "short_qa"
    p = prompt.lower()
    if "summar" in p:
        return "summary"
    if any(w in p for w in ("detailed", "report", "comprehensive")):
        return "report"
    if any(w in p for w in ("architecture", "code", "technical")):
        return "technical"
    return "short_qa"


class HeaderError(ParamError):
    """A bad estimator header; ``param`` names it (OpenAI's error JSON carries it)."""

    def __init__(self, param: str, message: str):
        super().__init__(message, param)


class GatewayEstimator:
    """DriftSched's estimator behind the gateway (the module's docstring)."""

    def __init__(self, counting: str = "tokens", key: str = "category"):
        if counting not in COUNTINGS:
            raise ValueError(f"--estimator must be one of {', '.join(COUNTINGS)}, got {counting!r}")
        self.counting = counting
        self.est = DriftEstimator(key=key)
        self.observed = 0

    def describe(self, headers, prompt, tenant_tier: Optional[str]) -> tuple:
        """``(category, tier)`` of a request, or ``ValueError`` naming a bad header."""
        cat = headers.get(CATEGORY_HEADER)
        if cat is None:
            cat = classify(prompt)
        elif cat not in CATEGORIES:
            raise HeaderError(CATEGORY_HEADER, f"header {CATEGORY_HEADER} must be one of {', '.join(CATEGORIES)}, "
                                               f"got {cat!r}")
        tier = tenant_tier or headers.get(TIER_HEADER) or "standard"
        if tier not in TIERS:
            raise HeaderError(TIER_HEADER, f"header {TIER_HEADER} must be one of {', '.join(TIERS)}, got {tier!r}")
        return cat, tier

    def budget(self, category: str, tier: str, input_len: int) -> tuple:
        """``(estimate, budget)``: the answer's estimated length and ``input_len + estimate``."""
        t = self.est.estimate(category, tier, input_len)
        return t, int(input_len) + t

    def finished(self, category: str, tier: str, tokens: int, text: str) -> Optional[float]:
        """An answer came back: the factor learns from it; returns the new factor (None when
        the estimator is not adaptive)."""
        actual = tokens if self.counting == "tokens" else len(text.split())
        self.observed += 1
        return self.est.observe(category, tier, float(actual))

    def state(self) -> dict:
        return {"counting": self.counting, "key": self.est.key,
                "bias": dict(self.est.bias), "observed": self.observed}
