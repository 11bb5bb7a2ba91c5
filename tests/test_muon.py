"""The Muon + AdamW optimizer: float32 Newton–Schulz, AdamW groups exactly torch's, training and state."""
import pytest
import torch

from model.training.muon import MuonAdamW, momentum_at, orthogonalize


@pytest.mark.parametrize("shape", [(96, 384), (384, 96), (32, 32)])
def test_orthogonalize_brings_every_singular_value_near_one(shape):
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0)) * torch.logspace(0, -1, shape[1])  # columns 1 … 0.1
    out = orthogonalize(g)
    s = torch.linalg.svdvals(out)
    assert out.dtype == torch.float32 and out.shape == shape
    assert s.min() > 0.6 and s.max() < 1.25  # the quintic's band (Jordan et al. 2024), not exactly 1
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    assert torch.nn.functional.cosine_similarity((u @ vh).flatten(), out.flatten(), dim=0) > 0.95
    with pytest.raises(ValueError, match="matrix"):
        orthogonalize(torch.randn(4))


@pytest.mark.parametrize("scale", [1e-9, 1e-30, 1e-40, 1e6, 1e30])
def test_orthogonalize_is_scale_invariant_down_to_subnormal_gradients(scale):
    g = torch.randn(16, 48, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(orthogonalize(g * scale), orthogonalize(g), atol=1e-5, rtol=1e-4)


def test_a_zero_gradient_gets_a_zero_update():
    assert torch.equal(orthogonalize(torch.zeros(8, 3)), torch.zeros(8, 3))


def test_adamw_groups_step_exactly_as_torch_adamw():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(8, 5), torch.nn.Linear(8, 5)
    b.load_state_dict(a.state_dict())
    ours = MuonAdamW([{"params": a.parameters()}], lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    ref = torch.optim.AdamW(b.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    for _ in range(5):
        x = torch.randn(4, 8)
        for model, opt in ((a, ours), (b, ref)):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)


def test_muon_step_is_the_scaled_orthogonalized_nesterov_momentum():
    w = torch.nn.Parameter(torch.zeros(6, 3))
    opt = MuonAdamW([{"params": [w], "use_muon": True, "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0}])
    g = torch.randn(6, 3)
    w.grad = g.clone()
    opt.step()
    buf = 0.1 * g  # lerp from 0 by 1 − μ
    expected = -0.1 * (6 / 3) ** 0.5 * orthogonalize(g.lerp(buf, 0.9))
    torch.testing.assert_close(w.detach(), expected)
    with pytest.raises(ValueError, match="matrices only"):
        MuonAdamW([{"params": [torch.nn.Parameter(torch.zeros(3))], "use_muon": True}])


def test_state_survives_a_save_and_load():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    groups = [{"params": [model[0].weight, model[1].weight], "use_muon": True, "lr": 0.02},
              {"params": [model[0].bias, model[1].bias]}]
    opt = MuonAdamW(groups, lr=1e-3)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    again = MuonAdamW([{**g, "params": g["params"]} for g in groups], lr=1e-3)
    again.load_state_dict(opt.state_dict())
    assert torch.equal(again.state[model[0].weight]["momentum_buffer"], opt.state[model[0].weight]["momentum_buffer"])
    assert torch.equal(again.state[model[0].bias]["exp_avg"], opt.state[model[0].bias]["exp_avg"])


def test_momentum_warms_up_from_085_to_the_groups_over_its_steps_and_resumes_where_it_was():
    assert momentum_at(0, 0.95, 300) == 0.85 and momentum_at(300, 0.95, 300) == 0.95
    assert momentum_at(150, 0.95, 300) == pytest.approx(0.90) and momentum_at(0, 0.95, 0) == 0.95
    torch.manual_seed(0)
    g1, g2 = torch.randn(6, 3), torch.randn(6, 3)

    def two_steps(warmup, resume=False):
        w = torch.nn.Parameter(torch.zeros(6, 3))
        group = {"params": [w], "use_muon": True, "lr": 0.1, "momentum": 0.95, "momentum_warmup": warmup}
        opt = MuonAdamW([group])
        w.grad = g1.clone()
        opt.step()
        if resume:  # a new optimizer from the saved state: the step count travels with it
            state = opt.state_dict()
            opt = MuonAdamW([{**group, "params": [w]}])
            opt.load_state_dict(state)
        w.grad = g2.clone()
        opt.step()
        return w.detach().clone()

    buf = 0.15 * g1  # the first step at μ = 0.85
    first = -0.1 * 2 ** 0.5 * orthogonalize(g1.lerp(buf, 0.85))
    mu = momentum_at(1, 0.95, 2)  # 0.90, the second step's
    buf = buf.lerp(g2, 1 - mu)
    expected = first - 0.1 * 2 ** 0.5 * orthogonalize(g2.lerp(buf, mu))
    torch.testing.assert_close(two_steps(2), expected)
    assert torch.equal(two_steps(2, resume=True), two_steps(2))
    assert not torch.allclose(two_steps(0), expected)  # no warm-up: 0.95 from the first step
