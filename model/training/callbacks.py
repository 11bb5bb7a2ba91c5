"""Callbacks that look inside the model at each validation (attention maps, sampled poems) and
at the end of training (the evaluation table of `evaluate.py` on a few poems, each head switched off).

They act on rank 0 only, skip the sanity check, and send what they make to the first
logger that can take it (Weights & Biases: images, tables, HTML). Attention maps are also
written as PNG files and interactive HTML views under the run folder, so they exist whatever
the logger.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from data.corpus_io import heldout_poems
from model.inspection.attention_stats import (
    STATISTICS,
    baseline_statistics,
    head_rows,
    head_statistics,
    random_head_maps,
    random_qk_maps,
)
from model.inspection.attention_view import ProbeView, attention_view_html
from model.inspection.evaluation import is_char_model, is_plan_model, sample_and_measure, sample_requests
from model.inspection.head_effects import KINDS, head_effects
from model.inspection.plots import attention_grid
from model.inspection.poem_metrics import METRICS
from model.sampling.poems import SamplingOptions, sample_poems

VIEW_KINDS = ("trained", "at initialisation", "lesson §3 random q, k", "lesson §5 random x, W_q, W_k")
"""The maps of each head in the attention view, in display order."""


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


def probe_maps(gpt: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """Eval-mode attention maps of one sequence idx: (1, T) → (n_layer, n_head, T, T) float32 on the CPU."""
    with _eval_mode(gpt):
        return torch.stack(gpt.attention_maps(idx), dim=1)[0].float().cpu()


class AttentionMapLogger(L.Callback):
    """Logs what the attention heads do on a few probe lines, beside the random-q/k maps of the
    attention lesson (docs/attention.md).

    probe_lines: lines or poems (any script; converted to the model's), each at most
    block_size − 1 characters, or {text, tune} for the start of a 词 read to its tune
    (`Engine.encode_line`) (conf/callbacks/default.yaml: the lesson's 「床前明月光，疑是地上霜。」,
    王昌龄's 七言绝句 《出塞》 from the validation split, and 苏轼's 水调歌头 「明月几时有，把酒问青天。」);
    every_n_validations: log at every n-th validation; n_samples, flag_k, min_effect: the
    random baselines and the flagging rule of `model.inspection.attention_stats.classify`. raises
    ValueError if probe_lines is empty or a single string.

    At setup (before training, and before a resumed run restores its weights) it checks
    the probes (an unknown character or a probe too long stops the run there) and keeps the
    statistics of the model at initialisation and of the lesson's random maps. Each log,
    from rank 0: one image per probe (`attention/probe{p}`: a grid of layers × heads, also
    written to `<run folder>/attention/step{step:06d}_probe{p}.png`), a table
    `attention/stats` (step, probe, layer, head, the statistics, flagged ones, pattern), and
    scalars `attn/L{l}H{h}/{statistic}` (mean over the probes), and the interactive view
    `attention/view` (`model.inspection.attention_view`: every probe, its heads beside the
    model at initialisation and the lesson's maps, each labelled with its pattern; logged as
    `wandb.Html(..., inject=False)`, written to `<run folder>/attention/step{step:06d}_view.html`).
    The first log also sends the baselines (`attention/probe{p}_baselines`: the model at
    initialisation, the lesson's section 3 and section 5 maps). `seconds` holds the time spent in setup and logging, also
    logged as `attn/logger_seconds`.
    """

    def __init__(self, probe_lines: Sequence[str | Mapping[str, str]], every_n_validations: int = 1,
                 n_samples: int = 32, flag_k: float = 3.0, min_effect: float = 0.1):
        if not probe_lines or isinstance(probe_lines, str):
            raise ValueError("probe_lines must be a non-empty list of lines")
        self.probe_lines = [{"text": p} if isinstance(p, str) else dict(p) for p in probe_lines]  # [{text, tune?}]
        self.every = every_n_validations
        self.n_samples, self.flag_k, self.min_effect = n_samples, flag_k, min_effect
        self.seconds = 0.0
        self._count = 0
        self._baselines_sent = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Encode the probes (raising now for bad ones) and measure the baselines."""
        start = time.perf_counter()
        self._probes = [pl_module.engine.encode_line(probe["text"], f"callbacks.attention_maps.probe_lines[{p}]",
                                                     probe.get("tune", ""))
                        for p, probe in enumerate(self.probe_lines)]  # [(ids (1, T), tokens)]
        self._init_maps = [probe_maps(pl_module.gpt, idx) for idx, _ in self._probes]  # (n_layer, n_head, T, T)
        self._baselines = []
        for (_, tokens), maps in zip(self._probes, self._init_maps):
            random_maps = baseline_statistics([tokens], self.n_samples)
            init = {name: v.flatten() for name, v in head_statistics(maps, tokens).items()}  # over all heads
            self._baselines.append({"random_qk": random_maps["random_qk"], "random_head": random_maps["random_head"],
                                    "init": init})
        n_head = self._init_maps[0].size(1)
        self._random_maps = [torch.stack([random_qk_maps(len(t), n_head), random_head_maps(len(t), n_head)])
                             for _, t in self._probes]  # each (2, n_head, T, T): the lesson's section 3 and 5 maps
        self.seconds += time.perf_counter() - start

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self._count += 1
        if (self._count - 1) % self.every:
            return
        start = time.perf_counter()
        self.log_probes(trainer, pl_module)
        self.seconds += time.perf_counter() - start
        if logger := _wandb(trainer):
            logger.log_metrics({"attn/logger_seconds": self.seconds}, step=trainer.global_step)

    def log_probes(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Compute, draw and log the probes' maps and statistics once (see the class docstring)."""
        step = trainer.global_step
        out_dir = Path(trainer.default_root_dir) / "attention"
        out_dir.mkdir(parents=True, exist_ok=True)
        images, rows, stats, views = {}, [], [], []
        for p, ((idx, tokens), baselines) in enumerate(zip(self._probes, self._baselines)):
            maps = probe_maps(pl_module.gpt, idx)  # (n_layer, n_head, T, T)
            stats.append(head_statistics(maps, tokens))
            heads = head_rows(stats[-1], baselines, self.flag_k, self.min_effect)
            rows += [[step, p, r["layer"], r["head"], *(r[n] for n in STATISTICS), " ".join(r["flags"]), r["pattern"]]
                     for r in heads]
            views.append(ProbeView(tokens, dict(zip(VIEW_KINDS, [maps.numpy(), self._init_maps[p].numpy(),
                                                                 *self._random_maps[p].numpy()])),
                                   {"probe line": heads}))
            layers = [f"layer {layer}" for layer in range(maps.size(0))]
            images[f"attention/probe{p}"] = out_dir / f"step{step:06d}_probe{p}.png"
            attention_grid(maps.numpy(), tokens, title=f"{''.join(tokens[1:])} · step {step}",
                           row_titles=layers).savefig(images[f"attention/probe{p}"], dpi=72)
            if not self._baselines_sent:
                images[f"attention/probe{p}_baselines"] = out_dir / f"baselines_probe{p}.png"
                self._baseline_figure(p, tokens).savefig(images[f"attention/probe{p}_baselines"], dpi=72)
        self._baselines_sent = True
        view = out_dir / f"step{step:06d}_view.html"
        view.write_text(attention_view_html(views, f"attention · step {step}"), encoding="utf-8")
        if logger := _wandb(trainer):
            import wandb

            logger.log_metrics({"attention/view": wandb.Html(str(view), inject=False)}, step=step)
            for key, path in images.items():
                logger.log_image(key=key, images=[str(path)], step=step)
            logger.log_table(key="attention/stats", columns=["step", "probe", "layer", "head", *STATISTICS, "flags",
                                                            "pattern"], data=rows, step=step)
            mean = {name: torch.stack([s[name] for s in stats]).nanmean(0) for name in STATISTICS}  # (n_layer, n_head)
            logger.log_metrics({f"attn/L{layer}H{head}/{name}": v[layer, head].item() for name, v in mean.items()
                                for layer in range(v.size(0)) for head in range(v.size(1))}, step=step)

    def _baseline_figure(self, p: int, tokens: list[str]):
        """Rows: the model at initialisation (one row per layer), then the lesson's random maps."""
        init = self._init_maps[p]  # (n_layer, n_head, T, T)
        n_layer, n_head = init.shape[:2]
        return attention_grid(torch.cat([init, self._random_maps[p]]).numpy(), tokens,
                              title=f"{''.join(tokens[1:])} · baselines",
                              row_titles=[f"init · layer {layer}" for layer in range(n_layer)]
                              + ["lesson §3\nrandom q, k", "lesson §5\nrandom x, W_q, W_k"],
                              col_titles=[f"head {h} / map {h}" for h in range(n_head)])


class SampleLogger(L.Callback):
    """Samples a few poems at each validation and logs them as a wandb table `samples`
    (columns: step, poem), through the one sampling path (`model.sampling.poems.sample_poems`:
    the same poem rules as `sample.py`). Seeded, so the same checkpoint gives the same table.
    options: the other `SamplingOptions` fields (their defaults: model/sampling/recipe.yaml, as `sample.py`'s).
    `poems` keeps the last poems sampled."""

    def __init__(self, num_samples: int = 4, **options):
        self.options = SamplingOptions(num_samples=num_samples, **options)
        self.rows: list[list] = []
        self.poems: list[str] = []

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or (logger := _wandb(trainer)) is None:
            return
        with _eval_mode(pl_module.gpt):
            self.poems = sample_poems(pl_module.engine, self.options)
        self.rows += [[trainer.global_step, poem] for poem in self.poems]
        logger.log_text(key="samples", columns=["step", "poem"], data=self.rows, step=trainer.global_step)


class PoemEvaluationLogger(L.Callback):
    """At the end of training, `evaluate.py`'s table on a few poems, logged to wandb.

    corpus_path: the training corpus (held-out reference poems, training lines for `copy`);
    num_samples: poems per sample set; sets, forms: which sample sets
    (`model.inspection.evaluation.sample_requests`; a BPE model gets no form, rhyme or meter
    sets, a model without plan tokens no soft sets); reference:
    held-out human poems; options: the other `SamplingOptions` fields (their defaults:
    model/sampling/recipe.yaml, as `sample.py`'s). Logs a table `eval/poems`
    (columns: set, then `model.inspection.poem_metrics.METRICS`; the first row the human
    reference), the free set's figures as scalars `eval/free/<metric>`, and `eval/seconds`,
    the time it took (also kept in `seconds`). `val/bpc` is the last validation's, logged by
    the model. Does nothing without a wandb logger. raises ValueError for unknown sets or forms.
    """

    def __init__(self, corpus_path: str, num_samples: int = 16,
                 sets: Sequence[str] = ("free", "form", "rhyme", "meter", "soft"),
                 forms: Sequence[str] = ("wujue", "qijue", "wulv", "qilv"), reference: int = 200, **options):
        sample_requests(sets, forms)  # raises for unknown names, before training
        self.corpus_path, self.sets, self.forms, self.reference = corpus_path, list(sets), list(forms), reference
        self.options = SamplingOptions(num_samples=num_samples, **options)
        self.seconds = 0.0

    @rank_zero_only
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if (logger := _wandb(trainer)) is None:
            return
        start, engine = time.perf_counter(), pl_module.engine
        requests = sample_requests(self.sets, self.forms, is_char_model(engine), is_plan_model(engine))
        rank_zero_info(f"evaluating the model's poems: {self.options.num_samples} per set, {len(requests)} sets "
                       f"(callbacks.evaluation; '~callbacks.evaluation' turns it off)")
        _, _, rows, _, _ = sample_and_measure(engine, self.options, requests, self.corpus_path, self.reference)
        self.seconds = time.perf_counter() - start
        rank_zero_info(f"evaluated in {self.seconds:.1f} s (eval/poems, eval/seconds)")
        step = trainer.global_step
        logger.log_table(key="eval/poems", columns=["set", *METRICS],
                         data=[[name, *(row[m] for m in METRICS)] for name, row in rows.items()], step=step)
        logger.log_metrics({**{f"eval/free/{m}": v for m, v in rows.get("free", {}).items() if v is not None},
                            "eval/seconds": self.seconds}, step=step)


class HeadEffectsLogger(L.Callback):
    """At the end of training, what each attention head is for by intervention
    (`model.inspection.head_effects`): every head switched off alone, on the first `n_poems`
    validation poems of `corpus_path` (a longer poem: its first block_size tokens). Logs a table `heads/effects` (columns:
    head, then Δ nats per target over all targets, at rhyme slots, line starts, marks and `<eos>`;
    a row per head, then each layer's mean) and `heads/seconds`, the time it took (also kept in
    `seconds`). Does nothing without a wandb logger.
    """

    def __init__(self, corpus_path: str, n_poems: int = 256):
        self.corpus_path, self.n_poems, self.seconds = corpus_path, n_poems, 0.0

    @rank_zero_only
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if (logger := _wandb(trainer)) is None:
            return
        start, engine = time.perf_counter(), pl_module.engine
        poems = heldout_poems(self.corpus_path, engine.script, self.n_poems, None, 10 ** 9)
        with _eval_mode(engine.model):
            effects = head_effects(engine, poems)
        self.seconds = time.perf_counter() - start
        rows = [[f"L{h['layer']}H{h['head']}", *(h[k] for k in KINDS)] for h in effects["heads"]]
        rows += [[f"L{m['layer']} mean", *(m[k] for k in KINDS)] for m in effects["layer_mean"]]
        logger.log_table(key="heads/effects", columns=["head", *KINDS], data=rows, step=trainer.global_step)
        logger.log_metrics({"heads/seconds": self.seconds}, step=trainer.global_step)
        rank_zero_info(f"switched each head off on {len(poems)} validation poems of {Path(self.corpus_path).name} "
                       f"(every poet's) in {self.seconds:.1f} s "
                       "(heads/effects; '~callbacks.head_effects' turns it off)")
