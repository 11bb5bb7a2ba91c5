"""Train the poetry GPT: `python train.py [model=small attention=flash trainer=gpu ...]`.

Composes the Hydra config (conf/train.yaml), checks that the attention backend can run
here, prepares the corpus, then fits with Lightning. Checkpoints: checkpoints/<run_name>/;
logs, wandb run and attention PNGs: logs/<run_name>/.
"""
from __future__ import annotations

import logging
import sys
import hydra
import lightning as L
import rootutils
import torch
from lightning.pytorch.loggers import WandbLogger
from omegaconf import DictConfig, OmegaConf

rootutils.setup_root(__file__, indicator=".project-root", pythonpath=True)

from data.tokenizer import tokenizer_from_state  # noqa: E402
from model.training.lit import LitGPT  # noqa: E402
from model.cli import exit_on_user_error, quote_non_ascii_overrides  # noqa: E402
from model.training.runtime import (  # noqa: E402
    check_attention_backend,
    compile_or_eager,
    instantiate_loggers,
    resolve_precision,
)

log = logging.getLogger(__name__)
MODEL_KEYS = ("block_size", "n_layer", "n_head", "n_embd", "dropout", "bias", "head", "head_cutoffs", "head_div_value",
              "pos_emb", "qk_norm", "mlp_act", "zero_init_proj")


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit a model as `cfg` says; returns the final metrics (e.g. `val/loss`, `val/bpc`)."""
    L.seed_everything(cfg.seed, workers=True)
    cfg.trainer.precision = resolve_precision(cfg.trainer.precision, cfg.trainer.accelerator)
    if torch.cuda.is_available():
        torch.set_float32_matmul_precision("high")
    callbacks = [hydra.utils.instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=instantiate_loggers(cfg.get("logger")))
    check_attention_backend(trainer, cfg.attention.backend, cfg.model.dropout, cfg.model.n_embd // cfg.model.n_head)

    datamodule = hydra.utils.instantiate(cfg.data)
    datamodule.prepare_data()
    tokenizer = datamodule.tokenizer
    if cfg.ckpt_path:
        saved = torch.load(cfg.ckpt_path, map_location="cpu", weights_only=False)["hyper_parameters"]["tokenizer"]
        if tokenizer_from_state(saved).state_dict() != tokenizer.state_dict():
            raise ValueError(f"{cfg.ckpt_path} was trained with another vocabulary than data.script={cfg.data.script} "
                             f"tokenizer={cfg.tokenizer.kind} gives; resume with the settings it was trained with.")
    shape = OmegaConf.to_container(cfg.model, resolve=True)
    model = LitGPT(
        model={**{k: shape[k] for k in MODEL_KEYS}, "attention": cfg.attention.backend},
        optim=OmegaConf.to_container(cfg.model.optim, resolve=True),
        tokenizer=tokenizer.state_dict(),
        script=cfg.data.script,
    )
    if cfg.compile:
        compile_or_eager(model.gpt, log.info)
    for lg in trainer.loggers:
        lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    trainer.fit(model, datamodule=datamodule, ckpt_path=cfg.ckpt_path)
    for lg in trainer.loggers:
        if isinstance(lg, WandbLogger):
            lg.experiment.finish()  # flush the run now, so sweeps in one process get separate runs
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    train(cfg)


if __name__ == "__main__":
    sys.argv = quote_non_ascii_overrides(sys.argv)
    main()
