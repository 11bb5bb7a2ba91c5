"""Fine-tuning (issue 53: `experiment=finetune init_from=… data.poets=[…]` or `data.corpus_path=<file>`):
the base's vocabulary, plan ids and order kept, what the checkpoint records, a user's corpus read or
refused in one line with nothing written, run names that say what a run read, and torchrun without
`trainer=ddp`."""
import json
import logging
import lzma
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from data.corpus_io import load_corpus, read_user_corpus
from data.datamodule import poets_poems
from data.verse.ci import CI, shape_of
from data.verse.plan import plan_ids
from data.verse.poetry import form_of
from model.loading import load_engine, read_trained
from model.sampling.poems import SamplingOptions, sample_poems
from model.training.finetune import finetune_tag
from model.training.runtime import ddp_strategy
from model.training.start import check_start
from tests.conftest import POEMS, ROOT

AUTHORS = ["李白", "李白", "孟浩然", "柳宗元", "王維", "李白"]


def authored_corpus(path):
    """The six poems 20 times, each with its author, every fifth copy held out (traditional script)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(path, "wt", encoding="utf-8") as f:
        for c in range(20):
            for i, (text, author) in enumerate(zip(POEMS, AUTHORS)):
                f.write(json.dumps({"id": f"{c}-{i}", "title": "", "author": author, "form": form_of(text),
                                    "split": "val" if c % 5 == 0 else "train", "text": text}, ensure_ascii=False) + "\n")
    return path


@pytest.fixture
def base(tmp_path, train_cfg):
    """A tiny base model trained 6 steps on the authored corpus (plan tokens and conditions, as the default)."""
    from train import train

    corpus = authored_corpus(tmp_path / "corpus" / "tang.jsonl.xz")
    train(train_cfg(f"data.corpus_path={corpus}", "trainer.max_steps=6", "trainer.val_check_interval=3",
                    "logger=none", "data.anneal_fraction=0.0", "model.head_cutoffs=[20,40]"))  # adaptive: an order
    return tmp_path / "checkpoints" / "test" / "last.ckpt"


def finetune(train_cfg, base, *overrides):
    """train.py's `experiment=finetune` on the tiny settings, 4 steps, into checkpoints/ft."""
    from train import train

    cfg = train_cfg("experiment=finetune", f"init_from={base}", "trainer.max_steps=4", "trainer.val_check_interval=2",
                    "logger=none", *overrides)
    with open_dict(cfg):
        cfg.run_name = "ft"
    return train(cfg)


@pytest.mark.parametrize("data", ["poets", "jsonl", "text", "windows-text"])
def test_finetuning_keeps_the_base_vocabulary_plan_ids_and_order_and_records_its_start(tmp_path, train_cfg, base, data):
    corpus = tmp_path / f"mine.{'jsonl' if data == 'jsonl' else 'txt'}"
    texts = [t for t in POEMS for _ in range(10)]
    corpus.write_text("\n".join(json.dumps({"text": t, "title": "月"}, ensure_ascii=False) if data == "jsonl" else t
                                for t in texts), encoding="utf-8")
    if data == "windows-text":  # as a Windows editor saves it: a byte-order mark, CRLF, blank lines (issue 59)
        corpus.write_bytes(("\ufeff" + "\r\n\r\n".join(texts) + "\r\n").encode("utf-8"))
        plain = tmp_path / "plain.txt"
        plain.write_text("\n".join(texts), encoding="utf-8")
        assert read_user_corpus(corpus) == read_user_corpus(plain)
    option = "data.poets=['李白']" if data == "poets" else f"data.corpus_path={corpus}"
    finetune(train_cfg, base, option, *(["model.n_layer=4", "model.block_size=64"] if "text" in data else []))
    tuned, saved = read_trained(tmp_path / "checkpoints" / "ft" / "last.ckpt"), read_trained(base)
    assert tuned["hyper_parameters"]["tokenizer"] == saved["hyper_parameters"]["tokenizer"]
    assert tuned["hyper_parameters"]["model"] == saved["hyper_parameters"]["model"]  # the base's shape, not the asked one
    assert tuned["global_step"] == 4 and tuned["conditions"] == saved["conditions"]
    record = tuned["finetuned"]
    assert record["from"] == str(base) and record["poets"] == (["李白"] if data == "poets" else [])
    assert record["train_poems"] == (16 * 3 if data == "poets" else sum(p["split"] == "train"
                                                                           for p in read_user_corpus(corpus)))
    order = "gpt.lm_head.id_rank"
    assert torch.equal(tuned["state_dict"][order], saved["state_dict"][order])  # the base's cluster order
    assert not torch.equal(tuned["state_dict"]["gpt.wte.weight"], saved["state_dict"]["gpt.wte.weight"])
    engine = load_engine(tmp_path / "checkpoints" / "ft", tmp_path / "checkpoints")
    assert plan_ids(engine.tokenizer) == plan_ids(load_engine(base, tmp_path / "checkpoints").tokenizer)
    assert len(sample_poems(engine, SamplingOptions(num_samples=2, form="wujue", max_new_tokens=30))) == 2


