"""Chapter 5's workload: the DriftSched protocol's requests, as the paper's generator makes them.

The paper's public code (``../shared/reference/driftsched.md``) sends 3,000 requests in two phases
(:data:`PHASES`): a calibration phase of 1,000, gaps uniform on [0.05, 0.15] s, categories
short_qa / summary / technical / report drawn 40/25/25/10 %; then a stress phase of 2,000, gaps
uniform on [0.005, 0.03] s, mix 10/20/40/30 %; tiers premium / standard / batch drawn uniformly.
Between them its generator waits for the scheduler's queue to empty (polled every 2 s) and 15 s
more for the last batch. A :class:`Protocol` says what the code does not pin, or pins differently
from the chapter's first version:

- **prompts**: the paper's generator writes ``"Request ID i. Tenant tenant-x. Job type c. "``
  before one of five one-sentence questions per category about one of ~60 topics: 12-24 words.
  :data:`TEMPLATES` and :data:`TOPICS` are the book's own sentences of the same lengths per
  category (``prompts="templates"``). The chapter's first version drew 8-600 words uniformly in a
  range per category (:data:`PROMPT_WORDS`, ``prompts="uniform"``);
- **answers**: a lognormal number of tokens cut at ``max_tokens = T_base``. The paper does not
  state its answers' lengths, but it states that with a tokenizer its bias factors stayed near 1,
  i.e. most answers reached ``max_tokens`` (its worker sends the raw prompt to a chat model at
  temperature 0.7). ``cap_share`` is the share of answers the cut reaches: the lognormal's median
  is ``T_base x exp(sigma Phi^-1(cap_share))`` in every category. The first version used the
  per-category medians of :data:`OUTPUT_TOKENS` instead (``cap_share=None``);
- **text**: the words and tokens of every prompt and answer come from one text per request and a
  real tokenizer (``fairlib.chapters.tokens``); the answers' style per category (``styles``): a
  chat model's prose for all four, or the first version's code for technical answers;
- **drain**: ``drain_s`` seconds after the queue was seen empty the stress phase starts
  (:func:`fairlib.chapters.driftsched.run_protocol` runs it: when the queue empties depends on
  the scheduler and the engine); None runs the phases back to back.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pandas as pd
from scipy.stats import norm

from fairlib.chapters.tokens import EARLIER_STYLES, STYLES, TextCounter
from fairlib.drift import CATEGORIES, T_BASE, TIERS

__all__ = ["PHASES", "PROMPT_WORDS", "OUTPUT_TOKENS", "TEMPLATES", "TOPICS", "PREFIX", "Protocol", "PAPER",
           "EARLIER", "protocol_requests", "answer_median"]

#: (name, requests, gap bounds in s, category mix in CATEGORIES' order)
PHASES = (("calibration", 1000, (0.05, 0.15), (0.40, 0.25, 0.25, 0.10)),
          ("stress", 2000, (0.005, 0.03), (0.10, 0.20, 0.40, 0.30)))
#: the first version's prompt words per category: uniform between the two bounds
PROMPT_WORDS = {"short_qa": (8, 40), "summary": (150, 600), "technical": (40, 200), "report": (60, 250)}
#: the first version's answer tokens per category: lognormal (median, sigma) before the cut at T_base
OUTPUT_TOKENS = {"short_qa": (40, 0.5), "summary": (150, 0.5), "technical": (220, 0.5), "report": (380, 0.5)}
#: what the paper's generator writes before every prompt
PREFIX = "Request ID {i}. Tenant tenant-{tier}. Job type {category}. "
#: five questions per category, the book's wording at the lengths of the paper's ({topic}: one of TOPICS)
TEMPLATES = {
    "short_qa": ("What is {topic} used for?", "How does {topic} work?", "Why does {topic} matter?",
                 "When is {topic} the right choice?", "What does {topic} do well?"),
    "summary": ("Summarize how {topic} is built and deployed.", "Summarize the main components of {topic}.",
                "Summarize the costs and benefits of {topic}.", "Summarize common failure modes of {topic}.",
                "Summarize how teams operate {topic} at scale."),
    "technical": ("Explain how {topic} works internally.", "Explain the performance limits of {topic}.",
                  "Explain how to tune {topic} for low latency.", "Explain how {topic} handles failures.",
                  "Explain what to monitor in {topic} and why."),
    "report": ("Write a detailed report on {topic}, covering design, performance, security and operations.",
               "Write a comprehensive report on deploying {topic} in production.",
               "Write a report comparing the main alternatives to {topic}.",
               "Write a report on the reliability and risks of running {topic}.",
               "Write a report on where {topic} is heading over the next five years."),
}
#: the questions' topics (the book's list: serving and infrastructure, one to three words)
TOPICS = ("DNS", "BGP", "VPN", "Kubernetes", "Docker", "Kafka", "Redis", "PostgreSQL", "TLS", "OAuth",
          "load balancing", "rate limiting", "service mesh", "CUDA", "GPU scheduling", "KV caching",
          "continuous batching", "model quantization", "vector databases", "retrieval augmented generation",
          "autoscaling", "distributed tracing", "event streaming", "edge computing", "Terraform",
          "Prometheus", "OpenTelemetry", "zero trust networking", "content delivery networks",
          "multi-tenant serving")


@dataclass(frozen=True)
class Protocol:
    """How chapter 5's requests are made (the module's docstring)."""

    #: the protocol's name in tables
    name: str
    #: "templates" (the paper's generator: prefix and one question) or "uniform" (PROMPT_WORDS)
    prompts: str = "templates"
    #: share of answers the cut at T_base reaches (0 < share < 1), or None: OUTPUT_TOKENS' medians
    cap_share: Optional[float] = 0.7
    #: the lognormal's sigma of the answers' tokens (the per-request spread)
    sigma: float = 0.5
    #: the answers' (and written prompts') style per category (fairlib.chapters.tokens.STYLES)
    styles: dict = field(default_factory=lambda: {c: "prose" for c in CATEGORIES})
    #: seconds from the queue seen empty to the stress phase, or None: back to back
    drain_s: Optional[float] = 15.0
    #: how often the generator looks at the queue (s)
    poll_s: float = 2.0

    def __post_init__(self):
        if self.prompts not in ("templates", "uniform"):
            raise ValueError(f"prompts must be 'templates' or 'uniform', got {self.prompts!r}")
        if self.cap_share is not None and not 0.0 < float(self.cap_share) < 1.0:
            raise ValueError(f"cap_share must be in (0, 1) or None, got {self.cap_share!r}")
        if not (math.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"sigma must be a finite number > 0, got {self.sigma!r}")
        bad = {c: s for c, s in self.styles.items() if s not in STYLES}
        if set(self.styles) != set(CATEGORIES) or bad:
            raise ValueError(f"styles must give each of {', '.join(CATEGORIES)} one of {', '.join(STYLES)}, "
                             f"got {self.styles!r}")
        if self.drain_s is not None and not (math.isfinite(self.drain_s) and self.drain_s >= 0):
            raise ValueError(f"drain_s must be seconds >= 0 or None, got {self.drain_s!r}")
        if not (math.isfinite(self.poll_s) and self.poll_s > 0):
            raise ValueError(f"poll_s must be seconds > 0, got {self.poll_s!r}")


#: the paper's protocol: its prompts, most answers at the cap in prose, the drain
PAPER = Protocol("paper")
#: the chapter's first version: uniform prompt lengths, the book's answer medians and styles, no drain
EARLIER = Protocol("earlier", prompts="uniform", cap_share=None, styles=dict(EARLIER_STYLES), drain_s=None)


def answer_median(category: str, protocol: Protocol) -> float:
    """The lognormal median of ``category``'s answer tokens: ``T_base x exp(sigma Phi^-1(share))``
    (the cut at ``T_base`` then reaches ``share`` of the answers), or OUTPUT_TOKENS' median."""
    if protocol.cap_share is None:
        return float(OUTPUT_TOKENS[category][0])
    return float(T_BASE[category] * math.exp(protocol.sigma * norm.ppf(protocol.cap_share)))


