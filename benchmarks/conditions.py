"""What a title, a poet and keyword hints are worth to a model trained with conditions (docs/conditions.md).

    python benchmarks/conditions.py                 # the default checkpoint, every figure (minutes)
    python benchmarks/conditions.py --per-poet 2 --titles 10 --keyword-poems 10   # a smoke run

1. **Title**: held-out bodies' `val/bpc` given their true title (`val_titled.bin`) and given
   none (`val.bin`), the body's characters and plan only (segment targets are not scored), on
   both protocols, and the difference with a 95 % paired bootstrap interval over the poems (on
   `blocks`, the last poem, cut by an array's tail, is left out of both). A poem gets its title
   as training gives one, only where it still fits its window with it (`data.conditions.fitted`;
   a titled 七律 would outgrow it); the figure over the poems given one is beside it.
2. **Poet**: a classifier trained on the training poems of the listed poets only (scikit-learn:
   TF-IDF of character 1–2-grams, a linear SVM); its accuracy on those poets' held-out poems
   is the ceiling, the share of `poet=X` samples it attributes to X the figure, and the share
   of samples without a poet it attributes to X the chance; each averaged over the poets.
3. **Relevance** (no person needed): the cosine of TF-IDF character 1–2-gram vectors between
   a condition's text (a title; keywords) and a poem. Given: poems sampled for held-out titles;
   chance: the same poems against another poem's title; ceiling: the real poems and their titles.
3b. **Relevance without the title's echo** (issue 60): a reader discounts a poem that repeats its
   title, so the title's characters are taken out of the poem, which is then compared with what
   poems on titles like it say (the poems of the nearest training titles, `topic_relevance`), for
   the free poems, 五绝 and 七律, beside the real poems and chance.
4. **Keyword hints** (`keywords_forced=false`): the share of poems holding all their keywords
   (and each keyword) when given as hints only, beside the same sampling without them (chance);
   keywords are TextRank's two of held-out poems (`data.keywords.poem_keywords`).
5. **The probe with a title**: 「床前明月光，疑是地上霜。」 read as `attention_maps.py` reads it, and
   after `<题>静夜思`: per layer, the share of the probe characters' attention that goes to the
   title, and how far their attention among the probe's own positions moves (total variation
   of each row, renormalised over those positions, averaged over rows and heads).

Prints a table, writes `benchmarks/results/conditions-cpu.json`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from benchmarks import fixed_time  # noqa: E402
from benchmarks.fixed_time import NANOGPT, datamodule  # noqa: E402
from data.corpus_io import iter_corpus  # noqa: E402
from data.datamodule import PoetryDataModule  # noqa: E402
from data.keywords import poem_keywords  # noqa: E402
from data.title_plan import NEIGHBOURS, plan_size, planner  # noqa: E402
from data.verse.meter import poem_lines  # noqa: E402
from data.verse.plan import clean_title, segment_ids  # noqa: E402
from data.verse.poetry import VERSE_FORMS  # noqa: E402
from data.verse.script import corpus_to_script  # noqa: E402
from data.windows import IGNORE, PoemWindows, Windows  # noqa: E402
from model.device import commit  # noqa: E402
from model.device import describe as machine  # noqa: E402
from model.inspection.poem_metrics import poem_metrics, training_lines  # noqa: E402
from model.loading import load_engine  # noqa: E402
from model.sampling.conditions import known_poets  # noqa: E402
from model.sampling.poems import SamplingOptions, sample_poems  # noqa: E402
from model.sampling.title_plan import plan_title  # noqa: E402
from model.training.finetune import finetune_tag  # noqa: E402

CORPUS = ROOT / "data" / "corpus" / "tang.jsonl.xz"
PARTS = ("title", "relevance", "topic", "hints", "poet", "probe", "finetune")


def per_poem_nats(engine, tokens: np.ndarray, unscored: np.ndarray, protocol: str) -> tuple[np.ndarray, np.ndarray]:
    """(nats, characters) of every poem's scored targets, (n_poems,) float64 each, under a protocol."""
    block = engine.model.cfg.block_size if protocol == "poems" else NANOGPT["block_size"]
    windows = PoemWindows(tokens, block, 0, unscored) if protocol == "poems" else Windows.blocks(tokens, block, unscored)
    starts = np.array([it[0] for it in windows.items] if protocol == "poems" else windows.starts)
    bos = np.flatnonzero(np.asarray(tokens) == 0)
    nats, chars = np.zeros(len(bos)), np.zeros(len(bos))
    counts = np.asarray(engine.tokenizer.char_counts)
    seen = 0
    with torch.no_grad():
        for x, y in DataLoader(windows, batch_size=64):
            n = engine.model.nats(x, y).double().numpy()  # (B, T)
            pos = starts[seen:seen + len(x), None] + 1 + np.arange(x.size(1))  # (B, T) the targets' offsets
            seen += len(x)
            keep = (y != IGNORE).numpy()
            poem = np.searchsorted(bos, pos[keep], side="right") - 1
            np.add.at(nats, poem, n[keep])
            np.add.at(chars, poem, counts[y.numpy()[keep]])
    return nats, chars