@pytest.mark.parametrize("content, match", [
    ('{"text": "床前明月光，疑是地上霜。"}\n{"text": 3}\n', r"mine.jsonl:2: not a JSON object with a string field"),
    ('{"text": "床前明月光，疑是地上霜。"}\nnot json\n', r"mine.jsonl:2: not a JSON object \(Expecting value\)"),
    ("", r"holds no poem the corpus's cleaning rules keep \(the file is empty\)"),
    ("The quick brown fox, jumps.\nOver the lazy dog.\n", r"\(line 1: bad-characters: CJK characters"),
    ("ꦲꦏ꧀ꦱꦫ，ꦗꦮ。ꦲꦏ꧀ꦱꦫ，ꦗꦮ。\n" * 2, r"28 characters of the poems \(7 distinct, e.g. 'ꦲꦏ꧀ꦱꦫꦗꦮ'\) are outside"),
    ("龘龘龘龘龘，齉齉齉齉齉。龘龘龘龘龘，齉齉齉齉齉。\n" * 2, r"40 characters of the poems \(2 distinct, e.g. '龘齉'\) are "
                                                   r"outside the base model's vocabulary"),
])
def test_a_corpus_that_cannot_be_trained_on_is_refused_in_one_line_and_nothing_is_written(
        tmp_path, train_cfg, base, content, match):
    corpus = tmp_path / ("mine.jsonl" if content.startswith("{") else "mine.txt")
    corpus.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=match) as err:
        finetune(train_cfg, base, f"data.corpus_path={corpus}")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "checkpoints" / "ft").exists()


def test_a_users_corpus_holds_out_five_percent_exactly_or_keeps_its_own_split(tmp_path):
    poems = [t for t in POEMS for _ in range(40)]  # 240 lines, 6 distinct poems: the texts repeat
    plain = tmp_path / "mine.txt"
    plain.write_text("\n".join(poems), encoding="utf-8")
    assert sum(p["split"] == "val" for p in read_user_corpus(plain)) == 12  # 5 % of 240
    mixed = tmp_path / "mine.jsonl"
    mixed.write_text("\n".join(json.dumps({"text": t, "split": "val" if i < 3 else "train", "id": str(i)})
                               for i, t in enumerate(POEMS)), encoding="utf-8")
    assert [p["split"] for p in read_user_corpus(mixed)] == ["val"] * 3 + ["train"] * 3
    one = tmp_path / "one.txt"
    one.write_text(POEMS[0], encoding="utf-8")
    with pytest.raises(ValueError, match="holds 1 poem the cleaning rules keep; a corpus needs 2 at least"):
        read_user_corpus(one)


