import numpy as np
import pytest
import torch

from data.corpus_io import load_corpus
from data.datamodule import PoetryDataModule
from data.verse.script import corpus_to_script, prompt_to_script
from data.windows import IGNORE, PoemWindows, Windows, train_starts
from tests.conftest import POEMS, write_corpus


def make_dm(corpus, tmp_path, **kw):
    return PoetryDataModule(str(corpus), str(tmp_path / "cache"), **{"block_size": 8, "batch_size": 4, **kw})


def test_prepare_writes_cache_with_simplified_text(tiny_corpus, tmp_path):
    dm = make_dm(tiny_corpus, tmp_path)
    dm.prepare_data()
    assert {p.name for p in dm.cache_dir.iterdir()} == {"train.bin", "val.bin", "tokenizer.json", "meta.json"}
    tok = dm.tokenizer
    assert "头" in tok.stoi and "頭" not in tok.stoi  # OpenCC t2s applied
    train = dm.tokens("train")
    assert dm.meta["train"] == {"poems": 96, "tokens": int(train.size), "characters": int(train.size) - 192}
    first = tok.decode(train[: len(POEMS[0]) + 2].tolist(), skip_specials=False)
    assert first == "<bos>床前明月光，疑是地上霜。举头望明月，低头思故乡。<eos>"
    assert dm.meta["val"]["poems"] == 24


def test_cache_is_reused_and_rebuilt_on_change(tiny_corpus, tmp_path):
    dm = make_dm(tiny_corpus, tmp_path)
    dm.prepare_data()
    stamp = (dm.cache_dir / "train.bin").stat().st_mtime_ns
    again = make_dm(tiny_corpus, tmp_path)
    again.prepare_data()
    assert again.cache_dir == dm.cache_dir and (dm.cache_dir / "train.bin").stat().st_mtime_ns == stamp
    assert make_dm(tiny_corpus, tmp_path, script="traditional").cache_dir != dm.cache_dir
    write_corpus(tiny_corpus, POEMS[:3])
    assert make_dm(tiny_corpus, tmp_path).cache_dir != dm.cache_dir


def test_traditional_script_keeps_the_corpus_text(tiny_corpus, tmp_path):
    dm = make_dm(tiny_corpus, tmp_path, script="traditional")
    assert "頭" in dm.tokenizer.stoi and "头" not in dm.tokenizer.stoi


def test_windows_are_shifted_pairs():
    tokens = np.arange(50, dtype=np.uint16)
    train = Windows(tokens, 8, np.arange(50 - 8))  # every offset that fills a window
    x, y = train[3]
    assert x.dtype == torch.int64 and x.shape == (8,) and torch.equal(y, x + 1) and x[0] == 3
    assert len(train) == 50 - 8
    val = Windows.blocks(tokens, 8)
    assert len(val) == 6 and val[1][0][0] == 8 and val[5][1][-1] == 48
    with pytest.raises(ValueError, match="cannot fill"):
        Windows.blocks(tokens[:8], 8)


def poems_array(lengths: list[int]) -> np.ndarray:
    """Poems of the given token lengths (<bos> … <eos>), body tokens numbered from 10 upwards."""
    out, body = [], iter(range(10, 10_000))
    for n in lengths:
        out += [0, *(next(body) for _ in range(n - 2)), 1]
    return np.array(out, dtype=np.uint16)


def test_poem_training_windows_start_at_bos_and_cover_long_poems():
    tokens = poems_array([6, 20, 7, 9])  # offsets 0, 6, 26, 33; 42 tokens
    starts = train_starts(tokens, 8)
    assert starts.tolist() == [0, 6, 14, 22, 26, 33]  # the 20-token poem goes on at +8 and +16
    assert all(tokens[s] == 0 for s in (0, 6, 26, 33))
    x, y = Windows(tokens, 8, starts)[0]
    assert x[0] == 0 and torch.equal(x[6:], torch.tensor([0, 14]))  # packs on into the next poem