def title_value(engine, samples: int = 2000, seed: int = 0) -> dict:
    """Goal 1's figure per protocol: bpc given none, given the true title, the difference and its interval."""
    out = {}
    for protocol in ("poems", "blocks"):
        dm = datamodule(protocol, engine.model.cfg.block_size, True, engine.meta.conditions)  # training's arrays
        arrays = {name: dm.tokens(name) for name in ("val", "val_titled")}
        (n0, c0), (n1, c1) = (per_poem_nats(engine, a, dm.unscored(a), protocol) for a in arrays.values())
        same = c0 == c1  # `blocks` leaves the arrays' tails (shorter than a window) unscored: the last poem differs
        lengths = [np.diff(np.append(np.flatnonzero(a == 0), len(a))) for a in arrays.values()]  # per poem
        titled = (lengths[0] != lengths[1]) & same  # the poems given a title: those that fit their window with it
        out[protocol] = {**difference(n0[same], n1[same], c0[same], samples, seed),
                         "poems": int(same.sum()), "poems_left_out": int((~same).sum()),
                         "titled_poems": int(titled.sum()),
                         "titled_only": difference(n0[titled], n1[titled], c0[titled], samples, seed)}
    return out


def difference(n0: np.ndarray, n1: np.ndarray, chars: np.ndarray, samples: int, seed: int) -> dict:
    """bpc of poems' nats given none (n0) and given a title (n1), the difference, and its 95 % paired
    bootstrap interval over the poems (n0, n1, chars: (n_poems,) each)."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(n0), (samples, len(n0)))
    diffs = (n0[draws].sum(1) - n1[draws].sum(1)) / chars[draws].sum(1) / math.log(2)
    bpc = [n.sum() / chars.sum() / math.log(2) for n in (n0, n1)]
    return {"untitled_bpc": round(bpc[0], 4), "titled_bpc": round(bpc[1], 4), "difference": round(bpc[0] - bpc[1], 4),
            "interval_95": [round(float(q), 4) for q in np.percentile(diffs, [2.5, 97.5])]}


def heldout(script: str, split: str = "val") -> list[dict]:
    """The corpus's poems of a split in the model's script (text, title, author)."""
    poems = [p for p in iter_corpus(CORPUS) if p["split"] == split]
    conv = {f: corpus_to_script([p[f] for p in poems], script) for f in ("text", "title", "author")}
    return [{f: conv[f][i] for f in conv} for i in range(len(poems))]


def vectorizer(texts):
    """TF-IDF of character 1–2-grams (sublinear tf, min_df 2) fitted on texts: unit-length rows."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    return TfidfVectorizer(analyzer="char", ngram_range=(1, 2), sublinear_tf=True, min_df=2).fit(texts)


def cosine(vec, a: list[str], b: list[str]) -> float:
    """The mean cosine of TF-IDF vectors of a[i] and b[i] (the vectors are unit length)."""
    return float(np.asarray(vec.transform(a).multiply(vec.transform(b)).sum(1)).mean())


