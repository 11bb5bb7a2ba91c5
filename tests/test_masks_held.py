"""The masks held across the sampler's redesign: for every control combination the tests exercise
(each form with and without rhyme, meter, acrostic, keywords, prompt, title (its plan as before, title_plan=echo, and as
planned since issue 60), and the pairs of them
the tests combine; five tunes with each; hard on a model without plan tokens, both and soft on one
with them), the set of tokens the
processors allow at every step of 20 seeded poems equals what tests/data/masks.json recorded
(`python -m tests.test_masks_held --write`, first written on the sampler before the redesign).

Each combination keeps a digest of every step's allowed set (sha256 of the (B, V) bool masks in
order) and a digest of each of the 20 poems drawn (so a difference shows which poem parts first). `CHANGED` lists the
combinations whose rules change on purpose, with the reason; they are recorded anew.

The models are untrained and seeded, in float64, so the draws do not depend on the CPU's float
rounding.
"""
from __future__ import annotations

import hashlib
import json
import sys
from itertools import islice
from pathlib import Path

import pytest
import torch

from data.corpus_io import iter_corpus
from data.tokenizer import CharTokenizer
from data.verse.plan import plan_labels
from data.verse.poetry import FORMS
from data.verse.tunes import tunes
from model.sampling.poems import SamplingOptions, poem_steps, poem_text
from model.training.lit import LitGPT

MASKS = Path(__file__).parent / "data" / "masks.json"
CORPUS = Path(__file__).parents[1] / "data" / "corpus" / "ci.jsonl.xz"
TUNES = ("浣溪沙", "菩萨蛮", "水调歌头", "西江月", "如梦令")
ACROSTIC = "春花秋月何时了往事知多少小楼昨夜又东风故国不堪回首月明中"
BOUND = "西江月 binds its 仄 segment to its 平 rhyme's 部 (叶韵, 94 % of its training 词: docs/tunes.md)"
ONE_SEARCH = ("one keyword placement for 诗 and 词: no keyword takes a rhyming line's last character, "
              "under rhyme or meter too (the 词's rule; a 诗's keyword could end on a rhyme that rhymed)")
TWO_TEMPLATES = ("an acrostic without a form is two templates, every line of 5 or of 7, and its keywords are placed "
                 "in both (the 诗 sampler placed them in lines of 5 until a line had a 6th character)")
SUB_TOPICS = ("issue 60: the title plan's words are the title's sub-topics (expansion first), a word a couplet "
              "of a form, and the plan leans the logits toward its words' characters (topic_lean: the characters "
              "drawn change, and the masks that follow them); title_plan=echo, the plan before, holds the first "
              "recording ('title'); recorded anew at topic_lean 16 (2026-12-07: at 8 the recording before still held)")
CHANGED: dict[str, str] = {
    **{f"西江月+{extra}+{control}": BOUND for extra in ("rhyme", "rhyme-keywords", "rhyme-prompt")
       for control in ("hard", "both")},
    **{f"wujue+meter-keywords+{control}": ONE_SEARCH for control in ("hard", "both")},
    **{f"free+acrostic-keywords+{control}": TWO_TEMPLATES for control in ("hard", "both")},
    **{f"{what}+title-plan+both": SUB_TOPICS for what in (*FORMS, *TUNES)},
}
"""Combination → why its masks changed on purpose (recorded anew, on the redesigned sampler, with
`python -m tests.test_masks_held --changed`); every other one holds the first recording's."""


def models() -> dict[str, LitGPT]:
    """'plain': no plan tokens (hard masks only); 'plan': plan tokens, condition segments and tune
    tokens. Both over the characters of the first 3,000 词 of the corpus (simplified), seeded."""
    texts = [p["text"] for p in islice(iter_corpus(CORPUS), 3000)]
    out = {}
    for name, labels in (("plain", ()), ("plan", plan_labels(segments=True, tunes=True))):
        torch.manual_seed(0)
        tok = CharTokenizer.from_texts([*texts, "静夜思明月故乡"], labels)
        model = {"block_size": 192, "n_layer": 1, "n_head": 2, "n_embd": 16}
        out[name] = LitGPT(model, {"lr": 1e-3}, tok.state_dict(), script="simplified").double().eval()
    return out