def test_a_poet_the_corpus_lacks_and_a_missing_base_are_refused(tmp_path, train_cfg, base):
    with pytest.raises(ValueError, match="data.poets: 李百 has no training poem in the corpus; nearest authors: 李白"):
        finetune(train_cfg, base, "data.poets=['李百']")
    with pytest.raises(FileNotFoundError, match="init_from=.*nowhere.ckpt: no such checkpoint"):
        finetune(train_cfg, tmp_path / "nowhere.ckpt")
    from train import train
    with pytest.raises(ValueError, match="experiment=finetune needs init_from="):
        train(train_cfg("experiment=finetune", "logger=none"))
    assert not (tmp_path / "checkpoints" / "ft").exists()


HUANXISHA = "一曲新词酒一杯。去年天气旧亭台。夕阳西下几时回。无可奈何花落去，似曾相识燕归来。小园香径独徘徊。"


def ci_corpus(path):
    """A 全宋词 of 40 浣溪沙 (in its schema), 20 under 苏轼's name and 20 under 晏殊's, every fifth held out."""
    with lzma.open(path, "wt", encoding="utf-8") as f:
        for c in range(20):
            for author in ("苏轼", "晏殊"):
                f.write(json.dumps({"id": f"ci-{c}-{author}", "title": "浣溪沙", "heading": "浣溪沙", "author": author,
                                    "form": CI, "tune": "浣溪沙", "shape": shape_of(HUANXISHA),
                                    "split": "val" if c % 5 == 0 else "train", "text": HUANXISHA},
                                   ensure_ascii=False) + "\n")
    return path


def test_a_ci_model_finetunes_on_a_ci_poet_of_the_song_ci_and_writes_his_tune(tmp_path, train_cfg, caplog):
    """Issue 59: `experiment=ci` + `data.poets=[苏轼]` was refused (the poets were read in the Tang poems only)."""
    from train import train

    tang, ci = authored_corpus(tmp_path / "corpus" / "tang.jsonl.xz"), ci_corpus(tmp_path / "corpus" / "ci.jsonl.xz")
    train(train_cfg("experiment=ci", f"data.train_corpora=[{tang},{ci}]", f"data.also_validate.ci={ci}",
                    "model.block_size=64", "trainer.max_steps=6", "trainer.val_check_interval=3", "logger=none",
                    "data.anneal_fraction=0.0", "model.head_cutoffs=[20,40]"))
    base = tmp_path / "checkpoints" / "test" / "last.ckpt"
    with caplog.at_level(logging.INFO):
        finetune(train_cfg, base, "data.poets=['蘇軾']")  # either script
    assert caplog.text.count("data.poets=['蘇軾']: 0 诗 and 20 词 (training and held-out) in tang.jsonl.xz, "
                             "ci.jsonl.xz") == 1
    assert "no annealing phase in this run; no training poem rhymes" in caplog.text  # the test's 词 keep no rhyme
    caplog.clear()
    corpora = {path: load_corpus(path) for path in (tang, ci)}
    assert len(poets_poems(corpora, ["苏轼"], "simplified", say=False)[ci]) == 20 and "data.poets" not in caplog.text
    tuned = read_trained(tmp_path / "checkpoints" / "ft" / "last.ckpt")
    assert tuned["finetuned"]["train_poems"] == 16 and tuned["finetuned"]["val_poems"] == 4
    assert tuned["corpora"]["train"] == ["tang.jsonl.xz", "ci.jsonl.xz"]
    engine = load_engine(tmp_path / "checkpoints" / "ft", tmp_path / "checkpoints")
    poems = sample_poems(engine, SamplingOptions(num_samples=2, tune="浣溪沙", max_new_tokens=60))
    assert [shape_of(p) for p in poems] == [shape_of(HUANXISHA)] * 2


def test_a_tang_base_counts_its_poets_poems_without_naming_the_词_it_never_read(caplog):
    """From a new user's trial: a Tang-only base said "1,125 诗 and 0 词"; the 词 are named where a corpus of them
    was read."""
    poems = [{"author": "李白", "split": split, "text": "床前明月光，疑是地上霜。", "form": "wujue"}
             for split in ("train", "val")]
    with caplog.at_level(logging.INFO):
        poets_poems({Path("tang.jsonl.xz"): poems}, ["李白"], "simplified")
    assert "data.poets=['李白']: 2 诗 (training and held-out) in tang.jsonl.xz" in caplog.text and "词" not in caplog.text


