"""Callbacks that look inside the model at each validation: attention maps and sampled poems.

Both act on rank 0 only, skip the sanity check, and send what they make to the first
logger that can take it (Weights & Biases: images and a table). Attention maps are also
written as PNG files under the run folder, so they exist whatever the logger.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from data.script import prompt_to_script
from model.plots import attention_grid


def _wandb(trainer: L.Trainer) -> WandbLogger | None:
    return next((lg for lg in trainer.loggers if isinstance(lg, WandbLogger)), None)


@contextmanager
def _eval_mode(module: torch.nn.Module):
    """Eval mode (no dropout) for the duration, then the previous mode again."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def _encode_probe(pl_module, text: str) -> tuple[torch.Tensor, list[str]]:
    """(1, T) ids of `<bos>` + text in the model's script, and the T tick labels (one per
    token; U+FFFD where a BPE token holds part of a character)."""
    tok = pl_module.tokenizer
    text = prompt_to_script(text, pl_module.hparams.script)
    ids = tok.encode(text, bos=True)[: pl_module.gpt.cfg.block_size]
    labels = [tok.token_bytes(i).decode("utf-8", errors="replace") for i in ids[1:]]
    return torch.tensor([ids], device=pl_module.device), ["BOS"] + labels


class AttentionMapLogger(L.Callback):
    """Logs the attention maps of a probe line: one image per layer, a grid of heads.

    probe_text: the line (any script; converted to the model's); every_n_validations:
    log at every n-th validation. Images go to wandb as `attention/layer{l}` and to
    `<run folder>/attention/step{step:06d}_layer{l}.png`.
    """

    def __init__(self, probe_text: str = "床前明月光，疑是地上霜。", every_n_validations: int = 1):
        self.probe_text, self.every = probe_text, every_n_validations
        self._count = 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Encode the probe once before training, so an unknown character stops the run now."""
        _encode_probe(pl_module, self.probe_text)

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self._count += 1
        if (self._count - 1) % self.every:
            return
        idx, labels = _encode_probe(pl_module, self.probe_text)
        with _eval_mode(pl_module.gpt):
            maps = pl_module.gpt.attention_maps(idx)  # n_layer × (1, n_head, T, T)
        out_dir = Path(trainer.default_root_dir) / "attention"
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = []
        for layer, m in enumerate(maps):
            fig = attention_grid(m[0].float().cpu().numpy(), labels,
                                 title=f"layer {layer} · step {trainer.global_step}")
            paths.append(out_dir / f"step{trainer.global_step:06d}_layer{layer}.png")
            fig.savefig(paths[-1], dpi=100)  # rendered once; Figure is not held by pyplot, so it is freed here
        if logger := _wandb(trainer):
            for layer, path in enumerate(paths):
                logger.log_image(key=f"attention/layer{layer}", images=[str(path)], step=trainer.global_step,
                                 caption=[self.probe_text])


class SampleLogger(L.Callback):
    """Samples a few poems at each validation and logs them as a wandb table `samples`
    (columns: step, poem). Seeded, so the same checkpoint gives the same table."""

    def __init__(self, num_samples: int = 4, max_new_tokens: int = 100, temperature: float = 0.8,
                 top_k: int | None = 50, seed: int = 0):
        self.num_samples, self.max_new_tokens = num_samples, max_new_tokens
        self.temperature, self.top_k, self.seed = temperature, top_k, seed
        self.rows: list[list] = []

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or (logger := _wandb(trainer)) is None:
            return
        tok = pl_module.tokenizer
        gen = torch.Generator(device=pl_module.device).manual_seed(self.seed)
        start = torch.full((self.num_samples, 1), tok.bos_id, device=pl_module.device)
        with _eval_mode(pl_module.gpt):
            out = pl_module.gpt.generate(start, self.max_new_tokens, self.temperature, self.top_k,
                                         eos_id=tok.eos_id, generator=gen)
        self.rows += [[trainer.global_step, tok.decode(row.tolist())] for row in out]
        logger.log_text(key="samples", columns=["step", "poem"], data=self.rows, step=trainer.global_step)
