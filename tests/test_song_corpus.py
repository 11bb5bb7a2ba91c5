"""The 全宋诗 beside the 全唐诗 (issue "Poems at GPU scale"): the Song cleaning, the leakage rule
against both validation splits, the shipped corpus, and the data options that train on it."""
import json
import lzma

import numpy as np
import pytest

from data.build_corpus import CORPUS_DIR, body_keys, build, leaks, split_of, write
from data.corpus_io import load_corpus
from data.datamodule import PoetryDataModule
from model.checkpoint_meta import Corpora
from tests.conftest import POEMS


def poem(pid, *paragraphs):
    return {"id": pid, "title": "t", "author": "a", "paragraphs": list(paragraphs)}


def ids_of(split, n, prefix):
    """The first n ids `prefix<i>` that `split_of` puts in `split`."""
    found = (f"{prefix}{i}" for i in range(10_000))
    return [i for i in found if split_of(i) == split][:n]


TANG_VAL, SONG_VAL = ids_of("val", 1, "t")[0], ids_of("val", 1, "s")[0]
SONG_TRAIN = ids_of("train", 4, "s")


@pytest.fixture
def tang():
    """Two Tang poems: 靜夜思 held out, 登鸛雀樓 trained on."""
    return [{"id": TANG_VAL, "title": "", "author": "", "form": "wujue", "split": "val", "text": POEMS[0]},
            {"id": "t-train", "title": "", "author": "", "form": "wujue", "split": "train", "text": POEMS[1]}]


@pytest.fixture
def source(tmp_path):
    """A miniature npm package with Song files: a poem of its own in each split, one listed in
    error/, 靜夜思 again (other marks, simplified), 登鸛雀樓 again, and its own validation poem again."""
    song = tmp_path / "package" / "dist" / "quantangshi"
    (song / "error").mkdir(parents=True)
    records = [
        poem(SONG_VAL, "春眠不覺曉，處處聞啼鳥。", "夜來風雨聲，花落知多少。"),
        poem(SONG_TRAIN[0], "千山鳥飛絕，萬徑人蹤滅。", "孤舟蓑笠翁，獨釣寒江雪。"),
        poem(SONG_TRAIN[1], "紅豆生南國，春來發幾枝。"),
        poem(SONG_TRAIN[2], "床前明月光；疑是地上霜！", "举头望明月，低头思故乡。"),  # the Tang val poem
        poem(SONG_TRAIN[3], "春眠不觉晓，处处闻啼鸟；", "夜来风雨声，花落知多少！"),  # the Song val poem
        poem("s-tang-train", "白日依山盡，黃河入海流。", "欲窮千里目，更上一層樓。"),
    ]
    (song / "poet.song.0.json").write_text(json.dumps(records, ensure_ascii=False))
    (song / "error" / "poet.song.0.json").write_text(json.dumps([poem(SONG_TRAIN[1], "x")]))
    (song / "poet.tang.0.json").write_text(json.dumps([poem("tang-file", POEMS[2])], ensure_ascii=False))
    return tmp_path / "package"


def test_the_song_rules_drop_errors_and_every_repeat_of_a_tang_or_validation_body(source, tang):
    poems, stats = build(source, "song", tang)
    assert [p["id"] for p in poems] == [SONG_VAL, SONG_TRAIN[0]]
    assert stats["dropped"] == {"listed-in-error": 1, "tang-duplicate": 2, "val-duplicate": 1}
    assert stats["source_poems"] == 6 and stats["split"] == {"val": 1, "train": 1}
    assert leaks(poems) == [] and leaks(poems + [{**poems[0], "id": "copy", "split": "train"}]) == [("copy", SONG_VAL)]
    with pytest.raises(ValueError, match="built against the Tang poems"):
        build(source, "song")


def test_body_keys_see_through_script_and_punctuation():
    assert body_keys(["床前明月光；疑是地上霜！", "床前明月光，疑是地上霜。"]) == ["床前明月光疑是地上霜"] * 2
    assert body_keys(["舉頭望明月，低頭思故鄉。"]) == ["举头望明月低头思故乡"]


def test_the_song_corpus_is_written_beside_the_tang_one(source, tang, tmp_path):
    poems, stats = build(source, "song", tang)
    path = write(poems, stats, tmp_path / "out", "song")
    assert path.name == "song.jsonl.xz" and load_corpus(path) == poems
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["song-stats.json", "song.jsonl.xz"]


def test_no_shipped_corpus_trains_on_a_validation_body_of_any_corpus():
    """The leakage rule over the shipped files: no training body of either corpus is a validation body
    of either (issue 36: the Tang corpus had 14), and no Tang poem comes again under the Song dynasty."""
    tang, song = load_corpus(CORPUS_DIR / "tang.jsonl.xz"), load_corpus(CORPUS_DIR / "song.jsonl.xz")
    stats = json.loads((CORPUS_DIR / "song-stats.json").read_text())
    assert len(song) == stats["kept"] > 150_000 and (CORPUS_DIR / "song.jsonl.xz").stat().st_size < 30e6
    keys = body_keys([p["text"] for p in tang + song])
    splits = [p["split"] for p in tang + song]
    held_out = {k for k, s in zip(keys, splits) if s == "val"}
    assert not held_out.intersection(k for k, s in zip(keys, splits) if s == "train")
    assert not set(keys[: len(tang)]).intersection(keys[len(tang):])  # no Tang poem again under the Song dynasty
    assert json.loads((CORPUS_DIR / "stats.json").read_text())["dropped"]["val-duplicate"] == 14