def combinations() -> dict[str, tuple[str, dict]]:
    """Name → (model, options) of every combination."""
    out = {}
    for what, n_lines in [*((f, FORMS[f][0]) for f in FORMS), *((t, len(tunes()[t][0].lines)) for t in TUNES)]:
        base = {"form": what} if what in FORMS else {"tune": what}
        extras = {"": {}, "rhyme": {"rhyme": True}, "meter": {"meter": True}, "acrostic": {"acrostic": ACROSTIC[:n_lines]},
                  "keywords": {"keywords": ["明月", "故乡"]}, "prompt": {"prompt": "春风"},
                  "title": {"title": "静夜思", "title_plan": "echo"}, "title-plan": {"title": "静夜思"}}
        for extra, opts in extras.items():
            for model, control in (("plain", "hard"), ("plan", "both")):
                if extra.startswith("title") and model == "plain":
                    continue
                out[f"{what}+{extra or 'alone'}+{control}"] = model, {**base, **opts, "control": control}
        out[f"{what}+soft"] = "plan", {**base, "control": "soft"}
    words = ["明月", "故乡"]
    for what, n_lines in [*((f, FORMS[f][0]) for f in FORMS), *((t, len(tunes()[t][0].lines)) for t in TUNES)]:
        base = {"form": what} if what in FORMS else {"tune": what}
        pairs = {"rhyme-keywords": {"rhyme": True, "keywords": words}, "meter-keywords": {"meter": True, "keywords": words},
                 "meter-acrostic": {"meter": True, "acrostic": ("白花千月" * 2 if what in FORMS else ACROSTIC)[:n_lines]},
                 "rhyme-prompt": {"rhyme": True, "prompt": "春风"}, "acrostic-keywords": {"acrostic": ACROSTIC[:n_lines],
                                                                                         "keywords": words}}
        for extra, opts in pairs.items():
            for model, control in (("plain", "hard"), ("plan", "both")):
                out[f"{what}+{extra}+{control}"] = model, {**base, **opts, "control": control}
    for extra, opts in {"acrostic": {"acrostic": "春花秋月"}, "acrostic-rhyme": {"acrostic": "春花秋月", "rhyme": True},
                        "keywords": {"keywords": ["明月", "故乡"]},
                        "acrostic-keywords": {"acrostic": "春花秋月", "keywords": ["明月", "故乡"]}}.items():
        for model, control in (("plain", "hard"), ("plan", "both")):
            out[f"free+{extra}+{control}"] = model, {**opts, "control": control}
    return out


def record(lit: LitGPT, opts: dict) -> dict:
    """{"digest": sha256 of every step's allowed set, "poems": a digest of each of the 20 poems}, or
    {"refused": True} for options refused before sampling."""
    o = SamplingOptions(num_samples=20, temperature=1.0, top_k=None, top_p=None, seed=11, max_new_tokens=160, **opts)
    try:
        start, steps, _ = poem_steps(lit.engine, o)
    except ValueError:
        return {"refused": True}
    digest, chunks = hashlib.sha256(), [start]
    for step in steps:
        if isinstance(step, torch.Tensor):  # a prompt after the drawn plan
            chunks.append(step)
            continue
        digest.update(step.allowed.numpy().tobytes())
        chunks.append(step.ids)
    rows = torch.cat(chunks, dim=1)
    poems = [poem_text(lit.engine.tokenizer, r) for r in rows]
    return {"digest": digest.hexdigest(), "poems": [hashlib.sha256(p.encode()).hexdigest()[:10] for p in poems]}


def recorded() -> dict[str, dict]:
    built = models()
    return {name: record(built[model], opts) for name, (model, opts) in combinations().items()}


@pytest.fixture(scope="module")
def built():
    return models()


@pytest.mark.parametrize("name", sorted(combinations()))
def test_the_masks_of_every_control_combination_are_held(built, name):
    want = json.loads(MASKS.read_text(encoding="utf-8"))[name]
    model, opts = combinations()[name]
    got = record(built[model], opts)
    parted = next((i for i, (a, b) in enumerate(zip(want["poems"], got["poems"])) if a != b), None)
    assert got == want, f"{name}: masks differ; first poem that parts: {parted}"


if __name__ == "__main__" and sys.argv[1:] in (["--write"], ["--changed"]):
    if sys.argv[1] == "--write":
        masks = recorded()
    else:
        built, masks = models(), json.loads(MASKS.read_text(encoding="utf-8"))
        masks |= {name: record(built[combinations()[name][0]], combinations()[name][1]) for name in CHANGED}
    MASKS.write_text(json.dumps(masks, ensure_ascii=False, indent=0), encoding="utf-8")
    print(f"wrote {MASKS}")