def test_a_fraction_of_training_windows_starts_mid_poem_at_seeded_offsets():
    tokens = poems_array([6, 20, 7, 9])
    poems = train_starts(tokens, 8)  # 6 windows at <bos> or a long poem's continuation
    mixed = train_starts(tokens, 8, mid_poem=0.25, seed=3)
    assert len(mixed) == 8 and set(poems.tolist()) <= set(mixed.tolist())  # 2 of 8 added: a quarter
    assert np.array_equal(mixed, train_starts(tokens, 8, mid_poem=0.25, seed=3))
    assert not all(np.array_equal(mixed, train_starts(tokens, 8, mid_poem=0.25, seed=s)) for s in range(4, 9))
    assert mixed.max() <= len(tokens) - 9 and len(train_starts(tokens, 8, mid_poem=0.5)) == 12
    assert np.array_equal(train_starts(tokens, 8, mid_poem=0.0), poems)
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match=r"data.mid_poem_fraction=.* is not in \[0, 1\)"):
            train_starts(tokens, 8, mid_poem=bad)
        with pytest.raises(ValueError, match=r"data.mid_poem_fraction=.* is not in \[0, 1\)"):
            PoetryDataModule("x.jsonl.xz", "cache", mid_poem_fraction=bad)


def test_poem_validation_scores_every_token_once_from_its_own_poem():
    lengths = [6, 20, 7, 30]
    tokens = poems_array(lengths)
    val = PoemWindows(tokens, 8)
    seen = []
    bounds = np.cumsum([0, *lengths])
    for i in range(len(val)):
        x, y = val[i]
        start, first, end = val.items[i]
        poem = np.searchsorted(bounds, start, side="right") - 1
        assert bounds[poem] <= start and end <= bounds[poem + 1]  # one poem per item: nothing packed after it
        assert start == bounds[poem] or first - start - 1 >= 8 // 2  # at least half a block of context
        scored = y != IGNORE
        assert torch.equal(x[: end - start - 1], torch.from_numpy(tokens[start:end - 1].astype(np.int64)))
        seen += [int(t) for t in y[scored]]
    expected = [int(t) for b, e in zip(bounds[:-1], bounds[1:]) for t in tokens[b + 1:e]]
    assert seen == expected  # every target after a <bos>, once, in order
    assert len(seen) == len(tokens) - len(lengths)


def test_dataloaders_serve_batches(tiny_corpus, tmp_path):
    dm = make_dm(tiny_corpus, tmp_path)
    dm.prepare_data()
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == y.shape == (4, 8)
    assert sum(xb.numel() for xb, _ in dm.val_dataloader()) == len(dm.val_set) * 8


def test_missing_corpus_and_bad_script_are_explained(tmp_path):
    with pytest.raises(FileNotFoundError, match="build_corpus.py"):
        load_corpus(tmp_path / "missing.jsonl.xz")
    with pytest.raises(FileNotFoundError, match="build_corpus.py"):
        make_dm(tmp_path / "missing.jsonl.xz", tmp_path).prepare_data()
    with pytest.raises(ValueError, match="script"):
        make_dm(tmp_path / "x", tmp_path, script="cursive")


def test_script_conversion_of_corpus_and_prompts():
    assert corpus_to_script(["舉頭望明月"], "simplified") == ["举头望明月"]
    assert corpus_to_script(["舉頭望明月"], "traditional") == ["舉頭望明月"]
    assert prompt_to_script("举头望明月，", "traditional") == "舉頭望明月，"
    assert prompt_to_script("舉頭望明月，", "simplified") == "举头望明月，"
    with pytest.raises(ValueError):
        prompt_to_script("月", "latin")


