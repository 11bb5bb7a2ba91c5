"""The one loader (model/loading.py): the builder fills the poem inputs' tables for a tokenizer,
checkpoints written before issue 37 (four poem-input flags, options with one value now) still
load and resume where they describe the one recipe left, and the device is resolved in one place."""
import pytest
import torch

from data.features import full_stops, phonology_tables, token_kinds
from data.tokenizer import CharTokenizer
from model.device import resolve_device
from model.loading import build_gpt, config_fields, load_engine, model_fields
from model.training.lit import LitGPT
from tests.conftest import POEMS

MODEL = {"block_size": 24, "n_layer": 1, "n_head": 2, "n_embd": 16, "poem_inputs": True, "rhyme_loss_weight": 0.2}
FLAGS = ("phonology", "phon_output", "structure", "struct_recover")
BEFORE = {"bias": False, "qk_norm": False, "head_div_value": 4.0, "struct_lines": 10, "struct_countdown": 10,
          "attn_dropout": None, "rhyme_loss_at": "rhyme_slots"}
"""Settings a checkpoint from before issue 37 wrote, at the one value each has now."""


@pytest.mark.parametrize("head", ["tied", "adaptive"])
def test_a_checkpoint_from_before_issue_37_loads_and_resumes(tmp_path, head):
    tok = CharTokenizer([*"".join(POEMS), *(chr(0x4E00 + i) for i in range(60))])
    torch.manual_seed(0)
    lit = LitGPT({**MODEL, "head": head, "head_cutoffs": [40], "backend": "naive"}, {}, tok.state_dict(), "traditional")
    old = {**{k: v for k, v in lit.hparams.model.items() if k != "poem_inputs"}, **dict.fromkeys(FLAGS, True), **BEFORE}
    hp = {**dict(lit.hparams), "model": old}
    path = tmp_path / "old" / "last.ckpt"
    path.parent.mkdir()
    torch.save({"hyper_parameters": hp, "state_dict": lit.state_dict()}, path)
    engine = load_engine(path.parent)
    assert engine.model.cfg.poem_inputs and engine.model.cfg.backend == "naive" and engine.path == path
    assert engine.model.poem.token_kind.eq(3).sum() >= 2  # the tables travel in the checkpoint
    assert torch.equal(engine.model.poem.phon_group_ids, lit.gpt.poem.phon_group_ids)
    idx, _ = engine.encode_line("床前明月光，")
    torch.testing.assert_close(engine.model(idx), lit.eval().gpt(idx), rtol=0, atol=0)
    assert engine.generate(idx, 5).shape == (1, 12)
    resumed = LitGPT(**hp)  # Lightning's resume: the saved hyper-parameters, then a strict state dict
    resumed.load_state_dict(lit.state_dict())
    torch.testing.assert_close(resumed.eval().gpt(idx), lit.gpt(idx), rtol=0, atol=0)


def test_config_fields_read_the_old_settings_of_the_one_recipe_and_refuse_the_rest_in_one_line():
    assert config_fields({"n_layer": 2, **dict.fromkeys(FLAGS, True), **BEFORE}) == {"n_layer": 2, "poem_inputs": True}
    assert config_fields({**dict.fromkeys(FLAGS, False), "rhyme_loss_at": "line_ends"}) == {"poem_inputs": False}
    assert config_fields({"n_layer": 2, "poem_inputs": True}) == {"n_layer": 2, "poem_inputs": True}  # a config's
    mix = {**dict.fromkeys(FLAGS, True), "struct_recover": False}
    line_ends = {**dict.fromkeys(FLAGS, True), "rhyme_loss_weight": 0.1, "rhyme_loss_at": "line_ends"}
    for settings, match in [(mix, "only some of phonology, phon_output, structure, struct_recover on"),
                            ({"bias": True}, "bias other than False"), ({"qk_norm": True}, "qk_norm other than False"),
                            (line_ends, "rhyme_loss_at other than rhyme_slots"),
                            ({"attention": "flash"}, "model.attention is not a setting")]:
        with pytest.raises(ValueError, match=match) as err:
            config_fields(settings)
        assert "\n" not in str(err.value)


def test_the_builder_fills_the_tables_and_is_what_training_starts_from():
    tok = CharTokenizer.from_texts(POEMS)
    torch.manual_seed(5)
    gpt = build_gpt(MODEL, tok, "traditional")
    tables = phonology_tables(tok, "traditional")
    assert torch.equal(gpt.poem.phon_group_ids, torch.tensor(tables.groups))
    assert torch.equal(gpt.poem.token_kind, torch.tensor(token_kinds(tok)))
    assert torch.equal(gpt.poem.full_stop, torch.tensor(full_stops(tok))) and gpt.poem.full_stop.sum() >= 1
    assert (gpt.poem.phon_group_ids[:, 0] > 0).sum() > 10 and (gpt.poem.token_kind == 3).sum() >= 2
    torch.manual_seed(5)
    lit = LitGPT(MODEL, {}, tok.state_dict(), "traditional")
    again = build_gpt(model_fields(lit.gpt.cfg), tok, "traditional")  # attention_maps.py's baseline, from a config
    assert all(torch.equal(a, b) for a, b in zip(lit.gpt.state_dict().values(), gpt.state_dict().values()))
    assert again.cfg == gpt.cfg


def test_the_device_is_resolved_in_one_place():
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="not a device torch knows"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            resolve_device("cuda")
