"""The LightningModule: training and validation steps, the optimizer (Muon + AdamW)
with warm-up and cosine (by step or by time budget), metrics.

Logged: `train/loss` (nats per token), `train/tokens_per_sec`, `val/loss` (mean nats per
predicted token over the whole held-out set), `val/bpc` (bits per character: total nats of
the held-out set ÷ its number of poem characters ÷ ln 2; `<bos>`/`<eos>` predictions count
in the nats, not in the characters; a BPE token counts the characters it begins, so the
value is comparable between tokenizers). A NaN in validation stays NaN in both. Everything
logged at one validation is logged at `global_step` (the steps trained so far, the step of
the checkpoint names and the attention images). The tokenizer travels in every checkpoint, so a
checkpoint is enough to sample (`model.loading.load_engine`; a tiktoken model also needs its
encoding, from tiktoken's cache or the ranks file it was trained with). Inference goes through
the engine the module holds (`engine`).

With plan tokens (`data/verse/plan.py`, `data.plan_tokens=true`) their predictions count in
`val/bpc`'s nats too, over the same poem characters, so it stays comparable with models
without them; `val/bpc_text` is logged beside it: the nats of the predictions whose target
is not a plan token ÷ the same characters ÷ ln 2.
"""
from __future__ import annotations

import math
import time
import warnings

import lightning as L
import torch
from lightning.pytorch.callbacks import Timer
from omegaconf import OmegaConf
from torchmetrics import SumMetric

from data.tokenizer import tokenizer_from_state
from data.windows import IGNORE
from model.checkpoint_meta import CheckpointMeta
from model.engine import Engine
from model.gpt import MODEL_FIELDS
from model.loading import build_gpt
from model.training.muon import MuonAdamW