def test_bpe_arrays_count_the_same_characters_as_the_char_arrays(tiny_corpus, tmp_path):
    from data.bpe import learn_ranks, write_ranks

    ranks = write_ranks(learn_ranks(corpus_to_script(POEMS, "simplified"), 256 + 64), tmp_path / "poems.tiktoken")
    char = make_dm(tiny_corpus, tmp_path)
    bpe = make_dm(tiny_corpus, tmp_path, tokenizer={"kind": "tiktoken", "encoding": str(ranks)})
    assert bpe.cache_dir != char.cache_dir
    assert bpe.meta["tokenizer"] == "tiktoken" and bpe.meta["dtype"] == "uint16" and bpe.tokens("val").dtype == np.uint16
    assert {p.name for p in bpe.cache_dir.iterdir()} == {"train.bin", "val.bin", "tokenizer.json", "meta.json"}
    val_chars = sum(len(t) for t in corpus_to_script(POEMS, "simplified")) * 4  # 4 of 20 copies are held out
    assert bpe.meta["val"]["characters"] == char.meta["val"]["characters"] == val_chars
    assert bpe.meta["val"]["tokens"] != char.meta["val"]["tokens"]
    for dm in (char, bpe):
        counts = np.array(dm.tokenizer.char_counts)
        assert counts[dm.tokens("val")].sum() == val_chars  # what val/bpc divides by
    assert bpe.tokenizer.decode(bpe.tokens("train")[:40].tolist()).startswith("床前明月光，疑是地上霜。举头")
    write_ranks(learn_ranks(POEMS, 256 + 8), ranks)  # another ranks file at the same path: other arrays
    assert make_dm(tiny_corpus, tmp_path, tokenizer={"kind": "tiktoken", "encoding": str(ranks)}).cache_dir != bpe.cache_dir
    with pytest.raises(ValueError, match="tokenizer.kind"):
        make_dm(tiny_corpus, tmp_path, tokenizer={"kind": "wordpiece"})


def test_vocabularies_over_65536_ids_get_uint32_arrays(tmp_path):
    chars = [chr(c) for c in range(0x20000, 0x20000 + 66_000)]  # CJK Extension B: 66,002 ids with the specials
    poems = ["".join(chars[i : i + 1000]) for i in range(0, len(chars), 1000)]
    dm = make_dm(write_corpus(tmp_path / "big.jsonl.xz", poems, copies=2), tmp_path, script="traditional")
    assert dm.meta["vocab_size"] == 66_002 and dm.meta["dtype"] == "uint32"
    val = dm.tokens("val")
    assert val.dtype == np.uint32 and val.max() == 66_001
    assert dm.tokenizer.decode(val[-1001:].tolist()) == poems[-1]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_resumed_loader_serves_the_uninterrupted_batches_in_later_epochs_too(tiny_corpus, tmp_path, num_workers):
    """Stopped inside the first epoch and inside the second, a new loader that loads the saved
    state serves, through the epochs after it, exactly the batches of one never stopped."""
    dm = PoetryDataModule(str(tiny_corpus), str(tmp_path / "cache"), block_size=8, batch_size=4, num_workers=num_workers)
    dm.prepare_data()
    dm.setup("fit")
    per_epoch = len(dm.train_dataloader())
    assert per_epoch >= 3

    def epochs(loader, n):
        return [x.tolist() for _ in range(n) for x, _ in loader]

    uninterrupted = epochs(dm.train_dataloader(), 3)
    assert uninterrupted[:per_epoch] != uninterrupted[per_epoch:2 * per_epoch]  # each epoch its own order
    for stop in (1, per_epoch + 1):
        loader, served, state = dm.train_dataloader(), [], None
        while state is None:
            for x, _ in loader:
                served.append(x.tolist())
                if len(served) == stop:
                    state = loader.state_dict()
                    break
        resumed = dm.train_dataloader()
        resumed.load_state_dict(state)
        while len(served) < len(uninterrupted):
            served += epochs(resumed, 1)
        assert served == uninterrupted, f"stopped after batch {stop}"
