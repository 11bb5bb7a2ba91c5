"""Character-level tokenizer: one id per character, plus start and end of poem.

The vocabulary is `SPECIALS` followed by the corpus characters in code-point order, so the
same corpus always gives the same ids. Its state travels inside every checkpoint.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

BOS, EOS = "<bos>", "<eos>"
SPECIALS = (BOS, EOS)


class UnknownCharactersError(ValueError):
    """Raised when text holds characters outside the vocabulary; `.unknown` lists them."""

    def __init__(self, unknown: list[str], hint: str = ""):
        self.unknown = unknown
        shown = "".join(unknown[:50]) + ("…" if len(unknown) > 50 else "")
        super().__init__(
            f"{len(unknown)} character(s) are not in the model's vocabulary: {shown} "
            f"({', '.join(f'U+{ord(c):04X}' for c in unknown[:10])}). "
            "Remove or replace them; the vocabulary is the training corpus's characters."
            + (f" {hint}" if hint else "")
        )


class CharTokenizer:
    """Maps characters to ids and back.

    chars: the vocabulary's characters (specials are added in front). Ids are `int` in
    `[0, vocab_size)`; `bos_id` = 0, `eos_id` = 1.
    """

    def __init__(self, chars: Iterable[str]):
        chars = sorted(set(chars) - set(SPECIALS))
        if any(len(c) != 1 for c in chars):
            raise ValueError("CharTokenizer takes single characters")
        self.itos: list[str] = [*SPECIALS, *chars]
        self.stoi: dict[str, int] = {s: i for i, s in enumerate(self.itos)}
        self.bos_id, self.eos_id = self.stoi[BOS], self.stoi[EOS]

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> "CharTokenizer":
        """Vocabulary = every character that occurs in `texts`."""
        chars: set[str] = set()
        for text in texts:
            chars.update(text)
        return cls(chars)

    @property
    def vocab_size(self) -> int:
        """Number of ids: the characters plus `<bos>` and `<eos>`."""
        return len(self.itos)

    def unknown(self, text: str) -> list[str]:
        """Characters of `text` outside the vocabulary, in order of first appearance."""
        return list(dict.fromkeys(c for c in text if c not in self.stoi))

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        """text → ids, optionally framed by `<bos>` / `<eos>`.

        raises UnknownCharactersError listing every character outside the vocabulary.
        """
        if missing := self.unknown(text):
            raise UnknownCharactersError(missing)
        ids = [self.stoi[c] for c in text]
        return [self.bos_id] * bos + ids + [self.eos_id] * eos

    def decode(self, ids: Iterable[int], skip_specials: bool = True) -> str:
        """ids → text; `<bos>`/`<eos>` are dropped unless `skip_specials=False`.

        raises IndexError for an id outside `[0, vocab_size)`.
        """
        out = []
        for i in ids:
            s = self.itos[int(i)]
            if not (skip_specials and s in SPECIALS):
                out.append(s)
        return "".join(out)

    def state_dict(self) -> dict:
        """JSON-able state, stored in checkpoints; inverse of `from_state_dict`."""
        return {"kind": "char", "itos": self.itos}

    @classmethod
    def from_state_dict(cls, state: dict) -> "CharTokenizer":
        """raises ValueError if `state` is not a character tokenizer's state."""
        if state.get("kind") != "char" or tuple(state["itos"][: len(SPECIALS)]) != SPECIALS:
            raise ValueError("not a character tokenizer state (kind must be 'char', specials first)")
        tok = cls(state["itos"][len(SPECIALS):])
        if tok.itos != state["itos"]:
            raise ValueError("character tokenizer state is not sorted; it was not written by this project")
        return tok

    def save(self, path: str | Path) -> None:
        """Write the state as UTF-8 JSON to `path`."""
        Path(path).write_text(json.dumps(self.state_dict(), ensure_ascii=False))

    @classmethod
    def load(cls, path: str | Path) -> "CharTokenizer":
        """Read a tokenizer written by `save`. raises ValueError if it is not a character tokenizer."""
        return cls.from_state_dict(json.loads(Path(path).read_text()))
