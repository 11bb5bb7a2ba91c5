import math

import pytest
import torch
import torch.nn.functional as F

from model.attention import BACKENDS, CausalSelfAttention, causal_attention_weights, rotate
from model.device import BackendUnavailableError, check_backend, flash_unavailable_reason

SHAPES = [(64, 2, 16), (48, 4, 7), (24, 3, 1)]  # (n_embd, n_head, T = 16 = block_size, 7, 1): d_k ≠ T, n_head > 1


OPTIONS = [{}, {"rope": True}]
"""With and without rotary positions on q and k; every backend must compute the same thing under each."""


def layers(n_embd, n_head, block_size=16, dropout=0.0, **options):
    """One layer per backend, all with the same weights."""
    torch.manual_seed(0)
    ref = CausalSelfAttention(n_embd, n_head, block_size, dropout, "naive", **options)
    out = {}
    for b in BACKENDS:
        layer = CausalSelfAttention(n_embd, n_head, block_size, dropout, b, **options)
        layer.load_state_dict(ref.state_dict())
        out[b] = layer.eval()
    return out


def rel_err(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("n_embd, n_head, T", SHAPES)
def test_backends_agree_in_outputs_and_gradients(n_embd, n_head, T, options):
    mods = layers(n_embd, n_head, **options)
    x = torch.randn(3, T, n_embd)
    results = {}
    for b, m in mods.items():
        xi = x.clone().requires_grad_(True)
        y = m(xi)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        results[b] = (y, xi.grad, m.c_attn.weight.grad, m.c_proj.weight.grad)
    for b in ("sdpa", "flash"):
        for got, want in zip(results[b], results["naive"]):
            assert rel_err(got, want) <= 1e-5, b


def test_rope_makes_scores_depend_on_distance_only():
    """RoFormer eq. 34: (R_m q)·(R_n k) = (R_{m+s} q)·(R_{n+s} k) for any shift s."""
    attn = CausalSelfAttention(16, 2, block_size=32, rope=True)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(m, n):
        return (rotate(q, attn.cos[m], attn.sin[m]) * rotate(k, attn.cos[n], attn.sin[n])).sum().item()

    assert score(7, 3) == pytest.approx(score(27, 23), abs=1e-5) and score(5, 5) == pytest.approx(score(0, 0), abs=1e-5)
    assert score(7, 3) != pytest.approx(score(7, 4), abs=1e-3)  # the distance does matter
    assert rotate(q, attn.cos[0], attn.sin[0]).equal(q)  # position 0 is not rotated
    with pytest.raises(ValueError, match="even head size"):
        CausalSelfAttention(18, 2, block_size=8, rope=True)


def test_the_weights_function_masks_the_future_of_the_last_queries():
    """`causal_attention_weights` for T queries that are the last T of L positions (a KV cache's):
    query i sees keys 0 … L − T + i, and the full square case is the lower triangle."""
    q, k = torch.randn(2, 3, 8), torch.randn(2, 7, 8)
    w = causal_attention_weights(q, k)  # (2, 3, 7)
    assert (w[:, 0, 5:] == 0).all() and (w[:, 0, :5] > 0).all() and (w[:, 2] > 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3))
    square = causal_attention_weights(k, k)
    lower = torch.ones(7, 7, dtype=torch.bool).tril()
    assert (square[:, ~lower] == 0).all() and (square[:, lower] > 0).all()