def test_the_run_name_says_what_it_read():
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        names = [compose("train", overrides=o).run_name for o in (
            [], ["experiment=ci"], ["experiment=finetune", "init_from=x", "data.poets=['李白','杜甫']"],
            ["experiment=finetune", "init_from=x", "data.corpus_path=/tmp/my poems.txt"])]
    assert [n.split("-", 2)[2].rsplit("-", 1)[0] for n in names] == [
        "tiny-sdpa-char", "tiny-sdpa-char-ci", "tiny-sdpa-char-ft-libai_dufu", "tiny-sdpa-char-ft-mypoems_txt"]
    assert finetune_tag([], "data/corpus/诗.txt") == "ft-_txt" and finetune_tag([], "诗") == "ft-corpus"


def test_torchrun_without_trainer_ddp_trains_as_lightning_would(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    for key, value in {"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(key, value)
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        trainer = compose("train").trainer  # trainer=auto: no strategy key, a struct
    ddp_strategy(trainer, 300)
    assert trainer.devices == 2 and trainer.num_nodes == 2
    assert trainer.strategy["_target_"] == "lightning.pytorch.strategies.DDPStrategy"


def test_a_stopped_finetuning_run_resumes_with_its_own_vocabulary(tmp_path, train_cfg, base):
    from train import train

    finetune(train_cfg, base, "data.poets=['李白']")
    first = read_trained(tmp_path / "checkpoints" / "ft" / "last.ckpt")
    cfg = train_cfg("experiment=finetune", f"ckpt_path={tmp_path / 'checkpoints' / 'ft'}", "data.poets=['李白']",
                    "trainer.max_steps=6", "trainer.val_check_interval=2", "logger=none")  # no init_from
    with open_dict(cfg):
        cfg.run_name = "ft2"
    train(cfg)
    resumed = read_trained(tmp_path / "checkpoints" / "ft2" / "last.ckpt")
    assert resumed["global_step"] == 6 and resumed["finetuned"] == first["finetuned"]
    assert resumed["hyper_parameters"]["tokenizer"] == first["hyper_parameters"]["tokenizer"]


def test_a_refused_finetuning_run_writes_nothing_and_says_one_line(tmp_path, base):
    """Through Hydra, as a user runs it: the check runs before Hydra makes the run's folder."""
    import subprocess
    import sys

    from tests.conftest import tiny_overrides

    empty = tmp_path / "empty.txt"
    empty.write_text("")
    before = sorted(p.name for p in (tmp_path / "logs").iterdir())
    for option in (f"data.corpus_path={empty}", "data.poets=['李百']"):
        tang = tmp_path / "corpus" / "tang.jsonl.xz"
        overrides = [o for o in tiny_overrides(tmp_path, tang) if not o.startswith("data.corpus_path")] + \
            ([] if "corpus_path" in option else [f"data.corpus_path={tang}"])
        done = subprocess.run([sys.executable, "train.py", "experiment=finetune", f"init_from={base}", option,
                               *overrides], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 1 and done.stdout == ""
        assert done.stderr.strip().count("\n") == 0 and done.stderr.startswith("error: "), done.stderr
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == before
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["test"]


def test_a_finetuned_run_resumed_on_other_data_is_refused(tmp_path, train_cfg, base):
    from train import train

    finetune(train_cfg, base, "data.poets=['李白']")
    for options in (["data.poets=['孟浩然']", "experiment=finetune"], []):
        cfg = train_cfg(*options, f"ckpt_path={tmp_path / 'checkpoints' / 'ft'}", "logger=none")
        with open_dict(cfg):
            cfg.run_name = "ft3"
        for check in (train, check_start):  # check_start: Hydra's callback, before the run's folder is made
            with pytest.raises(ValueError, match=r"is a fine-tuning run on 李白: resume it as it was started, python "
                                                 r"train.py experiment=finetune \"data.poets=\[李白\]\" ckpt_path="):
                check(cfg)
