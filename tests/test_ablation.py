"""Switching heads off (model/ablation.py, `switch_off`: a hook on W_O): the same on every
backend and with the KV cache, nothing changes once the hook is removed, only the named head
changes, and with every head off only the embeddings' and MLPs' path is left."""
import pytest
import torch

from data.tokenizer import CharTokenizer
from model.ablation import ablate, ablated_suffix, head_means, parse_heads, switch_off
from model.attention import BACKENDS
from model.engine import Engine
from model.gpt import GPT, GPTConfig
from model.kv_cache import Cache
from model.loading import load_engine
from tests.conftest import POEMS, write_corpus
from tests.test_attention_maps import write_checkpoint

V = 40


def tiny(backend="naive", **kw):
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=V, block_size=16, n_layer=2, n_head=4, n_embd=32, backend=backend, **kw)).eval()
    with torch.no_grad():  # every path away from its zero start
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return m


IDX = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(1))


def head_outputs(m, idx):
    """Each layer's heads' outputs at the input of W_O: n_layer tensors (B, T, n_head, d_k)."""
    seen, n_head = [], m.cfg.n_head
    hooks = [b.attn.c_proj.register_forward_pre_hook(
        lambda mod, a: seen.append(a[0].view(*a[0].shape[:2], n_head, -1))) for b in m.blocks]
    with torch.no_grad():
        m(idx)
    for h in hooks:
        h.remove()
    return seen


def test_one_head_off_leaves_the_others_of_its_layer_and_the_layers_before_and_comes_back_bit_identical():
    m = tiny()
    before, full = m(IDX), head_outputs(m, IDX)
    handle = switch_off(m.blocks[1].attn, [2])
    off = head_outputs(m, IDX)
    assert torch.equal(off[0], full[0])  # layer 0: untouched
    assert torch.equal(off[1][:, :, [0, 1, 3]], full[1][:, :, [0, 1, 3]]) and (off[1][:, :, 2] == 0).all()
    handle.remove()  # every head on again
    assert torch.equal(m(IDX), before)
    handle = switch_off(m.blocks[1].attn, [2], torch.full((1, 8), 0.5))  # mean ablation: the value given, everywhere
    assert (head_outputs(m, IDX)[1][:, :, 2] == 0.5).all()


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_the_same_on_every_backend_and_with_the_kv_cache(mode):
    values = torch.randn(2, 8, generator=torch.Generator().manual_seed(2)) if mode == "mean" else None
    models = {b: tiny(b, pos_emb="rope") for b in BACKENDS}
    for m in models.values():
        switch_off(m.blocks[0].attn, [1, 3], values)
    full = models["naive"](IDX)
    for b, m in models.items():
        torch.testing.assert_close(m(IDX), full, rtol=1e-5, atol=1e-5)
        cache = Cache(m.cfg.n_layer, m.cfg.block_size)
        steps = [m(IDX[:, :5], cache=cache)[:, -1]] + [m(IDX[:, t:t + 1], cache=cache)[:, -1] for t in range(5, 12)]
        torch.testing.assert_close(torch.stack(steps, 1), full[:, 4:], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(full, tiny("naive", pos_emb="rope")(IDX))  # it did change the model


def test_every_head_off_leaves_the_embeddings_and_the_mlps():
    m = tiny()
    for block in m.blocks:
        switch_off(block.attn, range(4))
    with torch.no_grad():
        x = m.wte(IDX) + m.wpe(torch.arange(12))
        for block in m.blocks:
            x = x + block.mlp(block.ln_2(x))
        expected = m.lm_head(m.ln_f(x))
    torch.testing.assert_close(m(IDX), expected, rtol=1e-5, atol=1e-6)


def test_ablated_results_go_to_folders_of_their_own():
    assert ablated_suffix([], "zero") == "" and ablated_suffix(["L3H1", "L3H0"], "mean") == "-ablate-L3H1-L3H0-mean"


def test_head_names_are_checked_in_one_line():
    assert parse_heads(["L1H0", "L0H3", "L1H0"], 2, 4) == [(1, 0), (0, 3)]
    assert parse_heads("L1H2", 2, 4) == [(1, 2)]  # `ablate=L1H2` without brackets: one head, not its characters
    with pytest.raises(ValueError, match=r"^ablate: L9H0 is not a head of this model, which has layers 0–1 and heads "
                                         r"0–3 \(L0H0 … L1H3\)$"):
        parse_heads(["L9H0"], 2, 4)
    with pytest.raises(ValueError, match=r"^ablate: 'head3' is not a head name; name heads L<layer>H<head>, e.g. L3H2$"):
        parse_heads(["head3"], 2, 4)
    with pytest.raises(ValueError, match="values must be"):
        switch_off(tiny().blocks[0].attn, [1], torch.zeros(2, 8))
    with pytest.raises(ValueError, match="head 4 is not one of this layer's heads"):
        switch_off(tiny().blocks[0].attn, [4])


def test_the_mean_is_each_heads_mean_output_over_the_poems():
    tok = CharTokenizer.from_texts(POEMS)
    torch.manual_seed(0)
    engine = Engine(GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=40, n_layer=2, n_head=4, n_embd=32)).eval(),
                    tok, "traditional")
    means = head_means(engine, POEMS[:3])
    seqs = [engine.encode_line(p)[0] for p in POEMS[:3]]
    outs = [head_outputs(engine.model, s) for s in seqs]  # per poem: n_layer × (1, T, 4, 8)
    expected = torch.stack([torch.cat([o[ly][0] for o in outs]).mean(0) for ly in range(2)])  # (n_layer, 4, 8)
    torch.testing.assert_close(means, expected, rtol=1e-5, atol=1e-6)
    ablate(engine, ["L1H2"], "mean", POEMS[:3])
    assert engine.ablated == ["L1H2"] and len(engine.ablation_hooks) == 1
    torch.testing.assert_close(head_outputs(engine.model, seqs[0])[1][0, :, 2], means[1, 2].expand(len(seqs[0][0]), 8))
    ablate(engine, ["L0H1"])  # every head on again first: only L0H1 off
    assert engine.ablated == ["L0H1"] and len(engine.ablation_hooks) == 1
    after = head_outputs(engine.model, seqs[0])
    assert (after[0][0, :, 1] == 0).all() and not (after[1][0, :, 2] == means[1, 2]).all()


