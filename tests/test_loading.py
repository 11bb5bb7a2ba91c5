"""The one loader (model/loading.py): the builder fills the poem inputs' tables for a tokenizer,
checkpoints written before the seams (field `attention`, top-level poem-input and head names)
still load and resume, and the device is resolved in one place."""
import pytest
import torch

from data.features import phonology_tables, token_kinds
from data.tokenizer import CharTokenizer
from model.device import resolve_device
from model.loading import build_gpt, config_fields, load_engine, model_fields
from model.training.lit import LitGPT
from tests.conftest import POEMS

MODEL = {"block_size": 24, "n_layer": 1, "n_head": 2, "n_embd": 16, "phonology": True, "phon_output": True,
         "structure": True, "rhyme_loss_weight": 0.2}


def legacy(state: dict) -> dict:
    """A LitGPT state_dict as train.py wrote it before the poem inputs and the head were modules."""
    renames = (("gpt.poem.", "gpt."), ("gpt.lm_head.tied.", "gpt.lm_head."), ("gpt.lm_head.adaptive.", "gpt.lm_head."),
               ("gpt.lm_head.id_rank", "gpt.id_rank"))
    out = {}
    for key, value in state.items():
        new, was = next(((n, w) for n, w in renames if key.startswith(n)), ("", ""))
        out[was + key[len(new):]] = value
    return out


@pytest.mark.parametrize("head", ["tied", "adaptive"])
def test_a_checkpoint_from_before_the_seams_loads_and_resumes(tmp_path, head):
    tok = CharTokenizer([*"".join(POEMS), *(chr(0x4E00 + i) for i in range(60))])
    torch.manual_seed(0)
    lit = LitGPT({**MODEL, "head": head, "head_cutoffs": [40], "backend": "naive"}, {}, tok.state_dict(), "traditional")
    state = legacy(lit.state_dict())
    assert "gpt.wge.weight" in state and "gpt.poem.wge.weight" not in state
    assert ("gpt.id_rank" in state) == (head == "adaptive") and ("gpt.lm_head.weight" in state) == (head == "tied")
    hp = {**dict(lit.hparams), "model": {**{k: v for k, v in lit.hparams.model.items() if k != "backend"},
                                         "attention": "naive", "phon_groups": 31}}
    path = tmp_path / "old" / "last.ckpt"
    path.parent.mkdir()
    torch.save({"hyper_parameters": hp, "state_dict": state}, path)
    engine = load_engine(path.parent)
    assert engine.model.cfg.backend == "naive" and engine.path == path
    idx, _ = engine.encode_line("床前明月光，")
    torch.testing.assert_close(engine.model(idx), lit.eval().gpt(idx), rtol=0, atol=0)
    resumed = LitGPT(**dict(lit.hparams))
    resumed.load_state_dict(state)  # Lightning's resume: strict, through the GPT's own renaming
    torch.testing.assert_close(resumed.eval().gpt(idx), lit.gpt(idx), rtol=0, atol=0)


def test_config_fields_rename_the_backend_and_drop_the_counts():
    assert config_fields({"attention": "flash", "n_layer": 2, "phon_groups": 31, "phon_tones": 4}) == {
        "backend": "flash", "n_layer": 2}


def test_the_builder_fills_the_tables_and_is_what_training_starts_from():
    tok = CharTokenizer.from_texts(POEMS)
    torch.manual_seed(5)
    gpt = build_gpt(MODEL, tok, "traditional")
    tables = phonology_tables(tok, "traditional")
    assert torch.equal(gpt.poem.phon_group_ids, torch.tensor(tables.groups))
    assert torch.equal(gpt.poem.token_kind, torch.tensor(token_kinds(tok)))
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
