"""Measure the poems a checkpoint writes beside held-out Tang poems:
`python evaluate.py ckpt_path=checkpoints/<run>/last.ckpt [num_samples=300]`.

Samples `num_samples` poems per sample set (free; per form; per form with rhyme; per form
with meter; for a model with plan tokens per form with form and rhyme as plan tokens only:
conf/evaluate.yaml `sets`, `forms`), measures them and `reference` held-out human poems
(`model/inspection/poem_metrics.py`: form, rhyme, 平仄, 黏, 对, 格律, copying, distinct-n, and
for plan models how often a poem keeps the plan it was sampled with), computes `val/bpc`
(and `val/bpc_text` for plan models) by Lightning's validation on the training data module,
prints a table and writes everything (settings, figures, poems, plans) as JSON to
`out_dir/evaluate.json` (default `logs/evaluate/<checkpoint folder>/`).
"""
from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import hydra
import rootutils
from omegaconf import DictConfig, OmegaConf

from data.verse.ci import CI
from model.ablation import ablated_suffix
from model.cli import exit_on_user_error, quote_non_ascii_overrides
from model.decoding import check_sampling_args
from model.device import commit, describe
from model.inspection.ci_metrics import format_ci_table
from model.inspection.evaluation import (
    REFERENCE,
    ci_sets,
    is_char_model,
    is_ci,
    is_plan_model,
    is_tunes_model,
    sample_and_measure,
    sample_requests,
)
from model.inspection.poem_metrics import format_placement, format_table
from model.loading import load_engine
from model.sampling.conditions import has_conditions
from model.sampling.poems import SamplingOptions
from model.training.validation import validation_metrics

rootutils.setup_root(__file__, indicator=".project-root")  # PROJECT_ROOT, which conf/paths reads

SAMPLING = ("num_samples", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "repetition_penalty", "topic_lean")


def _write_json(path: Path, report: dict) -> None:
    """Write atomically: a partial file never appears under the final name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(report, f, ensure_ascii=False, indent=1)
    os.replace(tmp, path)


def evaluate(cfg: DictConfig) -> dict:
    """Sample, measure, validate, write the JSON; returns the report (keys: checkpoint,
    settings, rows, val, seconds, poems, json).

    raises ValueError (bad options, before any work), FileNotFoundError (no checkpoint, no
    corpus), BackendUnavailableError.
    """
    opts = SamplingOptions(**{k: cfg[k] for k in SAMPLING})
    check_sampling_args(opts.temperature, opts.top_k, opts.top_p)
    if opts.num_samples < 1 or cfg.reference < 0:
        raise ValueError(f"num_samples must be ≥ 1 and reference ≥ 0, got {opts.num_samples} and {cfg.reference}")
    sample_requests(cfg.sets, cfg.forms)  # raises for unknown sets or forms
    engine = load_engine(cfg.ckpt_path, cfg.paths.checkpoint_dir, cfg.device, cfg.backend, cfg.ablate,
                         cfg.ablate_mode, cfg.data.corpus_path)
    gpt, script, ckpt, device = engine.model, engine.script, engine.path, str(engine.device)
    requests = sample_requests(cfg.sets, cfg.forms, is_char_model(engine), is_plan_model(engine), has_conditions(engine),
                               is_tunes_model(engine))
    print(f"evaluate: {opts.num_samples} poems for each of {len(requests)} sample sets, then their figures and "
          f"{'val/bpc' if cfg.val_bpc else 'no validation'}: minutes on a CPU …", file=sys.stderr, flush=True)

    corpora = engine.meta.corpora.options(Path(cfg.data.corpus_path).parent)
    ci_requests = {name: fields for name, fields in requests.items() if is_ci(fields)}
    samples, plans, rows, seconds, keywords = sample_and_measure(
        engine, opts, {name: fields for name, fields in requests.items() if name not in ci_requests},
        cfg.data.corpus_path, cfg.reference, corpora.get("train_corpora", ()))
    ci_poems, ci_rows = {}, {}
    if ci_requests:
        start = time.perf_counter()
        ci_poems, ci_rows = ci_sets(engine, opts, ci_requests, cfg.reference)
        seconds[CI] = time.perf_counter() - start
    val = {}
    if cfg.val_bpc:
        start = time.perf_counter()
        tok_state = engine.tokenizer.state_dict()
        tokenizer = {"kind": tok_state["kind"], **({"encoding": tok_state["encoding"]} if "encoding" in tok_state else {})}
        datamodule = hydra.utils.instantiate(cfg.data, block_size=gpt.cfg.block_size, script=script,
                                             tokenizer=tokenizer, plan_tokens=is_plan_model(engine), **corpora,
                                             conditions=engine.meta.conditions)
        val = validation_metrics(engine, datamodule)
        seconds["validation"] = time.perf_counter() - start

    out_dir = Path(cfg.out_dir) if cfg.out_dir else Path(cfg.paths.log_dir) / "evaluate" / (
        ckpt.parent.name + ablated_suffix(engine.ablated, cfg.ablate_mode))
    settings = {k: OmegaConf.to_container(cfg[k]) if OmegaConf.is_config(cfg[k]) else cfg[k]
                for k in (*SAMPLING, "sets", "forms", "reference", "val_bpc", "backend", "ablate_mode")}
    report = {"checkpoint": str(ckpt), "device": device, "machine": describe(device), "commit": commit(),
              "weights_sha": engine.meta.weights_sha,
              "settings": {**settings, "ablate": list(engine.ablated), "sample_sets": requests},
              "rows": rows, "val": val, "seconds": seconds, "poems": samples,
              **({"plans": plans} if is_plan_model(engine) else {}),
              **({"keywords": keywords} if keywords else {}),
              **({"ci_rows": ci_rows, "ci_poems": ci_poems} if ci_rows else {}),
              "json": str(out_dir / "evaluate.json")}
    _write_json(Path(report["json"]), report)
    return report


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no "GPU available" chatter
    report = evaluate(cfg)
    n = report["settings"]["num_samples"]
    ablated = report["settings"]["ablate"]
    off = f" with {', '.join(ablated)} off ({cfg.ablate_mode})" if ablated else ""
    print(f"{report['checkpoint']}{off}: "
          f"{n} poems per sample set, {cfg.reference} held-out human poems; "
          f"distinct-n over {n} poems of each row; percentages of the poems, regulated poems, lines or pairs "
          "(see model/inspection/poem_metrics.py)")
    if len(report["rows"]) > 1 or "ci_rows" not in report:  # sets=[ci] alone: only the 词 table
        print(format_table(report["rows"]))
    if "keywords" in report:
        print("where the keywords stand (shares of the keywords found; beside each set, the held-out poems they "
              "came from):")
        print(format_placement(report["keywords"]["placement"]))
    if "ci_rows" in report:
        held = report["ci_rows"][REFERENCE]["n"]
        print(f"词 to a tune (model/inspection/ci_metrics.py; the human row: {held} held-out 词 of the tunes with "
              f"templates, all there are up to reference={cfg.reference}):")
        print(format_ci_table(report["ci_rows"]))
    if report["val"]:
        print("  ".join(f"{k} {v:.4f}" for k, v in report["val"].items() if k != "step"))
    print(f"wrote {report['json']} ({', '.join(f'{k} {v:.1f} s' for k, v in report['seconds'].items())})")


if __name__ == "__main__":
    sys.argv = quote_non_ascii_overrides(sys.argv)
    main()
