"""A tokenizer over the tiny random-weight models' vocabularies (``engines/make_models.py``), for
token-id prompts of exact length."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

__all__ = ["ModelTokenizer"]


class ModelTokenizer:
    """Encode/decode over a tiny model's vocabulary (its ``tokenizer.json``), without ``tokenizers``.

    Greedy longest match over each whitespace-separated word with ``▁`` prepended. Not the
    engines' own segmentation (that does not matter here): it yields valid, ordinary token ids,
    so ``build_schedule(..., tokenizer=ModelTokenizer(folder))`` sends token-id prompts of exact
    length. Special, byte and unknown tokens are never produced.
    """

    def __init__(self, folder):
        self.folder = Path(folder)
        tj = json.loads((self.folder / "tokenizer.json").read_text(encoding="utf-8"))
        pieces = [p for p, _ in tj["model"]["vocab"]]
        self.name_or_path = str(self.folder)
        self.pieces = pieces
        special = {a["content"] for a in tj.get("added_tokens", [])}
        self.ids = {p: i for i, p in enumerate(pieces)
                    if p not in special and not (p.startswith("<0x") and p.endswith(">") and len(p) == 6)
                    and i != tj["model"].get("unk_id", 0)}
        self.max_len = max(len(p) for p in self.ids)

    def encode(self, text: str, add_special_tokens: bool = False) -> list:
        out = []
        for word in text.split():
            s = "\u2581" + word
            i = 0
            while i < len(s):
                for n in range(min(self.max_len, len(s) - i), 0, -1):
                    tid = self.ids.get(s[i:i + n])
                    if tid is not None:
                        out.append(tid)
                        i += n
                        break
                else:
                    i += 1  # a character outside the vocabulary: dropped
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.pieces[i] for i in ids).replace("\u2581", " ").lstrip(" ")