def test_naive_backend_is_the_explicit_per_head_formula():
    """The attention lesson's section 5 per head (docs/attention.md): softmax(q kᵀ / √d_k + causal mask) v, then W_O."""
    n_embd, n_head, T = 16, 2, 5
    m = layers(n_embd, n_head)["naive"]
    x = torch.randn(1, T, n_embd)
    W_q, W_k, W_v = m.c_attn.weight.split(n_embd)  # each (n_embd, n_embd), rows = outputs
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    heads = []
    for h in range(n_head):
        sl = slice(h * 8, (h + 1) * 8)
        q, k, v = x[0] @ W_q[sl].T, x[0] @ W_k[sl].T, x[0] @ W_v[sl].T  # (T, 8)
        scores = (q @ k.T / math.sqrt(8)).masked_fill(~mask, float("-inf"))
        heads.append(F.softmax(scores, dim=-1) @ v)
    want = torch.cat(heads, dim=-1) @ m.c_proj.weight.T
    torch.testing.assert_close(m(x)[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_weights_from_any_backend_and_eval_ignores_dropout(backend):
    """The step-4 weights, softmax(q kᵀ / √d_k) masked, whatever the backend; in eval, whatever `dropout`
    is, the layer is deterministic and the same as without dropout (flash too: eval passes dropout_p=0).
    Causality: the naive backend is the masked formula (above), the others agree with it."""
    m, reference = layers(32, 4, dropout=0.5)[backend], layers(32, 4)[backend]
    x = torch.randn(2, 9, 32)
    w = m.attention_weights(x)
    q, k, _ = (t.view(2, 9, 4, 8).transpose(1, 2) for t in m.c_attn(x).split(32, dim=-1))
    assert w.shape == (2, 4, 9, 9) and (w.triu(1) == 0).all()
    torch.testing.assert_close(w, causal_attention_weights(q, k), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 9))
    assert m.backend == backend
    torch.testing.assert_close(m(x), m(x), rtol=0, atol=0)
    torch.testing.assert_close(m(x), reference(x), rtol=0, atol=0)


def test_naive_dropout_zeroes_weights_and_rescales():
    p = 0.25
    m = layers(32, 4, block_size=64, dropout=p)["naive"].train()
    x = torch.randn(4, 64, 32)
    captured = {}
    m.attn_dropout.register_forward_hook(lambda mod, inp, out: captured.update(before=inp[0], after=out))
    m(x)
    before, after = captured["before"], captured["after"]
    causal = torch.ones(64, 64, dtype=torch.bool).tril().expand_as(before)
    kept = after[causal] != 0
    n = kept.numel()
    dropped = 1 - kept.float().mean().item()
    assert abs(dropped - p) < 4 * math.sqrt(p * (1 - p) / n)
    torch.testing.assert_close(after[causal][kept], before[causal][kept] / (1 - p))


def test_sdpa_dropout_signature():
    """Fused dropout: outputs differ from eval, and their mean over many draws is the eval output."""
    m = layers(16, 2, dropout=0.3)["sdpa"]
    x = torch.randn(1, 6, 16)
    want = m.eval()(x)
    m.train()
    torch.manual_seed(1)
    draws = m(x.expand(4000, -1, -1))  # each batch row draws its own dropout mask
    assert not torch.allclose(draws[0], want)
    assert rel_err(draws.mean(0), want) < 0.05


def test_flash_refusals_and_cpu_case():
    assert flash_unavailable_reason("cpu", torch.float32, 0.0, 32) is None
    assert "no dropout" in flash_unavailable_reason("cpu", torch.float32, 0.1, 32)
    with pytest.raises(BackendUnavailableError, match="attention=sdpa"):
        check_backend("flash", "cpu", torch.float32, 0.1, 32)
    check_backend("sdpa", "cpu", torch.float32, 0.1, 32)
    check_backend("naive", "cpu", torch.float32, 0.1, 32)
    assert "supports cpu and cuda" in flash_unavailable_reason("mps", torch.float16, 0.0, 32)
    with pytest.raises(ValueError, match="unknown attention backend"):
        check_backend("fast", "cpu", torch.float32, 0.0, 32)
    with pytest.raises(ValueError, match="unknown attention backend"):
        CausalSelfAttention(32, 4, 8, backend="fast")
    with pytest.raises(ValueError, match="divisible"):
        CausalSelfAttention(30, 4, 8)


def test_flash_refusals_on_cuda_by_rule(monkeypatch):
    """The CUDA rules answer before any CUDA call, so they are testable without a GPU."""
    assert "float16 or bfloat16" in flash_unavailable_reason("cuda", torch.float32, 0.0, 32)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    assert "compute capability 8.0" in flash_unavailable_reason("cuda", torch.bfloat16, 0.0, 32)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert "multiple of 8" in flash_unavailable_reason("cuda", torch.bfloat16, 0.0, 12)
    assert "at most 256" in flash_unavailable_reason("cuda", torch.bfloat16, 0.0, 512)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n_embd, n_head, T", [(256, 4, 128), (384, 6, 64)])
def test_backends_agree_on_gpu_in_bf16(n_embd, n_head, T):
    mods = {b: m.cuda() for b, m in layers(n_embd, n_head, block_size=128).items()}
    x = torch.randn(4, T, n_embd, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        outs = {b: m(x).float() for b, m in mods.items()}
    for b in ("sdpa", "flash"):
        assert rel_err(outs[b], outs["naive"]) <= 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flash_runs_on_cuda_in_bf16_with_dropout_and_refuses_float32():
    if torch.cuda.get_device_capability() >= (8, 0):
        assert flash_unavailable_reason("cuda", torch.bfloat16, 0.1, 64) is None
    with pytest.raises(BackendUnavailableError, match="bfloat16"):
        check_backend("flash", "cuda", torch.float32, 0.0, 64)
