"""Sampling engine: KV cache on every backend, cropping, temperature / top-k / top-p edge cases."""
import math

import pytest
import torch

from model.attention import BACKENDS, CausalSelfAttention
from model.decoding import RepetitionPenalty, next_token, top_k_filter, top_p_filter
from model.gpt import GPT, GPTConfig
from model.kv_cache import Cache, KVCache
from model.sampling.grammar import PoemBoundaries
from tests.conftest import generate


def tiny(block_size=80, **kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=60, block_size=block_size, n_layer=2, n_head=2, n_embd=32, **kw)).eval()


@pytest.mark.parametrize("options", [{}, {"pos_emb": "rope", "head": "adaptive", "head_cutoffs": (20,)}])
@pytest.mark.parametrize("backend", BACKENDS)
def test_kv_cache_and_every_backend_give_the_logits_and_greedy_tokens_of_naive_attention(backend, options):
    m = tiny(backend=backend, **options)
    start = torch.randint(0, 60, (3, 5), generator=torch.Generator().manual_seed(1))
    cached = generate(m, start, 64, temperature=0, use_cache=True)
    assert torch.equal(cached, generate(m, start, 64, temperature=0, use_cache=False))
    assert cached.shape == (3, 69)
    full = m(cached[:, :-1])  # (3, 68, V): every position at once, no cache
    torch.testing.assert_close(full, tiny(backend="naive", **options)(cached[:, :-1]), rtol=1e-5, atol=1e-5)
    cache = Cache(m.cfg.n_layer, m.cfg.block_size)
    steps = [m(cached[:, :5], cache=cache)]  # the prompt, then one token at a time
    steps += [m(cached[:, t:t + 1], cache=cache) for t in range(5, 68)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("backend", ["naive", "sdpa"])
def test_cache_extended_by_several_tokens_uses_the_bottom_rows_of_the_mask(backend):
    torch.manual_seed(0)
    attn = CausalSelfAttention(32, 4, block_size=16, backend=backend).eval()
    x = torch.randn(2, 12, 32)
    cache = KVCache(16)
    parts = [attn(x[:, :5], cache), attn(x[:, 5:9], cache), attn(x[:, 9:], cache)]  # 5, then 4 queries vs 9 keys, ...
    torch.testing.assert_close(torch.cat(parts, dim=1), attn(x), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="block_size"):
        attn(torch.randn(2, 5, 32), cache)  # 12 + 5 > 16


@pytest.mark.parametrize("use_cache", [True, False])
def test_long_prompts_and_generations_are_cropped_to_block_size(use_cache):
    m = tiny(block_size=16)
    prompt = torch.randint(0, 60, (2, 40), generator=torch.Generator().manual_seed(2))  # > block_size
    out = generate(m, prompt, 50, temperature=1.0, use_cache=use_cache, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 90) and torch.equal(out[:, :40], prompt)
    # the last 16 tokens alone give the same first token: the model saw only them
    first = generate(m, prompt[:, -16:], 1, temperature=0, use_cache=use_cache)[:, -1]
    assert torch.equal(generate(m, prompt, 1, temperature=0, use_cache=use_cache)[:, -1], first)


def test_cache_refill_keeps_the_recent_half():
    m = tiny(block_size=16)
    start = torch.randint(0, 60, (2, 3), generator=torch.Generator().manual_seed(3))
    out = generate(m, start, 30, temperature=0)  # passes block_size twice: two refills
    no_cache = generate(m, start, 13, temperature=0, use_cache=False)  # up to 16 tokens: identical
    assert torch.equal(out[:, :16], no_cache)
    # the token after a refill is what the model says from the last block_size // 2 tokens
    torch.testing.assert_close(out[:, 17], m(out[:, 9:17])[:, -1].argmax(-1))


def test_temperature_zero_is_greedy_and_top_k_one_equals_it():
    m = tiny()
    start = torch.zeros(4, 1, dtype=torch.long)
    greedy = generate(m, start, 20, temperature=0)
    assert torch.equal(greedy, generate(m, start, 20, temperature=0))
    top1 = generate(m, start, 20, temperature=1.3, top_k=1, generator=torch.Generator().manual_seed(9))
    assert torch.equal(top1, greedy)
    assert torch.equal(generate(m, start, 20, temperature=0, top_k=5, top_p=0.5), greedy)


def test_seeded_batches():
    m = tiny()
    start = torch.zeros(6, 1, dtype=torch.long)

    def draw(seed):
        return generate(m, start, 15, temperature=1.0, top_p=0.95, generator=torch.Generator().manual_seed(seed))

    a, b, c = draw(3), draw(3), draw(4)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert len({tuple(r) for r in a.tolist()}) > 1  # the rows of one batch differ


@pytest.mark.parametrize("kw, match", [({"temperature": -0.1}, "temperature"), ({"top_k": 0}, "top_k"),
                                       ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
                                       ({"temperature": "hot"}, "^temperature must be a number, got 'hot'$"),
                                       ({"top_k": "many"}, "^top_k must be a number, got 'many'$")])
def test_bad_sampling_arguments_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        generate(tiny(), torch.zeros(1, 1, dtype=torch.long), 3, **kw)


def test_top_k_is_clamped_to_the_vocabulary():
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    assert torch.equal(top_k_filter(logits, 10), logits)
    assert torch.equal(top_k_filter(logits, 1), torch.tensor([[-math.inf, 3.0, -math.inf]]))


@pytest.mark.parametrize("top_p, kept", [(0.6, [0, 1]), (1e-9, [0]), (1.0, [0, 1, 2, 3]), (0.5, [0]), (0.81, [0, 1, 2])])
def test_top_p_keeps_the_smallest_set_reaching_p(top_p, kept):
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    perm = torch.tensor([2, 0, 3, 1])  # vocabulary order differs from probability order
    logits = probs.log()[perm][None]  # (1, 4)
    out = top_p_filter(logits, top_p)[0]
    survivors = sorted(int((perm == i).nonzero()) for i in kept)  # where the kept ranks sit
    assert torch.isfinite(out).nonzero().flatten().tolist() == survivors
    torch.testing.assert_close(out[survivors], logits[0, survivors])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("probs, top_p, n_kept", [([0.5, 0.3, 0.1, 0.1], 0.8, 2), ([0.25] * 4, 0.75, 3),
                                                  ([0.1] * 10, 0.3, 3), ([0.1] * 10, 0.7, 7), ([0.2] * 5, 0.6, 3),
                                                  ([0.5, 0.3, 0.1, 0.1], 0.8001, 3)])
def test_top_p_at_an_exact_boundary_keeps_the_set_that_reaches_it(probs, top_p, n_kept, dtype):
    logits = torch.tensor(probs, dtype=dtype).log()[None]  # softmax does not give back probs exactly
    assert torch.isfinite(top_p_filter(logits, top_p)).sum().item() == n_kept


def test_top_p_one_keeps_every_token_of_nonzero_probability():
    logits = torch.tensor([[0.0, -80.0, -math.inf]])  # exp(-80) ≈ 1.8e-35: tiny, but a float32 > 0
    assert torch.isfinite(top_p_filter(logits, 1.0)).tolist() == [[True, True, False]]


def test_a_row_that_may_draw_only_plan_tokens_is_drawn_without_top_k_and_top_p():
    """Row 0 allows plan tokens 0–2 only (0.6 / 0.3 / 0.1): drawn as the model gives them, though
    top_p 0.5 and top_k 1 would leave token 0 alone; row 1, text, is filtered to its likeliest."""
    plan = torch.tensor([True, True, True, False, False])
    logits = torch.tensor([[0.6, 0.3, 0.1, 0.0, 0.0], [0.0, 0.0, 0.0, 0.7, 0.3]]).log()  # (2, 5)
    gen = torch.Generator().manual_seed(0)
    draws = torch.cat([next_token(logits, 1.0, top_k=1, top_p=0.5, generator=gen, unfiltered=plan)
                       for _ in range(4000)], dim=1)  # (2, 4000)
    shares = torch.bincount(draws[0], minlength=5).double() / 4000
    torch.testing.assert_close(shares, torch.tensor([0.6, 0.3, 0.1, 0.0, 0.0], dtype=torch.float64), atol=0.03, rtol=0)
    assert draws[1].eq(3).all()
    without = torch.cat([next_token(logits, 1.0, top_k=1, top_p=0.5, generator=gen) for _ in range(200)], dim=1)
    assert without[0].eq(0).all()


def test_non_finite_logits_raise_instead_of_sampling():
    m = tiny()
    with torch.no_grad():
        m.wte.weight[7, 0] = float("nan")  # tied to lm_head: every logit of token 7 is NaN
    with pytest.raises(ValueError, match="non-finite"):
        generate(m, torch.zeros(1, 1, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="no token is allowed"):
        next_token(torch.full((2, 5), -math.inf), temperature=1.0)


def test_repetition_penalty_scales_the_logits_of_seen_tokens():
    penalised = torch.tensor([True, True, True, False])
    rp = RepetitionPenalty(2.0, penalised)
    idx = torch.tensor([[0, 1, 3]])  # tokens 0, 1 and 3 were seen; 3 is exempt
    out = rp(idx, torch.tensor([[4.0, -1.0, 4.0, 4.0]]))
    assert out.tolist() == [[2.0, -2.0, 4.0, 4.0]]
    assert torch.equal(RepetitionPenalty(1.0, penalised)(idx, out), out)
    with pytest.raises(ValueError, match="repetition_penalty"):
        RepetitionPenalty(0.5, penalised)


def test_cache_takes_the_dtype_of_the_keys_under_autocast():
    m = tiny()
    start = torch.zeros(2, 1, dtype=torch.long)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = generate(m, start, 8, temperature=0)
        cache = Cache(m.cfg.n_layer, m.cfg.block_size)
        m(out, cache=cache)
    assert out.shape == (2, 9) and cache.layers[0].k.dtype == torch.bfloat16 and cache.length == 9


def test_a_poem_ends_only_after_a_sentence_final_mark_and_no_mark_opens_a_line():
    closers = torch.tensor([False, False, True, False, False])  # <bos>, <eos>, 。, 月, ，
    marks = torch.tensor([False, False, True, False, True])
    rules = PoemBoundaries(closers, marks, after_mark=marks, bos_id=0, eos_id=1)
    logits = torch.zeros(4, 5)
    out = rules(torch.tensor([[0, 3], [0, 2], [2, 1], [3, 0]]), logits)  # after 月, after 。, an ended row, after <bos>
    assert torch.isneginf(out[:, 0]).all()  # <bos> never
    assert torch.isneginf(out[0, 1]) and out[1, 1] == 0 and out[2, 1] == 0 and torch.isneginf(out[3, 1])
    assert (out[0, [2, 4]] == 0).all()  # a mark may close the line after 月
    assert torch.isneginf(out[1, [2, 4]]).all() and torch.isneginf(out[3, [2, 4]]).all()  # not after 。 or <bos>
    assert torch.equal(logits, torch.zeros(4, 5))  # the input is not modified


@pytest.mark.parametrize("temperature", [0, 0.8])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_inf_logits_are_refused_at_any_temperature(temperature, bad):
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        next_token(torch.full((1, 5), bad), temperature)  # the input gave [[0]], <bos>
    logits = torch.zeros(2, 5)
    logits[1, 3] = bad
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        next_token(logits, temperature, top_k=2, top_p=0.9)
    ok = torch.tensor([[0.0, -math.inf, 1.0]])  # -inf marks a forbidden token: allowed
    assert next_token(ok, temperature, generator=torch.Generator().manual_seed(0)).shape == (1, 1)


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_a_processor_that_produces_nan_stops_generate(temperature):
    m = tiny()

    def broken(idx, logits):
        return logits * float("nan")

    with pytest.raises(ValueError, match="NaN or \\+inf"):  # was [[0, 0, 0, 0]] at temperature 0: an empty poem
        generate(m, torch.zeros(1, 1, dtype=torch.long), 3, temperature=temperature, processors=[broken])


def test_a_temperature_that_overflows_the_logits_is_refused():
    with pytest.raises(ValueError, match="temperature=1e-45 is too small"):
        next_token(torch.tensor([[1.0, 2.0]]), 1e-45)
    for tiny in (1e-40, 1e-320):  # log-probabilities (all < 0, the adaptive head's) underflow to -inf, or 0/0
        with pytest.raises(ValueError, match=f"temperature={tiny} is too small"):
            next_token(torch.tensor([[-1.0, -2.0, float("-inf")]]), tiny)
