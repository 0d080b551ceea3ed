"""Output-length estimation with drift correction (DriftSched, chapter 5).

The estimate a scheduler makes at admission of how many tokens a request will generate:

    T = int(T_base[c] x B[k] x S[tier] x F_input)        F_input = min(1.5, 1 + input_len / 1000)

with ``c`` the request's category (``T_base``: short_qa 64, summary 256, technical 384, report
512; also the ``max_tokens`` it is sent with), ``tier`` its tenant's (``S``: premium 1.2,
standard 1.0, batch 0.8: a safety factor), ``input_len`` its prompt length (words with the
whitespace proxy, tokens with a tokenizer) and ``B[k]`` a bias factor learnt from what finished
requests actually generated, keyed by category (the paper's ``k = c``) or by tenant tier:

    m = clamp(actual / T_base[c], 0.25, 3.0)            B[k] <- (1 - alpha) B[k] + alpha m,  alpha = 0.1

starting at ``B = 1``. ``actual`` is in the same unit as the count: words of the answer with the whitespace proxy, tokens
with a tokenizer.

An answer cut at ``max_tokens`` is **right-censored**: its true length is at least ``actual``. The
correction takes it as the length, as the paper does; with ``max_tokens = T_base`` that is
``m = 1``, the largest value ``m`` can take, so a rule that lets a cut answer only raise the factor
(``B <- B + alpha max(0, m - B)``) would change nothing. What the cut hides is the length
distribution above it: :func:`censored_lognormal` estimates it from answers some of which are
cut (a right-censored maximum-likelihood fit of log lengths), and :func:`lognormal_mean` /
:func:`lognormal_capped_mean` give the uncut and the served mean it implies.

The parameters are those of the paper's public code (``../shared/reference/driftsched.md``).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

__all__ = ["CATEGORIES", "T_BASE", "TIERS", "S_TENANT", "ALPHA", "CLAMP", "F_INPUT_CAP", "f_input",
           "DriftEstimator", "censored_lognormal", "lognormal_mean", "lognormal_capped_mean"]

CATEGORIES = ("short_qa", "summary", "technical", "report")
T_BASE = {"short_qa": 64, "summary": 256, "technical": 384, "report": 512}
TIERS = ("premium", "standard", "batch")
S_TENANT = {"premium": 1.2, "standard": 1.0, "batch": 0.8}
ALPHA = 0.1
CLAMP = (0.25, 3.0)
F_INPUT_CAP = 1.5
KEYS = ("category", "tier")


def f_input(input_len: float) -> float:
    """``min(1.5, 1 + input_len / 1000)``: longer prompts are expected to get longer answers."""
    if isinstance(input_len, bool) or not isinstance(input_len, numbers.Real) or not input_len >= 0:
        raise ValueError(f"input_len must be a number >= 0, got {input_len!r}")
    return min(F_INPUT_CAP, 1.0 + float(input_len) / 1000.0)


def _check(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return value


@dataclass
class DriftEstimator:
    """The estimate and its online correction (the module's docstring). ``adaptive=False`` keeps
    every ``B`` at 1: the static baseline the paper compares with."""

    alpha: float = ALPHA
    key: str = "category"
    adaptive: bool = True
    bias: dict = field(default_factory=dict)
    updates: int = 0

    def __post_init__(self):
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be a number in (0, 1], got {self.alpha!r}")
        _check("key", self.key, KEYS)
        keys = CATEGORIES if self.key == "category" else TIERS
        self.bias = {k: float(self.bias.get(k, 1.0)) for k in keys}

    def key_of(self, category: str, tier: str) -> str:
        """The factor a request of ``category`` and ``tier`` uses: its category's, or its tier's."""
        return category if self.key == "category" else tier

    def estimate(self, category: str, tier: str, input_len: float) -> int:
        """``int(T_base[c] x B x S[tier] x F_input)``, at least 1."""
        _check("category", category, CATEGORIES)
        _check("tier", tier, TIERS)
        t = T_BASE[category] * self.bias[self.key_of(category, tier)] * S_TENANT[tier] * f_input(input_len)
        return max(1, int(t))

    def observe(self, category: str, tier: str, actual: float) -> Optional[float]:
        """A finished request generated ``actual`` (words or tokens, as counted). Returns the new
        factor (None when not adaptive)."""
        _check("category", category, CATEGORIES)
        _check("tier", tier, TIERS)
        if not self.adaptive:
            return None
        if isinstance(actual, bool) or not isinstance(actual, numbers.Real) or not math.isfinite(actual) or actual < 0:
            raise ValueError(f"actual must be a finite number >= 0, got {actual!r}")
        m = min(CLAMP[1], max(CLAMP[0], float(actual) / T_BASE[category]))
        k = self.key_of(category, tier)
        b = (1.0 - self.alpha) * self.bias[k] + self.alpha * m
        self.bias[k] = b
        self.updates += 1
        return b


def _phi(z):
    return math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def _sf(z):
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def censored_lognormal(lengths, cut, cap: float, iters: int = 500, tol: float = 1e-12) -> tuple:
    """``(mu, sigma)`` of ``log X`` from lengths of which those with ``cut`` True were stopped at
    ``cap`` (true length ``>= cap``): the maximum-likelihood fit of a right-censored normal on the
    log lengths, by EM. With ``y = log x``, ``c = log cap``, ``a = (c - mu) / sigma`` and
    ``l = phi(a) / (1 - Phi(a))``, a censored value contributes ``E[y] = mu + sigma l`` and
    ``E[y^2] = mu^2 + sigma^2 + sigma (c + mu) l``; then ``mu`` and ``sigma^2`` are the moments of
    the completed sample. Without cut values: the mean and the population sd of ``log x``."""
    x = np.asarray(lengths, float)
    k = np.asarray(cut, bool)
    if x.shape != k.shape or x.ndim != 1 or len(x) < 2:
        raise ValueError("lengths and cut must be 1-d and of the same length (at least 2)")
    if not (x > 0).all() or not np.isfinite(x).all():
        raise ValueError("lengths must be finite and > 0")
    if (~k).sum() < 2:
        raise ValueError("at least two lengths must be uncut")
    y, c, n, nc = np.log(x[~k]), math.log(cap), len(x), int(k.sum())
    s1, s2 = float(y.sum()), float((y * y).sum())
    mu, var = float(y.mean()), float(y.var())
    for _ in range(iters):
        sd = math.sqrt(var)
        a = (c - mu) / sd
        lam = _phi(a) / max(_sf(a), 1e-300)
        ey = mu + sd * lam
        ey2 = mu * mu + var + sd * (c + mu) * lam
        mu_new = (s1 + nc * ey) / n
        var_new = max((s2 + nc * ey2) / n - mu_new * mu_new, 1e-12)
        done = abs(mu_new - mu) < tol and abs(var_new - var) < tol
        mu, var = mu_new, var_new
        if done:
            break
    return mu, math.sqrt(var)


def lognormal_mean(mu: float, sigma: float) -> float:
    """``E[X] = exp(mu + sigma^2 / 2)``: the uncut mean."""
    return math.exp(mu + 0.5 * sigma * sigma)


def lognormal_capped_mean(mu: float, sigma: float, cap: float) -> float:
    """``E[min(X, cap)] = exp(mu + sigma^2/2) Phi((c - mu - sigma^2) / sigma) + cap (1 - Phi((c - mu) / sigma))``,
    ``c = log cap``: the mean of what an engine serves when it cuts at ``cap``."""
    c = math.log(cap)
    return (lognormal_mean(mu, sigma) * (1.0 - _sf((c - mu - sigma * sigma) / sigma))
            + cap * _sf((c - mu) / sigma))
