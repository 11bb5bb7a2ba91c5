"""What decides a training run's results, measured rather than read from the config's text.

`fingerprint(cfg)` of a training config (conf/train.yaml composed) is a JSON-able dict:
- `trainer`: the run's length and batching (max_steps, max_time, accumulate_grad_batches,
  gradient_clip_val, precision, validation interval), data.batch_size, the seed, and the decay
  of the weight average the run keeps (`callbacks.ema`; absent: the trained weights);
- `data`: SHA-256 digests of the training and validation token arrays, of the training windows'
  starts, of the whole run's window order (the sampler's, annealing phase included) and of
  the validation windows' contents;
- `schedule`: every optimizer group's learning rate at nine steps of the run, and the optimizer's
  settings (`model.optim` less its name and the settings left null, which change nothing);
- `model`: the parameter count and shapes, then three optimizer steps of the seeded model on
  the run's first batches, on the CPU in float32: each step's loss and the norm of each
  parameter group's update (6 significant digits; the optimizer's kind shows in its groups).

Other callbacks, loggers, paths, the run's name and how a setting is spelled take no part: a cleanup
that keeps behaviour keeps the fingerprint. `differences(a, b)` compares two; the float parts
within `RTOL` relative, since CPUs differ in float32 rounding (about 1e-6 after three steps).
"""
from __future__ import annotations

import hashlib
import math
from types import SimpleNamespace

import hydra
import lightning as L
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from model.loading import head_for_vocabulary
from model.training.lit import LitGPT, model_settings

RTOL = 1e-4
"""Relative tolerance of the float parts (losses, update norms) in `differences`."""
STEPS = 3
"""Optimizer steps the `model` part takes."""


def sha(*arrays) -> str:
    """SHA-256 (first 16 hex digits) of arrays' bytes, as int64, in order."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(np.asarray(a, dtype=np.int64)).tobytes())
    return h.hexdigest()[:16]


def rounded(x: float, digits: int = 6) -> float:
    return float(f"{x:.{digits}g}")


def stub_trainer(cfg: DictConfig) -> SimpleNamespace:
    """What the data module and `LitGPT.configure_optimizers` read of a Trainer, for one process."""
    steps = int(cfg.trainer.get("max_steps") or -1)
    return SimpleNamespace(max_steps=steps, accumulate_grad_batches=int(cfg.trainer.get("accumulate_grad_batches") or 1),
                           world_size=1, global_rank=0, callbacks=[],
                           estimated_stepping_batches=steps if steps > 0 else math.inf)


def fingerprint(cfg: DictConfig) -> dict:
    """The behaviour of the training run `cfg` describes (module text). Prepares the corpus
    cache when missing (as train.py does). raises as train.py for a config it would refuse."""
    t = cfg.trainer
    trainer = stub_trainer(cfg)
    dm = hydra.utils.instantiate(cfg.data)
    dm.trainer = trainer
    dm.prepare_data()
    dm.setup("fit")
    loader = dm.train_dataloader()
    per_step = dm.batch_size * trainer.accumulate_grad_batches
    order, total = [], (trainer.max_steps if trainer.max_steps > 0 else 8) * per_step
    while len(order) < total:  # epochs as the loader runs them: each a new pass of the sampler, last batch dropped
        epoch = list(loader.sampler)
        order += epoch[: len(epoch) // dm.batch_size * dm.batch_size]
    order = order[:total]
    val = [torch.stack(dm.val_set[i]) for i in range(len(dm.val_set))]
    data = {"train_tokens": sha(dm.tokens("train")), "val_tokens": sha(dm.tokens("val")), "order": sha(order),
            "starts": sha(dm.train_set.starts), "val_windows": sha(*val), "vocab_size": dm.tokenizer.vocab_size}

    L.seed_everything(cfg.seed, verbose=False)
    lit = LitGPT(model=head_for_vocabulary(model_settings(cfg), dm.tokenizer.vocab_size),
                 optim=OmegaConf.to_container(cfg.model.optim, resolve=True), tokenizer=dm.tokenizer.state_dict(),
                 script=cfg.data.script)
    lit.trainer = trainer
    lit.gpt.lm_head.set_token_counts(torch.from_numpy(dm.token_counts()))
    opts = lit.configure_optimizers()
    opt, sched = opts["optimizer"], opts["lr_scheduler"]["scheduler"]
    marks = sorted({0, 1, 2, *(round(trainer.max_steps * f) - 1 for f in (0.05, 0.25, 0.5, 0.75, 0.9, 1.0))} - {-1})
    schedule = [[rounded(base * factor(s), 8) for base, factor in zip(sched.base_lrs, sched.lr_lambdas)] for s in marks]
    params = list(lit.gpt.parameters())
    model = {"parameters": sum(p.numel() for p in params), "shapes": sha(*[p.shape for p in params]),
             "loss": [], "update_norms": []}
    lit.train()
    for step in range(STEPS):
        ids = order[step * per_step:(step + 1) * per_step]
        x, y = (torch.stack(t) for t in zip(*(dm.train_set[i] for i in ids)))  # (B·k, T) each
        before = [[p.detach().clone() for p in g["params"]] for g in opt.param_groups]
        loss = lit.gpt.loss(x, y)
        loss.backward()
        if t.get("gradient_clip_val"):
            torch.nn.utils.clip_grad_norm_(params, float(t.gradient_clip_val))
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        model["loss"].append(rounded(loss.item()))
        model["update_norms"].append([rounded(math.sqrt(sum(float((p.detach() - b).double().square().sum())
                                                             for p, b in zip(g["params"], old))))
                                      for g, old in zip(opt.param_groups, before)])
    return {"trainer": {"max_steps": trainer.max_steps, "max_time": t.get("max_time"),
                        "accumulate_grad_batches": trainer.accumulate_grad_batches,
                        "gradient_clip_val": t.get("gradient_clip_val"), "precision": str(t.get("precision")),
                        "val_check_interval": t.get("val_check_interval"), "batch_size": dm.batch_size,
                        "seed": cfg.seed, **({"ema_decay": ema.decay} if (ema := (cfg.get("callbacks") or {}).get("ema"))
                                             else {})},
            "data": data, "schedule": {"optim": {k: v for k, v in lit.hparams.optim.items()
                                                 if k != "name" and v is not None},
                                       "steps": marks, "lr": schedule},
            "model": model}


def differences(a: dict | None, b: dict | None) -> list[str]:
    """The parts (`trainer`, `data`, `schedule`, `model`) in which two fingerprints differ: ints and
    strings exactly, the model's losses and update norms within RTOL. A missing one differs in all."""
    if not a or not b:
        return ["trainer", "data", "schedule", "model"]

    def same(u, v) -> bool:
        if isinstance(u, list) and isinstance(v, list):
            return len(u) == len(v) and all(same(p, q) for p, q in zip(u, v))
        if isinstance(u, float) and isinstance(v, (int, float)):
            return math.isclose(u, v, rel_tol=RTOL)
        return u == v

    parts = ("trainer", "data", "schedule", "model")
    return [k for k in parts if not (k in a and k in b and all(
        same(a[k].get(f), b[k].get(f)) for f in set(a[k]) | set(b[k])))]

