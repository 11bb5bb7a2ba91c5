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
_REFERENCE = {"simplified": "t2s", "traditional": "tw2t"}  # Taiwan-standard glyphs → the corpus's
_VARIANTS = ("t2s", "s2t", "tw2t", "hk2t", "jp2t", "t2tw", "t2hk", "tw2s", "hk2s")


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


HALF_TO_FULL = str.maketrans(",.?!;:", "，。？！；：")
"""ASCII punctuation typed for the full-width marks the corpus uses."""


def prompt_to_script(text: str, script: str) -> str:
    """A user's text in either script → `script` (OpenCC t2s or s2t); full-width punctuation
    is kept, ASCII `,.?!;:` made full-width as in the corpus. raises ValueError for an
    unknown script."""
    _check(script)
    return _converter(_PROMPT[script]).convert(text.translate(HALF_TO_FULL))


def reference_to_script(text: str, script: str) -> str:
    """Text in the Taiwan-standard glyphs of reference tables (為, 床) → `script`'s glyphs:
    OpenCC `t2s` for simplified, `tw2t` for the corpus's traditional (爲, 牀).
    raises ValueError for an unknown script."""
    _check(script)
    return _converter(_REFERENCE[script]).convert(text)


def variants(char: str) -> set[str]:
    """Other glyphs OpenCC gives for `char` (simplified, traditional, Taiwan, Hong Kong and
    Japanese standards), without `char` itself: `爲` → {`为`, `為`}."""
    return {_converter(config).convert(char) for config in _VARIANTS} - {char}