def poet_classifier(train: list[dict], poets: list[str]):
    """(vectorizer, classifier) of the poets' training poems (module docstring, 2.)."""
    from sklearn.svm import LinearSVC
    rows = [p for p in train if p["author"] in poets]
    vec = vectorizer([p["text"] for p in rows])
    return vec, LinearSVC(C=0.5).fit(vec.transform([p["text"] for p in rows]), [p["author"] for p in rows])


def poet_figures(engine, train: list[dict], val: list[dict], per_poet: int) -> dict:
    """Goal 3's figures (module docstring, 2.): ceiling, attributed, chance (shares in [0, 1], averaged over poets)."""
    poets = list(known_poets(engine))
    vec, clf = poet_classifier(train, poets)
    held = [p for p in val if p["author"] in poets]
    said = clf.predict(vec.transform([p["text"] for p in held]))
    ceiling = np.mean([np.mean([s == q for s, p in zip(said, held) if p["author"] == q]) for q in poets
                       if any(p["author"] == q for p in held)])
    figure, chance = [], []
    free = sample_poems(engine, SamplingOptions(num_samples=per_poet * 4, seed=1))
    free_said = clf.predict(vec.transform(free))
    for k, poet in enumerate(poets):
        poems = sample_poems(engine, SamplingOptions(num_samples=per_poet, poet=poet, seed=100 + k))
        figure.append(float(np.mean(clf.predict(vec.transform(poems)) == poet)))
        chance.append(float(np.mean(free_said == poet)))
    return {"poets": len(poets), "heldout_poems": len(held), "ceiling": round(float(ceiling), 4),
            "attributed": round(float(np.mean(figure)), 4), "chance": round(float(np.mean(chance)), 4),
            "samples_per_poet": per_poet, "ratio_to_ceiling": round(float(np.mean(figure) / ceiling), 4)}


def title_relevance(engine, train: list[dict], val: list[dict], n: int) -> dict:
    """Relevance (module docstring, 3.) of poems sampled for the first n held-out titles: mean cosines in
    [0, 1], with the title's plan (forced, `title_plan=true`), with the title alone (`title_plan=false`),
    untitled; the plan's poems also with the planned words' characters left out of them; and the
    metrics (form, rhyme, distinct-2) of the plan's poems beside the title alone's."""
    vec = vectorizer([p["text"] for p in train] + [clean_title(p["title"]) for p in train])
    titled = [p for p in val if clean_title(p["title"])][:n]
    titles = [clean_title(p["title"]) for p in titled]
    words = [plan_title(engine, t, plan_size(None)) for t in titles]

    def written(plan) -> list[str]:
        return [sample_poems(engine, SamplingOptions(num_samples=1, title=t, seed=200 + i, title_plan=plan))[0]
                for i, t in enumerate(titles)]
    planned, alone = written(True), written(False)
    untitled = sample_poems(engine, SamplingOptions(num_samples=len(titles), seed=3))
    other = titles[1:] + titles[:1]
    stripped = ["".join(c for c in p if not any(c in w for w in ws)) for p, ws in zip(planned, words)]
    lines = training_lines(str(CORPUS), engine.script)
    metrics = {name: {k: poem_metrics(poems, engine.script, lines)[k] for k in ("regulated", "rhyme_regulated",
                                                                                "distinct_2")}
               for name, poems in (("plan", planned), ("title_alone", alone))}
    return {"titles": len(titles), "planned": sum(map(bool, words)),
            "plan": round(cosine(vec, titles, planned), 4),
            "plan_without_its_characters": round(cosine(vec, titles, stripped), 4),
            "plan_chance_other_title": round(cosine(vec, other, planned), 4),
            "given": round(cosine(vec, titles, alone), 4),
            "chance_other_title": round(cosine(vec, other, alone), 4),
            "untitled_samples": round(cosine(vec, titles, untitled), 4),
            "real_poems": round(cosine(vec, titles, [p["text"] for p in titled]), 4),
            "metrics": metrics,
            "examples": [{"title": t, "words": w, "poem": p} for t, w, p in list(zip(titles, words, planned))[:5]]}


