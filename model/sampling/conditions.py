"""What a poem is written to, for a model trained with conditions (`data.conditions`,
`data/conditions.py`): a title, a poet's voice, keywords as hints. They go into the poem's
condition segment (`data.verse.plan.segment_ids`), given after `<bos>`, before the plan the
model draws; nothing masks the poem for them (forced keywords are `model.sampling.keywords`).

Checked before sampling, each refusal one line: a model without conditions; a title of other
than CJK characters or longer than `MAX_TITLE`; a poet the model was not trained with (the
nearest names said; `poets=list` lists them).
"""
from __future__ import annotations

from difflib import SequenceMatcher
from typing import Sequence

from data.keywords import per_row
from data.verse.plan import MAX_TITLE, plan_ids, segment_ids
from data.verse.poetry import is_hanzi
from model.engine import Engine


def known_poets(engine: Engine) -> dict[str, int]:
    """{poet: training poems} a model was trained to write as (most prolific first; {} for a
    model without conditions)."""
    return dict(engine.meta.poets)


def has_conditions(engine: Engine) -> bool:
    """Whether the model was trained with condition segments (its tokenizer has the markers)."""
    ids = plan_ids(engine.tokenizer)
    return bool(ids and ids.segments)


def check_title(engine: Engine, title: str) -> str:
    """A user's title (either script, spaces and 《》 dropped) in the model's script. raises
    ValueError for a model without conditions, other than CJK characters, or more than `MAX_TITLE`."""
    title = "".join(c for c in title.strip() if c not in " 《》\u3000")
    if not title:
        return ""
    if not has_conditions(engine):
        raise ValueError(f"title= needs a model trained with titles (data.conditions); {engine.path or 'this one'} "
                         "was trained without (ckpt_path= picks another)")
    if bad := "".join(c for c in title if not is_hanzi(c)):
        raise ValueError(f"title={title!r} holds characters a title is not written in: {bad!r} (CJK characters only)")
    if len(title) > MAX_TITLE:
        raise ValueError(f"title={title!r} has {len(title)} characters; the model was trained on titles of at most "
                         f"{MAX_TITLE}")
    return engine.to_model_text(title, "title")


def check_poet(engine: Engine, poet: str) -> str:
    """A user's poet (either script) in the model's script. raises ValueError for a model without
    conditions, or a poet it does not know, with the nearest names."""
    poet = poet.strip()
    if not poet:
        return ""
    poets = known_poets(engine)
    if not poets:
        raise ValueError(f"poet= needs a model trained with poets (data.conditions); {engine.path or 'this one'} "
                         "was trained without (ckpt_path= picks another)")
    try:
        name = engine.to_model_text(poet, "poet")
    except ValueError:
        name = poet
    if name not in poets:
        near = sorted(poets, key=lambda p: (-SequenceMatcher(None, name, p).ratio(), -poets[p]))[:3]  # ties: most poems
        raise ValueError(f"poet={poet} is not one of the {len(poets)} poets this model knows (each with ≥ 100 training "
                         f"poems); nearest: {', '.join(near)}. List them: python sample.py poets=list")
    return name


def condition_segments(engine: Engine, title: str | Sequence[str], poet: str | Sequence[str],
                       keyword_rows: Sequence[tuple[str, ...]], hints: bool, num_samples: int) -> list[list[int]]:
    """Each row's condition segment ids (one list for all rows, or one per row; [[]] for none):
    title and poet, each a string or one per row (`per_row`), checked (`check_title`,
    `check_poet`); keywords (in the model's script, cleaned) as hints when `hints` and the model
    has conditions. raises as the checks and `per_row`."""
    titles = [check_title(engine, t) for t in per_row(title, num_samples, "title")]
    poets = [check_poet(engine, p) for p in per_row(poet, num_samples, "poet")]
    words = keyword_rows if hints and has_conditions(engine) and any(keyword_rows) else [()]
    n = max(len(titles), len(poets), len(words))
    return [segment_ids(engine.tokenizer, titles[i % len(titles)], poets[i % len(poets)], words[i % len(words)])
            for i in range(n)]
