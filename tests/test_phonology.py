"""Phonology features: the per-vocabulary tables (data/phonology.py), the network's embeddings
and auxiliary rhyme loss, the KV cache and the backends with them, checkpoints with and without."""
import pytest
import torch

from data.phonology import PAD, READINGS, group_ids, phonology_tables
from data.tokenizer import CharTokenizer
from model.attention import BACKENDS
from model.engine import Engine
from model.gpt import GPT, GPTConfig
from model.training.lit import LitGPT
from tests.conftest import POEMS, generate

V = 60


def test_group_ids_number_the_thirty_level_tone_groups_in_table_order():
    ids = group_ids()
    assert len(ids) == 30 and ids["上平聲一東"] == 1 and ids["下平聲七陽"] == 22 and ids["下平聲十五咸"] == 30


def test_tables_of_known_characters():
    tok = CharTokenizer("光霜乡看月，。1")
    t = phonology_tables(tok, "simplified")
    row = {c: (t.groups[tok.stoi[c]], t.tones[tok.stoi[c]], t.line_end[tok.stoi[c]]) for c in "光霜乡看月，。1"}
    yang = [22, PAD, PAD, PAD]
    assert row["光"] == (yang, 1, False) and row["霜"] == (yang, 1, False)
    assert row["乡"] == (yang, 3, False)  # also 去聲二十三漾: both tones
    assert row["看"] == ([group_ids()["上平聲十四寒"], PAD, PAD, PAD], 3, False)
    assert row["月"] == ([0, PAD, PAD, PAD], 2, False)  # 入聲六月 only: no level-tone group
    assert row["，"] == ([0, PAD, PAD, PAD], 0, True) and row["。"][2] and row["1"] == ([0, PAD, PAD, PAD], 0, False)
    assert t.groups[0] == [0, PAD, PAD, PAD] and t.tones[0] == 0  # <bos>
    assert len(t.groups) == tok.vocab_size and all(len(g) == READINGS for g in t.groups)


def tiny(backend="naive", **kw):
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=V, block_size=80, n_layer=2, n_head=2, n_embd=32, attention=backend,
                      phonology=True, **kw)).eval()
    g = torch.Generator().manual_seed(3)
    groups = torch.randint(0, 31, (V, 4), generator=g)
    groups[:, 1:][torch.rand(V, 3, generator=g) < 0.7] = -1  # most tokens one reading, some several
    m.set_phonology(groups, torch.randint(0, 4, (V,), generator=g), torch.arange(V) % 7 == 0)
    return m


def test_the_features_change_the_logits_and_a_polyphonic_token_gets_the_mean_of_its_readings():
    m = tiny()
    idx = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = m(idx)
        m.wge.weight.zero_(), m.wtone.weight.zero_()
        assert not torch.allclose(plain, m(idx))
        m.wge.weight.copy_(torch.arange(31.0)[:, None].expand(31, 32))  # group i's embedding: all i
        m.phon_group_ids[5] = torch.tensor([2, 6, -1, -1])
        assert torch.equal(m._phonology(torch.tensor([[5]]))[0, 0], torch.full((32,), 4.0))  # (2 + 6) / 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_kv_cache_gives_the_same_logits_as_a_full_forward_with_the_features(backend):
    m = tiny(backend)
    start = torch.randint(0, V, (3, 5), generator=torch.Generator().manual_seed(1))
    cached = generate(m, start, 64, temperature=0, use_cache=True)
    assert torch.equal(cached, generate(m, start, 64, temperature=0, use_cache=False))
    full = m(cached[:, :-1])  # (3, 68, V)
    cache = m.new_cache()
    steps = [m(cached[:, :5], cache=cache)] + [m(cached[:, t:t + 1], cache=cache) for t in range(5, 68)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("backend", ["sdpa", "flash"])
def test_backends_give_the_same_model_with_the_features(backend):
    idx = torch.randint(0, V, (2, 16))
    torch.testing.assert_close(tiny(backend)(idx), tiny("naive")(idx), rtol=1e-5, atol=1e-5)


def test_the_rhyme_loss_scores_line_final_targets_only():
    m = tiny(rhyme_loss_weight=0.5)
    idx = torch.randint(1, V, (2, 12), generator=torch.Generator().manual_seed(2))
    y = torch.randint(1, V, (2, 12), generator=torch.Generator().manual_seed(4))
    y[y % 7 == 0] += 1  # no line-end marks: no rhyme term
    assert m._rhyme_loss(m._hidden(idx), y).item() == 0.0
    y[0, 5] = 7  # a mark after target 4: target 4 is line-final
    x = m._hidden(idx)
    expected = 0.5 * torch.nn.functional.cross_entropy(m.rhyme_head(x[0, 4:5]), m.phon_group_ids[y[0, 4:5], 0])
    torch.testing.assert_close(m._rhyme_loss(x, y), expected)
    ce = torch.nn.functional.cross_entropy(m(idx).view(-1, V), y.view(-1))
    torch.testing.assert_close(m.loss(idx, y), ce + expected)  # the language-model loss plus the rhyme term
    with pytest.raises(ValueError, match="needs phonology"):
        GPT(GPTConfig(vocab_size=V, rhyme_loss_weight=0.5))


def test_bad_tables_are_refused():
    m, tones, ends = tiny(), torch.zeros(V, dtype=torch.long), torch.zeros(V, dtype=torch.bool)
    with pytest.raises(ValueError, match="groups must be"):
        m.set_phonology(torch.zeros(V, 3, dtype=torch.long), tones, ends)
    with pytest.raises(ValueError, match="tones ids"):
        m.set_phonology(torch.zeros(V, 4, dtype=torch.long), torch.full((V,), 4), ends)
    with pytest.raises(ValueError, match="first group id"):
        m.set_phonology(torch.full((V, 4), -1), tones, ends)
    with pytest.raises(ValueError, match="no phonology"):
        GPT(GPTConfig(vocab_size=V)).set_phonology(torch.zeros(V, 4), torch.zeros(V), torch.zeros(V))


def test_a_checkpoint_with_the_features_keeps_its_tables_and_samples(tmp_path):
    tok = CharTokenizer.from_texts(POEMS)
    torch.manual_seed(0)
    lit = LitGPT({"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16, "phonology": True,
                  "rhyme_loss_weight": 0.3}, {}, tok.state_dict(), script="traditional")
    path = tmp_path / "last.ckpt"
    torch.save({"hyper_parameters": dict(lit.hparams), "state_dict": lit.state_dict()}, path)
    engine = Engine.load(path)
    assert torch.equal(engine.model.phon_group_ids, lit.gpt.phon_group_ids)
    assert (engine.model.phon_group_ids[:, 0] > 0).any() and engine.model.line_end.sum() >= 2
    idx, _ = engine.encode_line("床前明月光", "prompt")
    torch.testing.assert_close(engine.model(idx), lit.eval().gpt(idx))
    assert engine.generate(idx, 5).shape == (1, 11)