TOPIC_FORMS = ("free", "wujue", "qilv")
"""The forms `topic_relevance` samples for each title (free: no form)."""


def without(text: str, chars: set[str]) -> str:
    """`text` with these characters taken out."""
    return "".join(c for c in text if c not in chars)


def title_topics(vec, train: list[dict], titles: list[str]) -> np.ndarray:
    """Each title's topic (`topic_relevance`), (len(titles), F) unit rows of `vec`'s features: the
    mean of the poems of the `NEIGHBOURS` training titles nearest it, the title's characters out."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    by_title = TfidfVectorizer(analyzer="char", ngram_range=(1, 2)).fit([clean_title(p["title"]) for p in train])
    train_titles = by_title.transform([clean_title(p["title"]) for p in train])  # (N, G), unit rows
    topics = []
    for t, sims in zip(titles, (by_title.transform(titles) @ train_titles.T).toarray()):  # (N,) each
        near = [i for i in np.argsort(-sims, kind="stable")[:NEIGHBOURS] if sims[i] > 0]
        mean = np.asarray(vec.transform([without(train[i]["text"], set(t)) for i in near]).mean(0)).ravel() \
            if near else np.zeros(len(vec.vocabulary_))
        topics.append(mean / max(float(np.linalg.norm(mean)), 1e-12))
    return np.stack(topics)


def topic_relevance(engine, train: list[dict], val: list[dict], n: int, seed: int = 300) -> dict:
    """Relevance without the title's echo (module docstring, 3b; issue 60): for the first n held-out
    titled poems, the cosine (TF-IDF character 1–2-grams of the training poems, unit rows) between a
    poem with its title's characters taken out and the title's topic: the mean vector of the poems of
    the `NEIGHBOURS` training titles nearest it (cosine of the titles' TF-IDF character 1–2-grams,
    as the title plan finds them), the title's characters taken out of them too (the unit mean; 0
    for a title no training title shares a character with).
    Per form (`TOPIC_FORMS`), poems sampled in one batch for the titles: with the title's plan
    (`title_plan=true`, a word a couplet of a form, leaning toward its words by the recipe's
    `topic_lean`; `no_lean`: the same, `topic_lean=0`; `echo`: `title_plan=echo`, the plan before issue
    60; `hints`: `title_plan=hints`, the plan's words in the condition segment only, the model's input;
    `line`, for a form: the plan's first words, a word a line), each also with the planned
    words' characters taken out, against its own title's topic and against the next title's
    (`_other_title`: chance for these very poems), with the title alone (`title_plan=false`), untitled, each with its
    form, rhyme and distinct-2 (`metrics`); the real held-out poems; chance: the real poems against the next title's topic.
    Means in [0, 1]; `halfway`: (plan − chance) ÷ (real − chance)."""
    vec = vectorizer([p["text"] for p in train])
    titled = [p for p in val if clean_title(p["title"])][:n]
    titles = [clean_title(p["title"]) for p in titled]
    topics = title_topics(vec, train, titles)  # (n, F)

    def score(poems: list[str], extra: list[set[str]] | None = None, shift: int = 0) -> float:
        kept = [without(p, set(t) | (extra[i] if extra else set())) for i, (p, t) in enumerate(zip(poems, titles))]
        rows = vec.transform(kept)  # (n, F), unit rows
        return round(float(np.mean(rows.multiply(np.roll(topics, -shift, axis=0)).sum(1))), 4)
    real, lines = [p["text"] for p in titled], training_lines(str(CORPUS), engine.script)
    out = {"titles": len(titles), "real_poems": score(real), "chance": score(real, shift=1), "forms": {}}

    def measured(row: dict, name: str, poems: list[str], words: list[set[str]] | None = None) -> None:
        row[name] = score(poems)
        if words is not None:
            row[f"{name}_without_its_words"] = score(poems, words)
            row[f"{name}_without_its_words_other_title"] = score(poems, words, shift=1)
        m = poem_metrics(poems, engine.script, lines)
        row.setdefault("metrics", {})[name] = {k: m[k] for k in ("regulated", "rhyme_regulated", "distinct_2")}
    for form in TOPIC_FORMS:
        shape = {"num_samples": len(titles), "seed": seed, **({} if form == "free" else {"form": form})}
        row = out["forms"][form] = {}
        for name, mode, lean in (("plan", True, {}), ("no_lean", True, {"topic_lean": 0.0}), ("echo", "echo", {}),
                                 ("hints", "hints", {})):  # echo: the plan before issue 60; no_lean: without TopicLean
            size = plan_size(shape.get("form"), echo=mode == "echo")
            words = [set("".join(plan_title(engine, t, size, echo=mode == "echo"))) for t in titles]
            measured(row, name, sample_poems(engine, SamplingOptions(title=titles, title_plan=mode, **lean, **shape)),
                     words)
        if form != "free":  # the A/B of issue 60: a word a line instead of a word a couplet
            rows = [[w for w in planner(engine.script).plan(t, VERSE_FORMS[form][0]) if not engine.tokenizer.unknown(w)]
                    for t in titles]
            measured(row, "line", sample_poems(engine, SamplingOptions(title=titles, keywords=rows, **shape)),
                     [set("".join(w)) for w in rows])
        measured(row, "title_alone", sample_poems(engine, SamplingOptions(title=titles, title_plan=False, **shape)))
        measured(row, "untitled", sample_poems(engine, SamplingOptions(**shape)))
        row["halfway"] = round((row["plan"] - out["chance"]) / max(out["real_poems"] - out["chance"], 1e-12), 4)
    return out


def keyword_hints(engine, val: list[dict], n: int) -> dict:
    """Keyword hints (module docstring, 4.) on n held-out poems' two keywords: shares in [0, 1], hinted and chance."""
    chosen = [(p, poem_keywords(p["text"], 2)) for p in val[:n * 2]]
    chosen = [(p, k) for p, k in chosen if len(k) == 2][:n]
    rows = [list(k) for _, k in chosen]
    hinted = sample_poems(engine, SamplingOptions(num_samples=len(rows), keywords=rows, keywords_forced=False, seed=4))
    plain = sample_poems(engine, SamplingOptions(num_samples=len(rows), seed=4))

    def shares(poems):
        return {"all": round(float(np.mean([all(w in p for w in k) for p, k in zip(poems, rows)])), 4),
                "each": round(float(np.mean([w in p for p, k in zip(poems, rows) for w in k])), 4)}
    return {"poems": len(rows), "hints": shares(hinted), "chance": shares(plain)}


def runs5(poems: list[str]) -> list[str]:
    """Every 5-character run inside a line of the poems (marks stripped)."""
    return [line[i:i + 5] for p in poems for line in poem_lines(p) for i in range(len(line) - 4)]


def copy_rate(poems: list[str], reference: set[str]) -> float:
    """The share of the poems' 5-character runs found in `reference` (a set of runs)."""
    runs = runs5(poems)
    return round(sum(r in reference for r in runs) / max(1, len(runs)), 4)


def poet_bpc(engine, poet: str) -> float:
    """`val/bpc` of a model on one poet's held-out poems (`poems` protocol, as the data module of a
    fine-tuning run on that poet frames them with the model's vocabulary)."""
    dm = PoetryDataModule(str(CORPUS), str(fixed_time.CACHE), block_size=engine.model.cfg.block_size,
                          plan_tokens=True, conditions=engine.meta.conditions, poets=[poet],
                          base_tokenizer=engine.tokenizer)
    dm.prepare_data()
    tokens = dm.tokens("val")
    nats, chars = per_poem_nats(engine, tokens, dm.unscored(tokens), "poems")
    return round(float(nats.sum() / chars.sum() / math.log(2)), 4)


def free_rhyme(poems: list[str], script: str, lines: frozenset[str]) -> float | None:
    """`rhyme_regulated` of free poems (the share of the regular-form ones whose even lines rhyme), 4 places."""
    rate = poem_metrics(poems, script, lines)["rhyme_regulated"]
    return None if rate is None else round(rate, 4)


def finetune_voices(base, train: list[dict], val: list[dict], n_poets: int, n_poems: int, overrides=(),
                    named=(), workdir: Path = ROOT) -> dict:
    """Goal 3 of issue 53 (docs/finetuning.md): the `n_poets` most prolific poets, each fine-tuned from
    `base` alone by `python train.py experiment=finetune` (a process of its own, timed whole), then
    `n_poems` free poems of it: the share the classifier attributes to the poet, their copy rate of
    5-character runs from the poet's training lines beside the poet's own held-out poems' (against the
    poet's training lines, and against the whole training corpus), the poet's held-out `val/bpc`
    before and after, free rhyme (`rhyme_regulated`) before and after, and the minutes. named: these
    poets instead (an A/B on one); workdir: where the runs' checkpoints/ and logs/ go."""
    poets = list(named) or list(known_poets(base))[:n_poets]
    vec, clf = poet_classifier(train, list(known_poets(base)))
    corpus_runs = set(runs5([p["text"] for p in train]))
    lines = training_lines(str(CORPUS), base.script)
    opts = SamplingOptions(num_samples=n_poems, seed=5)
    base_rhyme = free_rhyme(sample_poems(base, opts), base.script, lines)
    out = []
    for poet in poets:
        run = f"bench-{finetune_tag([poet], '')}" + (f"-{hashlib.sha1(' '.join(overrides).encode()).hexdigest()[:6]}"
                                                      if overrides else "")  # each variant a folder of its own
        checkpoints, logs = workdir / "checkpoints", workdir / "logs"
        shutil.rmtree(checkpoints / run, ignore_errors=True)
        shutil.rmtree(logs / run, ignore_errors=True)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "train.py", "experiment=finetune", f"init_from={base.path}",
                               f"data.poets=['{poet}']", f"run_name={run}", f"data.corpus_path={CORPUS}",
                               f"data.cache_dir={fixed_time.CACHE}", f"paths.checkpoint_dir={checkpoints}",
                               f"paths.log_dir={logs}", *overrides], cwd=ROOT, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"fine-tuning {poet} failed:\n{done.stderr[-2000:]}")
        minutes = (time.perf_counter() - start) / 60
        tuned = load_engine(str(checkpoints / run), str(checkpoints), "cpu")
        poems = sample_poems(tuned, opts)
        own_train = set(runs5([p["text"] for p in train if p["author"] == poet]))
        own_held = [p["text"] for p in val if p["author"] == poet]
        out.append({"poet": poet, "minutes": round(minutes, 2),
                    "attributed": round(float(np.mean(clf.predict(vec.transform(poems)) == poet)), 4),
                    "copy": copy_rate(poems, own_train), "poet_own_copy": copy_rate(own_held, own_train),
                    "poet_own_copy_corpus": copy_rate(own_held, corpus_runs),
                    "val_bpc_before": poet_bpc(base, poet), "val_bpc_after": poet_bpc(tuned, poet),
                    "rhyme_before": base_rhyme, "rhyme_after": free_rhyme(poems, base.script, lines),
                    "examples": poems[:3]})
        print(json.dumps({k: v for k, v in out[-1].items() if k != "examples"}, ensure_ascii=False), flush=True)
    return {"poems": n_poems, "overrides": list(overrides), "poets": out}