def protocol_requests(seed: int, tokenizer=None, n_cal: Optional[int] = None, n_stress: Optional[int] = None,
                      protocol: Protocol = PAPER) -> pd.DataFrame:
    """The protocol's 3,000 requests (the module's docstring), seeded. Per request: ``arrival_ms``
    with the phases back to back, ``gap_ms`` (the gap before it), ``drain_s`` and ``poll_s`` (the
    protocol's; ``drain_s`` NaN: none), ``phase``, ``category``, ``tier`` (0 premium, 1 standard, 2 batch), prompt words
    and tokens, the answer's true tokens, its tokens and words after the cut and whether it was
    cut. ``tokenizer``: a ``fairlib.chapters.tokens.TextCounter`` (default the book's)."""
    tc = tokenizer or TextCounter()
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 5005]))
    rows: list = []
    prompts: list = []
    t = 0.0
    for name, n_phase, (g0, g1), mix in PHASES:
        asked = n_cal if name == "calibration" else n_stress
        n = int(n_phase if asked is None else asked)
        gaps = rng.uniform(g0, g1, n)
        cats = rng.choice(len(CATEGORIES), n, p=np.asarray(mix) / sum(mix))
        tiers = rng.integers(0, len(TIERS), n)
        for i in range(n):
            t += gaps[i] * 1e3
            c = CATEGORIES[cats[i]]
            if protocol.prompts == "uniform":
                lo, hi = PROMPT_WORDS[c]
                prompts.append(int(rng.integers(lo, hi + 1)))
            else:
                q = TEMPLATES[c][int(rng.integers(0, len(TEMPLATES[c])))]
                topic = TOPICS[int(rng.integers(0, len(TOPICS)))]
                prompts.append(PREFIX.format(i=len(rows), tier=TIERS[tiers[i]], category=c) + q.format(topic=topic))
            sig = OUTPUT_TOKENS[c][1] if protocol.cap_share is None else protocol.sigma
            true = max(1, int(round(rng.lognormal(math.log(answer_median(c, protocol)), sig))))
            rows.append({"arrival_ms": t, "gap_ms": gaps[i] * 1e3, "phase": name, "category": c,
                         "tier": int(tiers[i]), "true_tokens": true})
    df = pd.DataFrame(rows)
    df["drain_s"] = np.nan if protocol.drain_s is None else float(protocol.drain_s)
    df["poll_s"] = float(protocol.poll_s)
    caps = [T_BASE[c] for c in df["category"]]
    counts = tc.count_requests(df["category"].tolist(), prompts, np.minimum(df["true_tokens"], caps).tolist(), seed,
                               styles=protocol.styles)
    df["prompt_words"], df["prompt_tokens"], df["output_tokens"], df["output_words"] = counts
    df["cut"] = df["true_tokens"] >= df["category"].map(T_BASE)
    df.attrs["protocol"] = protocol.name
    return df
