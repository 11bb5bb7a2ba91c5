"""Train the poetry GPT: `python train.py [model=small attention=flash trainer=gpu ...]`.

Composes the Hydra config (conf/train.yaml), checks that the attention backend can run
here, prepares the corpus, then fits with Lightning. Checkpoints: checkpoints/<run_name>/;
logs, wandb run and attention PNGs: logs/<run_name>/. `ckpt_path=last` resumes the newest
run (docs/training.md, "Resume and interruption"); SIGTERM or Ctrl-C saves the step and exits 143 / 130.
`experiment=finetune init_from=<checkpoint>` continues a trained model on a poet's poems or a corpus
of your own, with the base's shape and vocabulary (docs/finetuning.md, `model.training.finetune`).
"""
from __future__ import annotations

import logging
import signal
import sys
import warnings
from pathlib import Path

import hydra
import lightning as L
import rootutils
import torch
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from data.datamodule import PoetryDataModule
from model.checkpoint_meta import CheckpointMeta, Corpora, FineTuned
from model.cli import exit_on_user_error, quote_non_ascii_overrides
from model.loading import head_for_vocabulary, load_weights
from model.training.checkpoints import (
    AtomicCheckpointIO,
    check_same_shape,
    check_same_vocabulary,
    check_same_workers,
)
from model.training.finetune import Base, finetune_record, follow_base
from model.training.interruption import StepSeed, StopOnSignal, TrainingInterrupted, collective_failure
from model.training.lit import LitGPT, model_settings
from model.training.progress import StepProgressBar
from model.training.runtime import (
    OneRunOnEveryRank,
    check_accelerator,
    check_attention_backend,
    check_new_run_folder,
    compile_or_eager,
    die_with_launcher,
    instantiate_loggers,
    launch_id,
    process_group,
    resolve_precision,
    run_name_for_all_ranks,
    val_check_in_batches,
)
from model.training.start import FINETUNE, RESUME_FINETUNE, Start, resolve_start, say_start

rootutils.setup_root(__file__, indicator=".project-root")  # PROJECT_ROOT, which conf/paths reads

