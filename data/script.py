"""Script conversion (traditional ↔ simplified) with OpenCC, for the corpus and for prompts.

The shipped corpus is in traditional script. `script='simplified'` converts it with OpenCC's
`t2s`; prompts given to a model are converted to that model's script the same way
(`t2s` for simplified models, `s2t` for traditional ones).
"""
from __future__ import annotations

from functools import lru_cache

SCRIPTS = ("simplified", "traditional")
_CORPUS = {"simplified": "t2s", "traditional": None}  # the corpus is traditional already
_PROMPT = {"simplified": "t2s", "traditional": "s2t"}


@lru_cache(maxsize=None)
def _converter(config: str):
    import opencc

    return opencc.OpenCC(config)


def _check(script: str) -> None:
    if script not in SCRIPTS:
        raise ValueError(f"unknown script {script!r}; use one of {', '.join(SCRIPTS)}")


def corpus_to_script(texts: list[str], script: str) -> list[str]:
    """Traditional-script corpus texts → `script`. raises ValueError for an unknown script."""
    _check(script)
    if _CORPUS[script] is None:
        return list(texts)
    convert = _converter(_CORPUS[script]).convert
    return [convert(t) for t in texts]


def prompt_to_script(text: str, script: str) -> str:
    """A user's text in either script → `script` (OpenCC t2s or s2t); full-width punctuation
    is kept. raises ValueError for an unknown script."""
    _check(script)
    return _converter(_PROMPT[script]).convert(text)
