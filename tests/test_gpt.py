import math

import pytest
import torch
import torch.nn.functional as F

from model.gpt import GPT, GPTConfig
from model.loading import head_for_vocabulary
from tests.conftest import generate


def tiny(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(**{"vocab_size": 50, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32, **kw})).eval()


def test_forward_shapes_and_initial_loss():
    m = tiny()
    idx, targets = torch.randint(0, 50, (2, 3, 10))
    logits, loss = m(idx), m.loss(idx, targets)
    assert logits.shape == (3, 10, 50)
    assert abs(loss.item() - math.log(50)) < 0.1  # GPT-2 init: near-uniform predictions
    torch.testing.assert_close(loss, F.cross_entropy(logits.view(-1, 50), targets.view(-1)))
    assert m.lm_head.tied.weight is m.wte.weight
    std = m.blocks[0].attn.c_proj.weight.std().item()
    assert abs(std - 0.02 / math.sqrt(4)) < 0.003


def test_too_long_input_is_refused():
    with pytest.raises(ValueError, match="block_size"):
        tiny()(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("backend", ["naive", "sdpa", "flash"])
def test_attention_maps_of_every_backend_are_the_weights_naive_attention_uses(backend):
    naive, model = tiny(backend="naive", n_layer=3), tiny(backend=backend, n_layer=3)
    used = []  # the weights each naive layer multiplies with v: its attention dropout's input
    for block in naive.blocks:
        block.attn.attn_dropout.register_forward_hook(lambda mod, inp, out: used.append(inp[0]))
    idx = torch.randint(0, 50, (2, 9))
    naive(idx)
    maps = model.attention_maps(idx)
    assert len(maps) == len(used) == naive.cfg.n_layer
    for m, w in zip(maps, used):
        assert m.shape == (2, 2, 9, 9) and (m.triu(1) == 0).all()
        torch.testing.assert_close(m, w, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(m.sum(-1), torch.ones(2, 2, 9))


def test_generate_stops_each_row_after_eos():
    """Cropping, seeding and the sampling arguments: tests/test_sampling.py."""
    m = tiny()
    start = torch.zeros(2, 14, dtype=torch.long)
    eos = int(generate(m, start, 1, temperature=0)[0, 14])  # the first greedy token: every row stops right after it
    stopped = generate(m, start, max_new_tokens=10, temperature=0, eos_id=eos)
    assert stopped.shape == (2, 15) and (stopped[:, -1] == eos).all()


def test_adaptive_head_gives_log_probabilities_and_their_cross_entropy():
    m = tiny(head="adaptive", head_cutoffs=(10, 30))
    counts = torch.randint(0, 100, (50,))
    m.lm_head.set_token_counts(counts)
    order = torch.sort(-counts, stable=True).indices
    assert torch.equal(m.lm_head.id_rank[order], torch.arange(50))  # the most frequent id has rank 0
    idx, targets = torch.randint(0, 50, (2, 3, 10))
    targets[0, :4] = -1  # not scored
    logp = m(idx)  # (3, 10, 50)
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(3, 10))
    loss = m.loss(idx, targets)  # from the targets' clusters only: training does not pay for the full distribution
    torch.testing.assert_close(loss, F.cross_entropy(logp.view(-1, 50), targets.view(-1), ignore_index=-1))
    assert "lm_head.id_rank" in m.state_dict()  # the order travels with the checkpoint
    rare = int(order[-1])  # a tail-cluster id gets its probability through the cluster
    assert logp[..., rare].exp().max() < 1 and logp[..., rare].exp().min() > 0
    with pytest.raises(ValueError, match="shape|must be"):
        m.lm_head.set_token_counts(torch.ones(49))


def test_the_head_is_decided_for_the_vocabulary_before_the_model_and_said(caplog):
    asked = {"head": "adaptive", "head_cutoffs": [30, 60]}
    with caplog.at_level("INFO", logger="model.loading"):
        assert head_for_vocabulary(asked, 50) == {"head": "adaptive", "head_cutoffs": [30]}
        assert "[60] are not below the vocabulary of 50" in caplog.text
        small = head_for_vocabulary({"head": "adaptive", "head_cutoffs": [50, 60]}, 50)  # a small BPE vocabulary
        assert small == {"head": "tied", "head_cutoffs": []} and "model.head=tied" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="model.loading"):
        assert head_for_vocabulary(small, 50) == small and head_for_vocabulary({"head": "adaptive"}, 5000) == {
            "head": "adaptive"}  # decided already, or nothing to decide: said nothing
    assert caplog.text == ""
    m = tiny(**small)
    assert m.cfg.head == "tied" and m.lm_head.tied.weight is m.wte.weight
    with pytest.raises(ValueError, match="below vocab_size 50"):  # never changed silently
        tiny(head="adaptive", head_cutoffs=(30, 60))
    with pytest.raises(ValueError, match="increasing"):
        tiny(head="adaptive", head_cutoffs=(30, 20))
    with pytest.raises(ValueError, match="unknown head"):
        tiny(head="sampled")


def test_architecture_options():
    m = tiny(pos_emb="rope", mlp_act="relu2", zero_init_proj=True)
    assert m.wpe is None and all(b.attn.rope for b in m.blocks)
    assert all(b.attn.c_proj.weight.abs().sum() == 0 and b.mlp.c_proj.weight.abs().sum() == 0 for b in m.blocks)
    x = torch.randn(2, 5, 32)
    assert torch.equal(m.blocks[0](x), x)  # zero-initialised projections: each block starts as the identity
    h = torch.linspace(-2, 2, 9)
    m.blocks[0].mlp.c_fc = torch.nn.Identity()
    m.blocks[0].mlp.c_proj = torch.nn.Identity()
    assert torch.equal(m.blocks[0].mlp(h), torch.relu(h) ** 2)  # ReLU², Primer
    with pytest.raises(ValueError, match="unknown pos_emb"):
        tiny(pos_emb="alibi")
    with pytest.raises(ValueError, match="unknown mlp_act"):
        tiny(mlp_act="swiglu")
