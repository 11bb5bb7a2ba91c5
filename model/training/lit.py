"""The LightningModule: training and validation steps, AdamW with warmup + cosine, metrics.

Logged: `train/loss` (nats per token), `train/tokens_per_sec`, `val/loss` (mean nats per
predicted token over the whole held-out set), `val/bpc` (bits per character: total nats of
the held-out set ÷ its number of poem characters ÷ ln 2; `<bos>`/`<eos>` predictions count
in the nats, not in the characters; a BPE token counts the characters it begins, so the
value is comparable between tokenizers). A NaN in validation stays NaN in both. Everything
logged at one validation is logged at `global_step` (the steps trained so far, the step of
the checkpoint names and the attention images). The tokenizer travels in every checkpoint, so a
checkpoint is enough to sample (`load_for_inference`; a tiktoken model also needs its
encoding, from tiktoken's cache or the ranks file it was trained with).
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import lightning as L
import torch
from torchmetrics import SumMetric

from data.script import prompt_to_script, variants
from data.tokenizer import UnknownCharactersError, tokenizer_from_state
from model.gpt import GPT, GPTConfig


class NonFiniteLossError(ValueError):
    """The training loss is NaN or infinite: training stops before the bad step changes any
    weight. A ValueError, so the entry points report it in one line with exit status 1."""

    def __init__(self, step: int, loss: float, precision: str, lr: float):
        causes = [f"a learning rate too high (model.optim.lr={lr:g}: lower it or lengthen model.optim.warmup_steps)"]
        if "16" in precision:
            causes.insert(0, f"a precision this device cannot train in (trainer.precision={precision}: try 32-true)")
        super().__init__(f"train/loss is {loss} at step {step}; training stopped before this step changed a weight. "
                         f"Likely causes: {', or '.join(causes)}")


class LitGPT(L.LightningModule):
    """model: GPTConfig fields except vocab_size; optim: lr, weight_decay, betas,
    warmup_steps, min_lr_ratio; tokenizer: its `state_dict()`; script: corpus script."""

    def __init__(self, model: dict, optim: dict, tokenizer: dict, script: str = "simplified"):
        super().__init__()
        self.save_hyperparameters(logger=False)  # into checkpoints; train.py logs the Hydra config instead
        self.tokenizer = tokenizer_from_state(tokenizer)
        self.gpt = GPT(GPTConfig(vocab_size=self.tokenizer.vocab_size, **model))
        # (vocab_size,) characters each id begins: the `val/bpc` denominator; derived, so not saved
        self.register_buffer("char_counts", torch.tensor(self.tokenizer.char_counts), persistent=False)
        self.val_nats, self.val_chars = SumMetric(nan_strategy="disable"), SumMetric()  # keep NaN a NaN
        self._last_step_time: float | None = None

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Same as `GPT.forward`: idx (B, T) int64 → (logits (B, T, vocab_size), loss or None)."""
        return self.gpt(idx, targets)

    def to_model_text(self, text: str) -> str:
        """A user's text (either script) → the model's script (`data.script.prompt_to_script`).

        raises UnknownCharactersError listing the characters still outside the vocabulary,
        with the in-vocabulary variants OpenCC knows for them as suggestions.
        """
        script = self.hparams.script
        text = prompt_to_script(text, script)
        try:
            self.tokenizer.encode(text)
        except UnknownCharactersError as err:
            hints = {c: sorted({v for v in (prompt_to_script(v, script) for v in variants(c))
                                if not self.tokenizer.unknown(v)}) for c in err.unknown}
            said = ", ".join(f"{c} → {'/'.join(v)}" for c, v in hints.items() if v)
            if not said:
                raise
            raise UnknownCharactersError(err.unknown, f"Variants in the vocabulary: {said}.") from None
        return text

    def encode_line(self, text: str) -> tuple[torch.Tensor, list[str]]:
        """`<bos>` + text (either script, converted to the model's) → ((1, T) int64 ids on the
        module's device, the T tokens as text: `<bos>` then the characters, or BPE pieces).

        raises UnknownCharactersError listing characters outside the vocabulary, ValueError
        if the text is empty or T exceeds the model's block_size.
        """
        if not text:
            raise ValueError("the text is empty; give a line of poetry, e.g. text=床前明月光，疑是地上霜。")
        text = self.to_model_text(text)
        ids = self.tokenizer.encode(text, bos=True)
        if len(ids) > self.gpt.cfg.block_size:
            raise ValueError(f"the text has {len(text)} characters; with <bos> that is {len(ids)} positions, more "
                             f"than the model's block_size {self.gpt.cfg.block_size}. Use a shorter text.")
        return torch.tensor([ids], device=self.device), [self.tokenizer.label(i) for i in ids]

    def training_step(self, batch, batch_idx):
        """batch: (x, y), each (B, T) int64. Logs `train/loss` (nats/token) and `train/tokens_per_sec`.
        raises NonFiniteLossError at the first NaN or infinite loss, before its backward pass."""
        x, y = batch  # (B, T), (B, T)
        _, loss = self.gpt(x, y)
        if not torch.isfinite(loss):
            raise NonFiniteLossError(self.global_step, loss.item(), self.trainer.precision, self.hparams.optim["lr"])
        self.log("train/loss", loss, prog_bar=True)
        now = time.perf_counter()
        if self._last_step_time is not None:
            self.log("train/tokens_per_sec", x.numel() * self.trainer.world_size / (now - self._last_step_time))
        self._last_step_time = now
        return loss

    def on_validation_start(self) -> None:
        self._last_step_time = None  # validation time is not training throughput

    def validation_step(self, batch, batch_idx):
        """Logs `val/loss` (mean nats per token) and accumulates nats and characters for `val/bpc`."""
        x, y = batch
        logits, loss = self.gpt(x, y)  # logits (B, T, vocab_size)
        self.log("val/loss", loss, prog_bar=True, batch_size=x.size(0), sync_dist=True)
        self.val_nats.update(loss.detach() * y.numel())
        self.val_chars.update(self.char_counts[y].sum())

    def on_validation_epoch_end(self) -> None:
        """Logs `val/bpc` = total nats ÷ poem characters ÷ ln 2, summed over all ranks, and
        `step` = global_step: Lightning then logs this validation's metrics at that step (by
        default it uses global_step − 1 here), the step the callbacks log their images at."""
        bpc = self.val_nats.compute() / self.val_chars.compute() / math.log(2)
        self.log("val/bpc", bpc, prog_bar=True)
        self.log("step", float(self.global_step), sync_dist=True)  # the same on every rank
        self.val_nats.reset()
        self.val_chars.reset()

    def configure_optimizers(self):
        """AdamW, weight decay on matrices only (nanoGPT); linear warmup, then cosine decay to
        `min_lr_ratio · lr` at the last step (Loshchilov & Hutter 2017), updated every step."""
        o = self.hparams.optim
        decay = [p for p in self.gpt.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.gpt.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": o["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
            lr=o["lr"], betas=tuple(o["betas"]),
        )
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup, floor = min(o["warmup_steps"], total - 1), o["min_lr_ratio"]

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def latest_checkpoint(checkpoint_dir: Path) -> Path:
    """The newest `last.ckpt` under checkpoint_dir. raises FileNotFoundError if there is none."""
    found = sorted(checkpoint_dir.glob("*/last.ckpt"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"no checkpoint under {checkpoint_dir}; train one with `python train.py` "
                                "or pass ckpt_path=...")
    return found[-1]


def load_for_inference(ckpt_path: str | Path, device: str | torch.device = "cpu",
                       attention: str | None = None) -> LitGPT:
    """A trained LitGPT from a checkpoint file, in eval mode on `device`.

    attention: override the backend the model was trained with (e.g. 'sdpa').
    raises FileNotFoundError naming the path if it does not exist.
    """
    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found; train one with `python train.py` "
                                "or pass ckpt_path=checkpoints/<run>/last.ckpt")
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    hp = ckpt["hyper_parameters"]
    if attention is not None:
        hp = {**hp, "model": {**hp["model"], "attention": attention}}
    lit = LitGPT(**hp)
    lit.load_state_dict(ckpt["state_dict"])
    return lit.to(device).eval()
