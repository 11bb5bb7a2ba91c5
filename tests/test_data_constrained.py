"""What the data-constrained study varies (benchmarks/data_constrained.py): a training subset of
whole poems, and dropout on the attention weights apart from the rest."""
import numpy as np
import pytest
import torch

from data.windows import poem_subset
from model.gpt import GPT, GPTConfig


def test_a_subset_is_whole_poems_drawn_at_random_in_array_order():
    poems = [[0, 5, 6, 1], [0, 7, 1], [0, 8, 9, 9, 1], [0, 4, 1], [0, 3, 3, 1]]  # <bos> … <eos>
    tokens = np.array([t for p in poems for t in p], dtype=np.uint16)
    sub = poem_subset(tokens, 7)
    assert np.array_equal(sub, poem_subset(tokens, 7)) and len(sub) >= 7
    kept = [p for p in poems if any(np.array_equal(sub[i:i + len(p)], p) for i in range(len(sub)))]
    assert sum(map(len, kept)) == len(sub) and sub[0] == 0  # whole poems, nothing else
    assert len(sub) - max(map(len, kept)) < 7  # it stops at the first poem that reaches n_tokens
    assert any(not np.array_equal(poem_subset(tokens, 7, seed=s), sub) for s in range(1, 6))  # seeded
    assert np.array_equal(poem_subset(tokens, 10 ** 6), tokens)


@pytest.mark.parametrize("attn_dropout, weights, resid", [(None, 0.3, 0.3), (0.0, 0.0, 0.3), (0.2, 0.2, 0.3)])
def test_attention_dropout_can_be_set_apart(attn_dropout, weights, resid):
    gpt = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, n_embd=16, dropout=0.3,
                        attn_dropout=attn_dropout))
    attn = gpt.blocks[0].attn
    assert (attn.dropout, attn.attn_dropout.p, attn.resid_dropout.p) == (weights, weights, resid)
    assert gpt.blocks[0].mlp.dropout.p == gpt.drop.p == 0.3
    gpt.eval()
    x = torch.randint(0, 20, (1, 8))
    assert torch.equal(gpt(x), gpt(x))  # no dropout in eval