def test_the_loader_sets_it_for_every_script(tmp_path):
    ckpt = write_checkpoint(tmp_path / "checkpoints" / "run" / "last.ckpt")
    corpus = write_corpus(tmp_path / "tang.jsonl.xz")
    plain, off = load_engine(ckpt), load_engine(ckpt, ablate=["L1H0"])
    idx, _ = plain.encode_line("床前明月光")
    assert off.ablated == ["L1H0"] and not torch.allclose(plain.model(idx), off.model(idx))
    mean = load_engine(ckpt, ablate=["L1H0"], ablate_mode="mean", corpus_path=corpus)
    assert not torch.allclose(mean.model(idx), off.model(idx))
    with pytest.raises(ValueError, match="ablate_mode=mean needs the training corpus"):
        load_engine(ckpt, ablate=["L1H0"], ablate_mode="mean")
    with pytest.raises(ValueError, match="ablate_mode='half' is not one of zero, mean"):
        load_engine(ckpt, ablate=["L1H0"], ablate_mode="half")


def test_the_kinds_of_target_of_a_poem():
    from model.inspection.head_effects import KINDS, target_kinds

    labels = ["<bos>", *"床前明月光，疑是地上霜。举头望明月，低头思故乡。", "<eos>"]
    kinds = target_kinds(labels)  # row i: the target labels[i + 1]
    rows = {k: kinds[:, i].nonzero()[:, 0].tolist() for i, k in enumerate(KINDS)}
    assert rows["rhyme_slot"] == [10, 22] and rows["line_start"] == [0, 6, 12, 18]
    assert rows["mark"] == [5, 11, 17, 23] and rows["eos"] == [24] and len(rows["all"]) == 25


def test_a_head_that_writes_nothing_has_no_effect_and_every_head_is_on_again():
    from model.inspection.head_effects import KINDS, head_effects
    from tests.test_rhyme_heads import engine as random_engine

    engine = random_engine(silent=[(1, 1)])  # head 1 of layer 1 writes nothing to the residual stream
    gpt = engine.model.eval()
    idx = engine.encode_line(POEMS[0])[0]
    before = gpt(idx)
    effects = head_effects(engine, POEMS, batch_size=4)
    assert effects["targets"]["rhyme_slot"] == 12 and effects["targets"]["eos"] == 6  # 2 per poem
    silent = next(h for h in effects["heads"] if (h["layer"], h["head"]) == (1, 1))
    assert all(silent[k] == 0 for k in KINDS)
    assert all(abs(h["all"]) > 1e-4 for h in effects["heads"] if h is not silent)
    layer1 = effects["layer_mean"][1]
    assert layer1["all"] == pytest.approx(sum(h["all"] for h in effects["heads"][4:]) / 4)
    assert torch.equal(gpt(idx), before) and engine.ablated == []
