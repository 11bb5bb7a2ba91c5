"""`val/loss` and `val/bpc` of a trained model outside training (`evaluate.py`), by the same
Lightning validation the training runs."""
from __future__ import annotations

import warnings

import lightning as L
from lightning.pytorch.utilities.warnings import PossibleUserWarning

from data.datamodule import PoetryDataModule
from model.engine import Engine
from model.loading import model_fields
from model.training.lit import LitGPT


def validation_metrics(engine: Engine, datamodule: PoetryDataModule) -> dict[str, float]:
    """`val/loss` and `val/bpc` (and `val/<name>/…` of the data module's other validation sets) of
    a loaded model (`model.loading.load_engine`) by Lightning's `validate` on the data module, on
    the engine's device, so they follow its validation protocol exactly as in training. raises
    ValueError if the data module's vocabulary is not the model's."""
    lit = LitGPT(model_fields(engine.model.cfg), {}, engine.tokenizer.state_dict(), engine.script, engine=engine)
    accelerator = "gpu" if engine.device.type == "cuda" else "cpu"
    if datamodule.tokenizer.state_dict() != lit.tokenizer.state_dict():
        raise ValueError("the prepared corpus gives another vocabulary than the checkpoint's; val/bpc needs the "
                         "data it was trained on (same corpus, script and tokenizer), or val_bpc=false")
    trainer = L.Trainer(accelerator=accelerator, devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PossibleUserWarning)  # few dataloader workers: fine here
        results = trainer.validate(lit, datamodule=datamodule, verbose=False)  # a dict per validation set
    return {k: float(v) for metrics in results for k, v in metrics.items()}