log = logging.getLogger(__name__)
HEAD_FIELDS = ("head", "head_cutoffs")  # decided for the vocabulary (head_for_vocabulary): checked once it is known


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit a model as `cfg` says; returns the final metrics (e.g. `val/loss`, `val/bpc`).

    raises ValueError / FileNotFoundError before any training for a bad `ckpt_path` (missing,
    another shape, vocabulary or number of loader workers) or a run folder that already holds
    checkpoints; the same before any training for a bad `init_from`, `data.poets` or user corpus (a
    line that is no poem's record, no poem, characters outside the base's vocabulary);
    NonFiniteLossError (a ValueError) at the first NaN loss; TrainingInterrupted (SystemExit 143 or
    130) on SIGTERM or Ctrl-C, after saving the step to `last.ckpt`.
    """
    L.seed_everything(cfg.seed, workers=True)
    start = resolve_start(cfg, keep=False)  # scratch, resume, fine-tune or a fine-tune resumed: Hydra's check's
    if start.base is not None:
        follow_base(cfg, start.base)  # its shape, script, plan tokens and conditions: before anything reads them
    say_start(start, cfg)
    model_cfg = model_settings(cfg)
    check_accelerator(cfg.trainer.accelerator)
    cfg.trainer.precision = resolve_precision(cfg.trainer.precision, cfg.trainer.accelerator)
    val_check_in_batches(cfg.trainer)
    try:
        with process_group(cfg.trainer, cfg.collective_timeout):
            if start.resuming:
                check_same_shape(start.saved, {k: v for k, v in model_cfg.items() if k not in HEAD_FIELDS},
                                 start.ckpt_path)
                check_same_workers(start.saved, cfg.data.num_workers, start.ckpt_path)
            trainer = make_trainer(cfg, start)
            datamodule = hydra.utils.instantiate(cfg.data, base_tokenizer=start.base.tokenizer if start.base else None)
            datamodule.prepare_data()
            return fit(trainer, make_model(cfg, start, datamodule, model_cfg), datamodule, cfg, start.ckpt_path)
    except SIGTERMException:  # Lightning's own handler: SIGTERM came before training started
        raise TrainingInterrupted(signal.SIGTERM) from None


def make_trainer(cfg: DictConfig, start: Start) -> L.Trainer:
    """The run's Lightning trainer: conf/trainer with conf/callbacks and the run's own (the step's
    seed, stopping on a signal, one run name on every rank, the progress bar), the loggers, and
    atomic checkpoint writes that hand Lightning the resumed checkpoint already read. raises
    ValueError for a run folder that holds checkpoints, or an attention backend this machine lacks."""
    if start.resuming:  # a resumed run is a new run, in its own folder, with its own best checkpoint (docs/training.md)
        warnings.filterwarnings("ignore", message="The dirpath has changed from")
    run_dir = Path(cfg.paths.checkpoint_dir) / cfg.run_name
    check_new_run_folder(run_dir, cfg.run_name)
    log.info(f"run_name {cfg.run_name}: checkpoints in {run_dir}")  # on every rank: the same name
    if torch.cuda.is_available():
        torch.set_float32_matmul_precision("high")
    callbacks = [hydra.utils.instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    callbacks += [StepSeed(cfg.seed), StopOnSignal(run_dir), OneRunOnEveryRank(cfg.run_name)]
    if cfg.trainer.get("enable_progress_bar", True):
        callbacks.append(StepProgressBar())  # steps against max_steps, or seconds against max_time
    trainer = hydra.utils.instantiate(
        cfg.trainer, callbacks=callbacks, logger=instantiate_loggers(cfg.get("logger")),
        plugins=[AtomicCheckpointIO((start.ckpt_path, start.saved) if start.resuming else None)])
    check_attention_backend(trainer, cfg.attention.backend, cfg.model.dropout, cfg.model.n_embd // cfg.model.n_head)
    return trainer


def make_model(cfg: DictConfig, start: Start, datamodule: PoetryDataModule, model_cfg: dict) -> LitGPT:
    """The LightningModule for the prepared data: its head sized for the vocabulary, the weights of
    the checkpoint resumed or the base fine-tuned, what the checkpoints record beside them
    (`run_meta`), compiled if `cfg.compile`. raises ValueError where a resumed checkpoint's
    vocabulary or shape differs."""
    tokenizer = datamodule.tokenizer
    model_cfg = head_for_vocabulary(model_cfg, tokenizer.vocab_size)  # said in the log where it differs
    if start.resuming:
        check_same_vocabulary(start.saved, tokenizer.state_dict(), cfg.data.script, start.ckpt_path)
        check_same_shape(start.saved, model_cfg, start.ckpt_path)  # the head too, now decided
    tuned = finetune_record(start.base, cfg, datamodule.meta) if start.mode == FINETUNE else \
        start.base.meta.finetuned if start.mode == RESUME_FINETUNE else None
    model = LitGPT(model=model_cfg, optim=OmegaConf.to_container(cfg.model.optim, resolve=True),
                   tokenizer=tokenizer.state_dict(), script=cfg.data.script, meta=run_meta(datamodule, start.base, tuned))
    if tuned is not None:  # fine-tuned: the base's weights, the poets it knows, a record of both runs' data
        log.info(f"fine-tuning data: {tuned.train_poems:,} training poems, {tuned.val_poems:,} held out"
                 + (": val/loss rests on them alone" if tuned.val_poems < 10 else ""))
    if start.mode == FINETUNE:
        load_weights(model, start.base.ckpt["state_dict"], start.base.path)
    if start.resuming:  # its weights fit its settings: one line now, not a traceback from Lightning later
        load_weights(model, start.saved["state_dict"], start.ckpt_path)
    if cfg.compile:
        compile_or_eager(model.gpt, log.info)
    return model


def fit(trainer: L.Trainer, model: LitGPT, datamodule: PoetryDataModule, cfg: DictConfig,
        ckpt_path: Path | None) -> dict[str, float]:
    """`trainer.fit` (from `ckpt_path` when resuming) with the config logged; the final metrics.
    raises TrainingInterrupted as `StopOnSignal`; a collective that stalled past `collective_timeout`
    or lost its peer as one line (`collective_failure`)."""
    for lg in trainer.loggers:
        lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    try:
        with run_name_for_all_ranks(cfg.run_name):
            trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    except RuntimeError as err:
        if (failed := collective_failure(err, cfg.collective_timeout)) is None:
            raise
        raise failed from None
    for lg in trainer.loggers:
        if isinstance(lg, WandbLogger):
            lg.experiment.finish()  # flush the run now, so sweeps in one process get separate runs
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


def run_meta(datamodule: PoetryDataModule, base: Base | None, tuned: FineTuned | None) -> CheckpointMeta:
    """What the run's checkpoints record beside the weights: the corpora its (prepared) data module
    reads, so evaluate.py rebuilds the same data; the condition shares and the poets it knows (a
    fine-tuned run keeps its base's, as it keeps its vocabulary); tuned, what a fine-tuned run
    started from and read (None: trained from scratch)."""
    if base is not None:
        conditions, poets = base.meta.conditions, base.meta.poets
    else:  # the data module lists poets only with conditions
        conditions, poets = datamodule.conditions, datamodule.meta.get("poets", {})
    corpora = Corpora.of(datamodule.corpus_path, datamodule.train_paths, datamodule.extra_val)
    return CheckpointMeta(conditions, poets, corpora, tuned)


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    train(cfg)


if __name__ == "__main__":
    sys.argv = quote_non_ascii_overrides(sys.argv)
    exit_on_user_error(launch_id)()  # torchrun across nodes without --rdzv-id: one line, before Hydra
    die_with_launcher()  # a rank whose launcher dies gets SIGTERM: no orphan
    main()