PROBE, PROBE_TITLE = "床前明月光，疑是地上霜。", "静夜思"


def probe_with_title(engine) -> list[dict]:
    """Per layer: {"to_title": share of the probe characters' attention on the title segment,
    "moved": mean total variation of their rows over the probe's own positions}."""
    tok = engine.tokenizer
    plain = engine.poem_ids(PROBE, eos=False)
    titled = [plain[0], *segment_ids(tok, engine.to_model_text(PROBE_TITLE)), *plain[1:]]
    k = len(titled) - len(plain)  # the segment's length
    maps0 = engine.model.attention_maps(torch.tensor([plain]))
    maps1 = engine.model.attention_maps(torch.tensor([titled]))
    body = range(3, len(plain))  # the probe's characters (after <bos> and the plan)
    out = []
    for a0, a1 in zip(maps0, maps1):  # (1, H, T, T) each
        rows0 = a0[0][:, body][:, :, [0, *range(1, len(plain))]]  # (H, n, T): over <bos>, plan, probe
        rows1 = a1[0][:, [b + k for b in body]][:, :, [0, *range(1 + k, len(titled))]]
        to_title = a1[0][:, [b + k for b in body]][:, :, 1:1 + k].sum(-1).mean()
        rows1 = rows1 / rows1.sum(-1, keepdim=True)
        out.append({"to_title": round(float(to_title), 4),
                    "moved": round(float(0.5 * (rows0 - rows1).abs().sum(-1).mean()), 4)})
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", default="checkpoints/bench-fixed-time-default", help="the run (default: %(default)s)")
    p.add_argument("--per-poet", type=int, default=10, help="poems sampled per poet (default: %(default)s)")
    p.add_argument("--titles", type=int, default=200, help="held-out titles sampled for (default: %(default)s)")
    p.add_argument("--topic-titles", type=int, default=300,
                   help="held-out titles of the relevance without the title's echo (default: %(default)s)")
    p.add_argument("--keyword-poems", type=int, default=300, help="poems given hints (default: %(default)s)")
    p.add_argument("--finetune-poets", type=int, default=5, help="most prolific poets fine-tuned (default: %(default)s)")
    p.add_argument("--finetune-poems", type=int, default=300,
                   help="poems sampled per fine-tuned poet (default: %(default)s)")
    p.add_argument("--parts", default=",".join(PARTS),
                   help="which figures, comma-separated (default: all)")
    p.add_argument("--override", action="append", default=[], help="a train.py override for the fine-tuning runs")
    p.add_argument("--finetune-poet", action="append", default=[], help="fine-tune this poet (instead of the top ones)")
    p.add_argument("--finetune-dir", type=Path, default=ROOT, help="where the fine-tuned runs go (default: the project)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="the JSON's folder")
    args = p.parse_args(argv)
    engine = load_engine(args.ckpt, str(ROOT / "checkpoints"), "cpu")
    if not known_poets(engine):
        raise SystemExit(f"{args.ckpt} was trained without conditions (data.conditions)")
    start = time.perf_counter()
    parts = set(args.parts.split(","))
    out = args.out / "conditions-cpu.json"
    result = json.loads(out.read_text()) if out.is_file() and parts != set(PARTS) else {}  # other parts kept
    result |= {"machine": machine(), "commit": commit(), "weights_sha": engine.meta.weights_sha}
    train, val = heldout(engine.script, "train"), heldout(engine.script)
    figures = {"title": ("title_bpc", lambda: title_value(engine)),
               "relevance": ("relevance", lambda: title_relevance(engine, train, val, args.titles)),
               "topic": ("topic_relevance", lambda: topic_relevance(engine, train, val, args.topic_titles)),
               "hints": ("keyword_hints", lambda: keyword_hints(engine, val, args.keyword_poems)),
               "poet": ("poet", lambda: poet_figures(engine, train, val, args.per_poet)),
               "probe": ("probe_with_title", lambda: {"probe": PROBE, "title": PROBE_TITLE,
                                                      "layers": probe_with_title(engine)}),
               "finetune": ("finetune", lambda: finetune_voices(engine, train, val, args.finetune_poets,
                                                                args.finetune_poems, args.override,
                                                                args.finetune_poet, args.finetune_dir))}
    if bad := parts - set(figures):
        raise SystemExit(f"--parts: unknown {sorted(bad)}; the parts are {', '.join(figures)}")
    for part in PARTS:
        if part in parts:
            key, figure = figures[part]
            result[key] = figure()
            print(json.dumps({key: result[key]}, ensure_ascii=False, indent=1), flush=True)
    result["seconds"] = round(time.perf_counter() - start, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
