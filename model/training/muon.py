"""Muon for the hidden weight matrices, AdamW for everything else, as one optimizer.

Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks";
Bernstein & Newhouse 2024, "Old optimizer, new norm") takes SGD's Nesterov momentum and
replaces each matrix's update by the nearest semi-orthogonal matrix, found with five
Newton–Schulz iterations. `torch.optim.Muon` runs those iterations in bfloat16, which a CPU
without bfloat16 matrix units crawls through; here they run in float32. One optimizer with both
kinds of parameter group lets Lightning drive it like AdamW: one learning-rate schedule
(each group's `lr` scaled by the same factor), gradient clipping and accumulation as usual.
"""
from __future__ import annotations

import torch
from torch.optim.adamw import adamw

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
"""The quintic Newton–Schulz coefficients of Jordan et al. 2024 (fast slope at 0, not exact)."""
MOMENTUM_START = 0.85
"""Muon's momentum at the first step of a warm-up (modded-nanogpt's, Jordan et al. 2024)."""


def momentum_at(step: int, momentum: float, warmup: int) -> float:
    """Muon's momentum at `step` (0-based, the parameter's own steps): linear from `MOMENTUM_START`
    to `momentum` over the first `warmup` steps, then `momentum` (warmup 0: always), e.g.
    `momentum_at(0, 0.95, 300) == 0.85`, `momentum_at(150, 0.95, 300) ≈ 0.90`."""
    f = min(1.0, step / warmup) if warmup > 0 else 1.0
    return (1 - f) * MOMENTUM_START + f * momentum


def orthogonalize(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """≈ U Vᵀ of g = U S Vᵀ: g (m, n) float → (m, n) float32 with singular values ≈ 0.7–1.2.

    Five quintic Newton–Schulz iterations X ← aX + (b·A + c·A²)X, A = X Xᵀ, on the shorter
    side of the matrix, after scaling g to spectral norm ≤ 1 (Frobenius norm). Scale-invariant:
    g is divided by its largest |entry| first, so a gradient of any nonzero norm (even a
    subnormal one) gets the same update and a zero gradient a zero update. raises ValueError
    if g is not 2-D.
    """
    if g.dim() != 2:
        raise ValueError(f"orthogonalize needs a matrix, got shape {tuple(g.shape)}")
    a, b, c = NS_COEFFICIENTS
    x = g.float()
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T  # (n, m): iterate on the smaller Gram matrix
    tiny = torch.finfo(x.dtype).tiny  # divides only a zero matrix: 0 / tiny = 0
    x = x / x.abs().amax().clamp_min(tiny)  # entries in [-1, 1]: the norm below neither under- nor overflows
    x = x / x.norm().clamp_min(tiny)
    for _ in range(steps):
        A = x @ x.T  # (short, short)
        x = a * x + (b * A + c * A @ A) @ x
    return x.T if tall else x


class MuonAdamW(torch.optim.Optimizer):
    """Parameter groups with `use_muon=True` take Muon steps, the others AdamW steps.

    A Muon group: lr (0.02 is typical), momentum (0.95, Nesterov), momentum_warmup (steps of
    `momentum_at`'s warm-up; 0: none), weight_decay (decoupled, as in AdamW); every parameter must
    be 2-D; its state counts its steps (`step`), so a resumed run goes on with the momentum it had.
    Its update is `orthogonalize(momentum)` scaled by √max(1, rows/cols). An AdamW group: lr,
    betas, eps, weight_decay, as `torch.optim.AdamW` (its functional form does the step).
    raises ValueError if a Muon group holds a parameter that is not a matrix.
    """

    def __init__(self, param_groups: list[dict], lr: float = 1e-3, betas=(0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.95, ns_steps: int = 5):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, momentum=momentum,
                        momentum_warmup=0, ns_steps=ns_steps, use_muon=False)
        super().__init__(param_groups, defaults)
        for group in self.param_groups:
            if group["use_muon"] and any(p.dim() != 2 for p in group["params"]):
                raise ValueError("Muon groups take weight matrices only; put vectors and embeddings in AdamW groups")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if group["use_muon"]:
                self._muon(group, params)
            elif params:
                self._adamw(group, params)
        return loss

    def _muon(self, group: dict, params: list[torch.Tensor]) -> None:
        lr, wd = group["lr"], group["weight_decay"]
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            step = state.get("step", 0)  # a checkpoint from before the count: from 0
            mu, state["step"] = momentum_at(step, group["momentum"], group["momentum_warmup"]), step + 1
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - mu)  # buf ← μ·buf + (1 − μ)·g
            update = p.grad.lerp(buf, mu)  # Nesterov: (1 − μ)·g + μ·buf
            update = orthogonalize(update, group["ns_steps"]).to(p.dtype)  # (rows, cols)
            p.mul_(1 - lr * wd)
            p.add_(update, alpha=-lr * max(1.0, p.size(0) / p.size(1)) ** 0.5)

    def _adamw(self, group: dict, params: list[torch.Tensor]) -> None:
        for p in params:
            if "step" not in self.state[p]:
                self.state[p].update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
        states = [self.state[p] for p in params]
        beta1, beta2 = group["betas"]
        adamw(params, [p.grad for p in params], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
              [], [s["step"] for s in states], amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
              weight_decay=group["weight_decay"], eps=group["eps"], maximize=False, foreach=False)
