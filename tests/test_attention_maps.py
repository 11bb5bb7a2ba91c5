"""attention_maps.py on tiny checkpoints written in the test."""
import json
import lzma
import re

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from attention_maps import attention_report, format_table
from data.corpus_io import heldout_poems
from data.tokenizer import CharTokenizer
from data.verse.plan import plan_labels
from data.verse.poetry import form_of
from data.verse.script import corpus_to_script
from model.inspection.attention_stats import STATISTICS, random_qk_maps
from model.training.lit import LitGPT
from tests.conftest import POEMS, ROOT
from tests.html_views import dense, embedded_data


@pytest.fixture
def corpus(tmp_path):
    """Two copies of POEMS: the first in train, the second in val (4 wujue then 1 qijue each)."""
    path = tmp_path / "tang.jsonl.xz"
    with lzma.open(path, "wt", encoding="utf-8") as f:
        for split in ("train", "val"):
            for i, text in enumerate(POEMS):
                f.write(json.dumps({"id": f"{split}{i}", "title": "", "author": "", "form": form_of(text),
                                    "split": split, "text": text}, ensure_ascii=False) + "\n")
    return path


CI_PROBE = "明月几时有，把酒问青天。"


def write_checkpoint(path, n_layer=2, backend="sdpa", seed=1337, plan=False, tunes=False):
    """A checkpoint of an untrained tiny model built right after torch.manual_seed(seed) (plan: with
    plan tokens; tunes: and tune tokens)."""
    tok = CharTokenizer.from_texts(corpus_to_script([*POEMS, CI_PROBE], "simplified"),
                                   plan_labels(tunes=tunes) if plan else ())
    torch.manual_seed(seed)
    lit = LitGPT(model=dict(block_size=32, n_layer=n_layer, n_head=2, n_embd=16, dropout=0.0,
                            backend=backend), optim={}, tokenizer=tok.state_dict())
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"hyper_parameters": dict(lit.hparams), "state_dict": lit.state_dict()}, path)
    return path


def report_cfg(tmp_path, corpus, ckpt, *overrides):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("attention_maps", overrides=[
            f"ckpt_path={ckpt}", f"out_dir={tmp_path / 'out'}", f"heldout.corpus_path={corpus}",
            "heldout.n_poems=3", "baselines.n_samples=4", *overrides])


def test_a_plan_model_reads_the_probe_and_the_poems_after_their_plan(tmp_path, corpus, capsys):
    """A plan model never saw a poem without its form and rhyme tokens: the probe line, the held-out
    poems and the head-effects poems are read as it was trained on them, and fit with the plan."""
    ckpt = write_checkpoint(tmp_path / "checkpoints" / "plan" / "last.ckpt", plan=True)
    report = attention_report(report_cfg(tmp_path, corpus, ckpt, "text='床前明月光，疑是地上霜。'",
                                         "head_effects.free.num_samples=0", "head_effects.control.seeds=[0]"))
    assert report["tokens"] == ["<bos>", "<其他>", "<无韵>", *"床前明月光，疑是地上霜。"]  # a couplet: no form, no rhyme
    assert report["text"] == "床前明月光，疑是地上霜。" and report["heldout"]["poems"] == 3
    assert report["head_effects"]["poems"] == 5  # the five 五绝: 24 characters + <bos>, plan, <eos> ≤ 32
    assert "attention_maps: attention maps of the probe line and 3 held-out poems" in capsys.readouterr().err
    with pytest.raises(ValueError, match="with <bos> and its plan that is 33 positions"):
        attention_report(report_cfg(tmp_path, corpus, ckpt, "text='" + "床前明月光，" * 5 + "'"))


@pytest.mark.parametrize("tunes", [True, False])
def test_a_ci_probe_is_read_to_its_tune(tmp_path, corpus, tunes):
    """A model trained with tune tokens reads the 词 probe after its tune's token, another plan
    model after <其他>; the tune's name may be in traditional script; an unknown tune is refused, and
    on a tune model a text that fits none of the tune's templates."""
    ckpt = write_checkpoint(tmp_path / "checkpoints" / "ci" / "last.ckpt", plan=True, tunes=tunes)
    report = attention_report(report_cfg(tmp_path, corpus, ckpt, f"text='{CI_PROBE}'", "tune='水調歌頭'",
                                         "head_effects.enabled=false"))
    assert report["tokens"] == ["<bos>", *(["<水调歌头>", "<7部平>"] if tunes else ["<其他>", "<无韵>"]), *CI_PROBE]
    assert report["tune"] == "水調歌頭"
    with pytest.raises(ValueError, match="nearest: 水调歌头"):
        attention_report(report_cfg(tmp_path, corpus, ckpt, f"text='{CI_PROBE}'", "tune='水调歌'"))
    if tunes:  # 浣溪沙's lines have 7 characters: a text that starts none of its templates is refused
        with pytest.raises(ValueError, match="is not the start of a 词 to 浣溪沙: its lines fit none of"):
            attention_report(report_cfg(tmp_path, corpus, ckpt, f"text='{CI_PROBE}'", "tune='浣溪沙'"))