def write_corpus_file(path, poems):
    with lzma.open(path, "wt", encoding="utf-8") as f:
        for p in poems:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    return path


def corpora(tmp_path):
    """A Tang corpus (POEMS 0–3 train, 4 val) and a Song one (POEMS 5 train, a poem of its own val)."""
    tang = [{"id": f"t{i}", "form": "", "split": "val" if i == 4 else "train", "text": t} for i, t in enumerate(POEMS[:5])]
    song = [{"id": "s0", "form": "", "split": "train", "text": POEMS[5]},
            {"id": "s1", "form": "", "split": "val", "text": "霜天曉角鳴，寒雁度江城。"}]
    return write_corpus_file(tmp_path / "tang.jsonl.xz", tang), write_corpus_file(tmp_path / "song.jsonl.xz", song)


def test_tang_and_song_train_together_and_the_tang_validation_stays_the_reference(tmp_path):
    tang, song = corpora(tmp_path)
    alone = PoetryDataModule(str(tang), str(tmp_path / "cache"), block_size=16)
    both = PoetryDataModule(str(tang), str(tmp_path / "cache"), block_size=16, train_corpora=[str(tang), str(song)],
                            also_validate={"song": str(song)})
    assert alone.cache_dir != both.cache_dir and both.val_names == ["", "song"]
    tok = both.tokenizer
    decode = lambda a: tok.decode(np.asarray(a).tolist())  # noqa: E731 (<bos>, <eos> skipped)
    assert decode(both.tokens("train")) == "".join(corpus_simplified(POEMS[:4] + POEMS[5:]))
    assert decode(both.tokens("val")) == corpus_simplified([POEMS[4]])[0]
    assert decode(both.tokens("val_song")) == "霜天晓角鸣，寒雁度江城。"
    assert np.array_equal(np.asarray(alone.tokens("val")) > 1, np.asarray(both.tokens("val")) > 1)
    assert both.meta["corpora"] == ["tang.jsonl.xz", "song.jsonl.xz"] and "corpora" not in alone.meta
    both.setup()
    alone.setup()
    assert [len(loader.dataset) for loader in both.val_dataloader()] == [len(alone.val_dataloader().dataset), 1]
    record = Corpora.of(both.corpus_path, both.train_paths, both.extra_val)  # what its checkpoints record
    assert record == Corpora(("tang.jsonl.xz", "song.jsonl.xz"), {"song": "song.jsonl.xz"})
    assert record.options(tmp_path) == {"train_corpora": [str(tang), str(song)], "also_validate": {"song": str(song)}}
    assert Corpora.of(alone.corpus_path, alone.train_paths, alone.extra_val) == Corpora()
    assert Corpora().options(tmp_path) == {}


def corpus_simplified(texts):
    from data.verse.script import corpus_to_script

    return corpus_to_script(texts, "simplified")


def test_song_alone_trains_on_song_and_scores_the_tang_validation(tmp_path):
    tang, song = corpora(tmp_path)
    dm = PoetryDataModule(str(tang), str(tmp_path / "cache"), block_size=16, train_corpora=[str(song)],
                          also_validate={"song": str(song)})
    assert dm.meta["train"]["poems"] == 1 and dm.meta["val"]["poems"] == 1 and dm.meta["val_song"]["poems"] == 1
    assert set(corpus_simplified(["".join(POEMS)])[0]) <= set(dm.tokenizer.stoi)  # Tang's characters too
    with pytest.raises(ValueError, match="plain words"):
        PoetryDataModule(str(tang), str(tmp_path / "cache"), also_validate={"song/x": str(song)})


def test_a_tang_and_song_run_scores_the_tang_validation_and_evaluate_rebuilds_its_data(tmp_path, monkeypatch):
    import torch
    from hydra import compose, initialize_config_dir

    import evaluate as evaluate_script
    import train as train_script
    from tests.conftest import ROOT, make_train_cfg, write_corpus

    tang = write_corpus(tmp_path / "corpus" / "tang.jsonl.xz")
    song = write_corpus(tmp_path / "corpus" / "song.jsonl.xz", ["霜天曉角鳴，寒雁度江城。", "秋風吹渭水，落葉滿長安。"],
                        copies=10)
    cfg = make_train_cfg(tmp_path, tang, monkeypatch)(
        "data=tang+song", f"data.train_corpora=[{tang},{song}]", f"data.also_validate.song={song}", "logger=csv",
        "trainer.max_steps=20")
    metrics = train_script.train(cfg)
    assert {"val/bpc", "val/loss", "val/song/bpc", "val/song/loss"} <= set(metrics)
    assert metrics["val/song/bpc"] != metrics["val/bpc"]
    ckpt = tmp_path / "checkpoints" / "test" / "last.ckpt"
    saved = torch.load(ckpt, weights_only=True)
    assert saved["corpora"] == {"train": ["tang.jsonl.xz", "song.jsonl.xz"], "also_validate": {"song": "song.jsonl.xz"}}
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        ecfg = compose("evaluate", overrides=[  # data=tang, as a user who forgot the option would run it
            f"ckpt_path={ckpt}", f"paths.log_dir={tmp_path / 'logs'}", f"data.corpus_path={tang}",
            f"data.cache_dir={tmp_path / 'cache'}", "num_samples=2", "sets=[free]", "reference=5", "max_new_tokens=30"])
    report = evaluate_script.evaluate(ecfg)
    assert report["val"]["val/bpc"] == pytest.approx(metrics["val/bpc"], rel=1e-5)  # the same Tang validation
    assert report["val"]["val/song/bpc"] == pytest.approx(metrics["val/song/bpc"], rel=1e-5)