# Lightning asks for sync_dist=True on epoch-level logs under DDP; the validation sums below are
# torchmetrics metrics, already reduced across ranks, so the values logged are the global ones
warnings.filterwarnings("ignore", message=r"It is recommended to use `self\.log\('val/")
# Lightning's pytree helper builds torch's deprecated LeafSpec at every fit and validation (torch
# 2.13 warns; Lightning's to change): a warning the user can do nothing about
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")


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
    """model: GPTConfig fields except vocab_size (`model.loading.build_gpt` decides the head for
    the vocabulary and fills the poem inputs' tables); optim: lr, weight_decay, betas,
    warmup_steps, min_lr_ratio; tokenizer: its `state_dict()`; script: corpus script.
    meta: what its checkpoints record beside the weights and these (`model.checkpoint_meta.CheckpointMeta`:
    corpora, conditions and poets, fine-tuning), given to the engine it builds (not a hyper-parameter).
    engine: a loaded model to validate (`evaluate.py`) instead of a new one built from these, with
    its own meta (not a hyper-parameter). `engine`: the inference engine around the model, `gpt`: the model.
    raises ValueError for both an engine and a meta."""

    def __init__(self, model: dict, optim: dict, tokenizer: dict, script: str = "simplified",
                 engine: Engine | None = None, meta: CheckpointMeta | None = None):
        super().__init__()
        self.save_hyperparameters(ignore=["engine", "meta"], logger=False)  # into checkpoints; train.py logs the config
        if engine is None:
            tok = tokenizer_from_state(tokenizer)
            engine = Engine(build_gpt(model, tok, script), tok, script, meta=meta)
        elif meta is not None:
            raise ValueError("LitGPT: give the meta to the engine (Engine(..., meta=...)), not beside it")
        self.engine, self.tokenizer, self.gpt = engine, engine.tokenizer, engine.model
        # (vocab_size,) characters each id begins: the `val/bpc` denominator; derived, so not saved
        self.register_buffer("char_counts", torch.tensor(self.tokenizer.char_counts), persistent=False)
        # validation sums, in float64: reduced across ranks, so the order of summation cannot matter
        self.val_nats, self.val_tokens, self.val_chars = (SumMetric(nan_strategy="disable").set_dtype(torch.float64),
                                                          SumMetric().set_dtype(torch.float64),
                                                          SumMetric().set_dtype(torch.float64))
        self._last_step_time: float | None = None
        self.other_val = torch.nn.ModuleDict()  # other validation sets' sums (`setup`)
        self.train_tokens = 0  # tokens of the training array (`setup`), for `train/epochs`
        self.tokens_seen: int | None = None  # training tokens fed so far, all ranks; saved in checkpoints
        self.val_text_nats = SumMetric(nan_strategy="disable").set_dtype(torch.float64)  # non-plan targets: `val/bpc_text`

    def setup(self, stage: str) -> None:
        """Before fitting from scratch: order the adaptive softmax's clusters by the training data's
        token counts (a resumed run then restores the order it was trained with; a fine-tuned one
        keeps its base's). Sums for the
        data module's other validation sets (`val_names` after the reference: `val/<name>/…`)."""
        dm = getattr(self.trainer, "datamodule", None)
        if stage == "fit" and dm is not None and self.engine.meta.finetuned is None:  # fine-tuned: the base's order
            self.gpt.lm_head.set_token_counts(torch.from_numpy(dm.token_counts()))
            self.train_tokens = int(getattr(dm, "train_tokens", 0) or dm.meta["train"]["tokens"])
        names = getattr(dm, "val_names", [""])[1:]
        self.other_val = torch.nn.ModuleDict({name: torch.nn.ModuleList(
            SumMetric(nan_strategy="disable" if i == 0 else "warn").set_dtype(torch.float64) for i in range(3))
            for name in names})

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Records the engine's meta (`CheckpointMeta.to_checkpoint`: the corpora beyond the reference,
        the conditions and poets, what a fine-tuned model started from and read) and the training
        tokens seen."""
        checkpoint.update(self.engine.meta.to_checkpoint())
        if self.tokens_seen is not None:
            checkpoint["tokens_seen"] = self.tokens_seen

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """A resumed run counts on from the tokens its checkpoint had seen, on any number of ranks
        (a checkpoint without the count: `global_step` steps at this run's batch, at the first step)."""
        self.tokens_seen = checkpoint.get("tokens_seen")

    def training_step(self, batch, batch_idx):
        """batch: (x, y), each (B, T) int64. Logs `train/loss` (nats/token), `train/tokens_per_sec` and
        `train/epochs` (training tokens fed so far, all ranks, ÷ the training array's tokens).
        raises NonFiniteLossError at the first NaN or infinite loss, before its backward pass."""
        x, y = batch  # (B, T), (B, T)
        loss = self.gpt.loss(x, y)
        if not torch.isfinite(loss):
            raise NonFiniteLossError(self.global_step, loss.item(), self.trainer.precision, self.hparams.optim["lr"])
        self.log("train/loss", loss, prog_bar=True)
        if self.tokens_seen is None:
            self.tokens_seen = self.global_step * self.trainer.accumulate_grad_batches * x.numel() * self.trainer.world_size
        self.tokens_seen += x.numel() * self.trainer.world_size
        if self.train_tokens:  # epochs as data-constrained scaling counts them: tokens seen ÷ unique tokens
            self.log("train/epochs", self.tokens_seen / self.train_tokens)
        now = time.perf_counter()
        if self._last_step_time is not None:
            self.log("train/tokens_per_sec", x.numel() * self.trainer.world_size / (now - self._last_step_time))
        self._last_step_time = now
        return loss

    def on_train_start(self) -> None:
        """Sets every group's learning rate to the schedule's at the current step: a run resumed with
        another `trainer.max_steps` would otherwise take its first step at the rate the checkpoint's
        schedule left in the optimizer."""
        sched = self.lr_schedulers()
        for group, base, factor in zip(self.optimizers().optimizer.param_groups, sched.base_lrs, sched.lr_lambdas):
            group["lr"] = base * factor(sched.last_epoch)

    def on_validation_start(self) -> None:
        self._last_step_time = None  # validation time is not training throughput

    def validation_step(self, batch, batch_idx, dataloader_idx: int = 0):
        """Accumulates the batch's nats (all, and those of non-plan targets), scored tokens and poem
        characters (targets -1 are not scored), in float64. Each held-out window is scored once on
        one rank (`PoetryDataModule.val_dataloader`); the sums are reduced across ranks. A
        dataloader after the first is another validation set (`other_val`), summed apart."""
        x, y = batch  # (B, T), (B, T)
        nats = self.gpt.nats(x, y)  # (B, T) nats per position, 0 where not scored
        scored = y != IGNORE  # (B, T)
        nats = nats.double()  # (B, T) float64: sums that do not depend on how windows are batched
        sums = (self.val_nats, self.val_tokens, self.val_chars) if dataloader_idx == 0 else \
            list(self.other_val.values())[dataloader_idx - 1]
        for metric, value in zip(sums, (nats.sum(), scored.sum(), self.char_counts[y[scored]].sum())):
            metric.update(value)
        if dataloader_idx:
            return
        if self.tokenizer.plan:
            self.val_text_nats.update(nats[y < self.tokenizer.plan_start].sum())

    def on_validation_epoch_end(self) -> None:
        """Logs `val/loss` = total nats ÷ scored tokens and `val/bpc` = total nats ÷ poem
        characters ÷ ln 2, summed over all batches and ranks (a NaN stays NaN), and `step` =
        global_step: Lightning then logs this validation's metrics at that step (by default it
        uses global_step − 1 here), the step the callbacks log their images at."""
        nats = self.val_nats.compute()
        if self.tokenizer.plan:  # `val/bpc_text`: the nats of the non-plan predictions ÷ the same characters ÷ ln 2
            self.log("val/bpc_text", self.val_text_nats.compute() / self.val_chars.compute() / math.log(2))
            self.val_text_nats.reset()
        self.log("val/loss", nats / self.val_tokens.compute(), prog_bar=True)
        self.log("val/bpc", nats / self.val_chars.compute() / math.log(2), prog_bar=True)
        for name, (other_nats, tokens, chars) in self.other_val.items():
            total = other_nats.compute()
            self.log(f"val/{name}/loss", total / tokens.compute())
            self.log(f"val/{name}/bpc", total / chars.compute() / math.log(2), prog_bar=True)
            for metric in (other_nats, tokens, chars):
                metric.reset()
        self.log("step", float(self.global_step), sync_dist=True)  # the same on every rank
        for metric in (self.val_nats, self.val_tokens, self.val_chars):
            metric.reset()

    def configure_optimizers(self):
        """`build_optimizer` (Muon + AdamW); `lr_factor` every step, its progress the
        fraction of `trainer.max_steps` done or, with `trainer.max_time` (budget mode), of the
        time budget spent, whichever is further: a budget run anneals when its time ends."""
        o = self.hparams.optim
        opt = build_optimizer(self.gpt, o)
        total = self.trainer.estimated_stepping_batches  # inf when only trainer.max_time ends the run
        timer = next((c for c in self.trainer.callbacks if isinstance(c, Timer)), None)  # set by trainer.max_time
        warmup = o["warmup_steps"] if math.isinf(total) else min(o["warmup_steps"], int(total) - 1)

        def factor(step: int) -> float:
            progress = 0.0 if math.isinf(total) else (step - warmup) / max(1, total - warmup)
            if timer is not None:  # budget mode: the elapsed fraction of trainer.max_time, if further
                elapsed = timer.time_elapsed("train")
                progress = max(progress, elapsed / (elapsed + timer.time_remaining("train")))
            return lr_factor(step, warmup, o["min_lr_ratio"], progress)

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def model_settings(cfg) -> dict:
    """The model fields of a training config (conf/train.yaml composed): conf/model's GPTConfig fields
    and conf/attention's backend, before the head is decided for the vocabulary."""
    shape = OmegaConf.to_container(cfg.model, resolve=True)
    return {**{k: shape[k] for k in MODEL_FIELDS if k in shape}, "backend": cfg.attention.backend}


def build_optimizer(gpt: torch.nn.Module, o: dict) -> torch.optim.Optimizer:
    """`MuonAdamW` over gpt's parameters: Muon (muon_lr, muon_momentum, muon_momentum_warmup (absent: 0),
    muon_weight_decay) for the weight matrices inside the blocks, AdamW (lr, betas, weight_decay on
    matrices only, as nanoGPT) for embeddings, output layer and vectors; with `embed_lr` set (not None), the embedding tables
    (every `nn.Embedding`'s weight not tied to the output layer) take AdamW at that rate instead.
    The groups are named (`muon`, `decay`, `no_decay`, and `embed` with embed_lr): the
    learning-rate monitor logs `lr-MuonAdamW/muon`, ... The nanoGPT reference's AdamW is
    benchmarks/fixed_time.py's own."""
    named = list(gpt.named_parameters())
    hidden = [p for n, p in named if n.startswith("blocks.") and p.dim() == 2]
    ids = {id(p) for p in hidden}
    tables = []
    if o.get("embed_lr") is not None:
        out = {id(p) for p in gpt.lm_head.parameters()}
        tables = [m.weight for m in gpt.modules() if isinstance(m, torch.nn.Embedding) and id(m.weight) not in out]
        ids |= {id(p) for p in tables}
    decay = [p for _, p in named if p.dim() >= 2 and id(p) not in ids]
    no_decay = [p for _, p in named if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": o["weight_decay"], "name": "decay"},
              {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"}]
    if tables:
        groups.append({"params": tables, "weight_decay": o["weight_decay"], "name": "embed", "lr": o["embed_lr"]})
    muon = {"params": hidden, "use_muon": True, "name": "muon", "lr": o["muon_lr"], "momentum": o["muon_momentum"],
            "momentum_warmup": o.get("muon_momentum_warmup", 0), "weight_decay": o["muon_weight_decay"]}
    return MuonAdamW([muon, *groups], lr=o["lr"], betas=tuple(o["betas"]))


def lr_factor(step: int, warmup: int, floor: float, progress: float) -> float:
    """The learning rate as a fraction of its peak: linear warm-up over `warmup` steps, then cosine
    decay (Loshchilov & Hutter 2017, SGDR) from 1 to `floor` as `progress` goes from 0 to 1
    (clamped), e.g. `lr_factor(99, 100, 0.05, 0.0) == 1.0`, `lr_factor(s, 100, 0.05, 1.0) == 0.05`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, max(0.0, progress))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