def test_heldout_poems_are_the_first_validation_poems_of_the_forms(corpus):
    assert heldout_poems(corpus, "simplified", 3, ["wujue"], 31) == corpus_to_script(POEMS[:3], "simplified")
    assert heldout_poems(corpus, "simplified", 9, ["qijue"], 31) == []  # 出塞-length poems do not fit
    assert heldout_poems(corpus, "traditional", 9, ["qijue"], 32) == [POEMS[5]]


def test_report_writes_figures_and_json(tmp_path, corpus):
    ckpt = write_checkpoint(tmp_path / "checkpoints" / "run" / "last.ckpt")
    report = attention_report(report_cfg(tmp_path, corpus, ckpt, "text='床前明月光，疑是地上霜。'"))
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["attention_maps.json", "attention_view.html", "layer0.png",
                                                     "layer1.png"]
    assert all((out / f"layer{i}.png").stat().st_size > 10_000 for i in range(2))
    saved = json.loads((out / "attention_maps.json").read_text())
    assert saved == json.loads(json.dumps(report))
    assert saved["tokens"] == ["<bos>", *"床前明月光，疑是地上霜。"] and saved["heldout"]["poems"] == 3
    assert re.fullmatch(r".+ \(\d+ cores, \d+ threads?\), torch .+", saved["machine"])  # named in docs/results.md
    assert [(h["layer"], h["head"]) for h in saved["probe"]["heads"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert set(saved["probe"]["baselines"]) == {"uniform", "random_qk", "random_head", "init"}
    # the checkpoint holds the seed-1337 initialisation, so its heads are the "at init" baseline
    for name in STATISTICS:
        mean = sum(h[name] for h in saved["heldout"]["heads"]) / 4
        assert mean == pytest.approx(saved["heldout"]["baselines"]["init"][name]["mean"], abs=1e-6)
    assert all(h["pattern"] == "random-like" for h in saved["probe"]["heads"])
    assert saved["html"] == str(out / "attention_view.html")
    view = embedded_data((out / "attention_view.html").read_text(encoding="utf-8"))
    assert view["kinds"] == ["trained", "at initialisation (seed 1337)", "lesson §3 random q, k (d=8)",
                             "lesson §5 random x, W_q, W_k"]  # the PNGs' rows
    effects = saved["head_effects"]
    assert effects["poems"] == 5 and effects["rhyme"]["looking"] == []  # no looking heads: the layers' free poems only
    assert sorted(effects["rhyme"]["free"]) == ["intact", "layer 0", "layer 1"]
    assert sorted(effects["rhyme"]["sets"]) == ["layer 0", "layer 1"] and sorted(effects["rhyme"]["controls"]) == ["1", "2"]
    h = effects["heads"][3]  # each head card says what switching it off cost
    assert view["effects"]["L1H1"] == f"off: {h['all']:+.3f} nats/token, {h['rhyme_slot']:+.3f} at rhyme slots"
    (probe,) = view["probes"]
    assert probe["tokens"] == saved["tokens"]
    assert [v["label"] for v in probe["verdicts"]] == ["probe line", "3 held-out poems"]
    assert [h["pattern"] for h in probe["verdicts"][1]["heads"]] == [h["pattern"] for h in saved["heldout"]["heads"]]
    trained, init = (dense(probe["maps"][k], view["scale"]) for k in (0, 1))
    np.testing.assert_allclose(trained, init, atol=5e-5)  # this checkpoint is the seed-1337 initialisation
    lesson = random_qk_maps(13, 2, 8, 0).numpy()  # the settings' section 3 maps, one per head, for every layer
    np.testing.assert_allclose(dense(probe["maps"][2], view["scale"])[0], lesson, atol=5e-5)
    table = format_table("probe", saved["probe"])
    assert "lesson §3 random q,k" in table and table.count("random-like") == 4


def test_every_backend_gives_the_same_numbers(tmp_path, corpus):
    heads = {}
    for backend in ("naive", "sdpa", "flash"):
        ckpt = write_checkpoint(tmp_path / backend / "last.ckpt", n_layer=1, backend=backend, seed=0)
        heads[backend] = attention_report(report_cfg(tmp_path, corpus, ckpt, "heldout.n_poems=1"))["heldout"]["heads"]
    for backend in ("sdpa", "flash"):
        for h, ref in zip(heads[backend], heads["naive"]):
            assert [h[n] for n in STATISTICS] == pytest.approx([ref[n] for n in STATISTICS], abs=1e-6)


def test_bad_input_is_refused_before_any_output(tmp_path, corpus):
    ckpt = write_checkpoint(tmp_path / "run" / "last.ckpt", n_layer=1)
    with pytest.raises(FileNotFoundError, match="not found"):
        attention_report(report_cfg(tmp_path, corpus, tmp_path / "missing.ckpt"))
    with pytest.raises(ValueError, match="ABC"):
        attention_report(report_cfg(tmp_path, corpus, ckpt, "text='床前ABC'"))
    with pytest.raises(ValueError, match="block_size 32"):
        attention_report(report_cfg(tmp_path, corpus, ckpt, f"text='{'床前明月光，' * 6}'"))
    with pytest.raises(ValueError, match="empty"):
        attention_report(report_cfg(tmp_path, corpus, ckpt, "text=''"))
    assert not (tmp_path / "out").exists()
