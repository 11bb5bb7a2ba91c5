"""What a trained model's attention heads learned, beside the random attention of the attention
lesson (docs/attention.md):
`python attention_maps.py ckpt_path=checkpoints/<run>/last.ckpt text=床前明月光，疑是地上霜。`
(a 词 read to its tune: `text=明月几时有，把酒问青天。 tune=水调歌头`)

Writes to `out_dir` (default `logs/attention_maps/<run>/`) one figure per layer,
`layer{l}.png` (rows: the trained heads, the same heads at initialisation, the lesson's
section 3 map from random q, k and its section 5 random head, one colour scale), and
`attention_view.html`: the same maps as one interactive page that works offline (pick a
character, a layer and a head; weights on hover; each head beside its baselines and
labelled with its pattern; docs/attention-view.md), and `attention_maps.json`: the per-head
statistics of `model/inspection/attention_stats.py` on the probe line and on held-out poems,
the baselines' means and spreads, the flags and the pattern names. Prints the same numbers
as tables. Options: conf/attention_maps.yaml.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import hydra
import rootutils
import torch
from omegaconf import DictConfig, OmegaConf

from data.corpus_io import heldout_poems
from data.verse.plan import PLAN_SLOTS
from model.ablation import ablated_suffix
from model.cli import exit_on_user_error, quote_non_ascii_overrides
from model.device import commit, describe
from model.engine import pad
from model.gpt import GPT
from model.inspection.attention_stats import (
    STATISTICS,
    baseline_statistics,
    head_rows,
    mean_statistics,
    random_head_maps,
    random_qk_maps,
)
from model.inspection.attention_view import ProbeView, attention_view_html
from model.inspection.head_effects import HeadScorer, format_effects, head_effects
from model.inspection.plots import attention_grid
from model.inspection.rhyme_heads import finding, format_study, rhyme_study
from model.loading import build_gpt, load_engine, model_fields

rootutils.setup_root(__file__, indicator=".project-root")  # PROJECT_ROOT, which conf/paths reads

ABBREV = {"entropy": "entropy", "max_weight": "max", "self": "self", "prev_token": "prev",
          "first_token": "first", "punctuation": "punct", "prev_line_same_pos": "prevsame",
          "prev_line_next_pos": "prevnext", "prev_line_rhyme": "prevrhyme"}


def progress(message: str) -> None:
    """One line on stderr while the report is computed (the tables come at the end, on stdout)."""
    print(f"attention_maps: {message} …", file=sys.stderr, flush=True)


def batch_maps(gpt: GPT, sequences: list[torch.Tensor]) -> list[torch.Tensor]:
    """Attention maps of sequences of different lengths in one pass: each (1, T_s) int64 →
    (n_layer, n_head, T_s, T_s). Shorter sequences are padded at the end; by causality the
    padding changes no row of the real positions."""
    idx, _ = pad([s[0] for s in sequences], sequences[0].device)
    maps = torch.stack(gpt.attention_maps(idx), dim=1).float()  # (B, n_layer, n_head, T, T)
    return [maps[b, :, :, : s.size(1), : s.size(1)] for b, s in enumerate(sequences)]


def summary(stats: dict[str, torch.Tensor]) -> dict[str, dict[str, float]]:
    """{name: samples} → {name: {"mean", "std"}} (population std; a single value has std 0)."""
    return {n: {"mean": v.float().mean().item(), "std": v.float().std(correction=0).item()} for n, v in stats.items()}


def measure(cfg: DictConfig, learned: list[torch.Tensor], init: list[torch.Tensor], token_lists: list[list[str]]) -> dict:
    """Per-head rows and baseline summaries for a set of sequences (their learned and initial maps)."""
    b = cfg.baselines
    random_maps = baseline_statistics(token_lists, b.n_samples, b.d, b.d_model, b.d_head, b.seed)
    init_stats = {n: v.flatten() for n, v in mean_statistics(init, token_lists).items()}  # over all heads
    references = {"random_qk": random_maps["random_qk"], "random_head": random_maps["random_head"], "init": init_stats}
    return {
        "heads": head_rows(mean_statistics(learned, token_lists), references, cfg.flag.k, cfg.flag.min_effect),
        "baselines": {"uniform": {n: v.item() for n, v in random_maps["uniform"].items()},
                      **{name: summary(s) for name, s in references.items()}},
    }


def format_table(title: str, result: dict) -> str:
    """The statistics as a text table: baselines (mean ± std), then one row per head; a
    flagged value is marked + (high) or − (low)."""
    head = f"{'':<22}" + "".join(f"{ABBREV[n]:>11}" for n in STATISTICS) + "  pattern"
    lines = [title, head]
    base = result["baselines"]
    lines.append(f"{'uniform causal map':<22}" + "".join(f"{base['uniform'][n]:>11.3f}" for n in STATISTICS))
    for name, label in (("random_qk", "lesson §3 random q,k"), ("random_head", "lesson §5 random head"),
                        ("init", "model at init")):
        lines.append(f"{label:<22}" + "".join(f"{base[name][n]['mean']:>6.3f}±{base[name][n]['std']:<4.2f}"
                                              for n in STATISTICS))
    for r in result["heads"]:
        cells = []
        for n in STATISTICS:
            mark = {"high": "+", "low": "−"}.get(r["flags"].get(n), " ")
            cells.append(f"{'n/a':>10} " if r[n] is None else f"{r[n]:>10.3f}{mark}")
        lines.append(f"{'L%dH%d' % (r['layer'], r['head']):<22}" + "".join(cells) + f"  {r['pattern']}")
    return "\n".join(lines)


def card_effects(effects: dict | None) -> dict[str, str]:
    """Head name → its card's line in the view: what switching it off alone cost, and its verdict
    if it looks at the rhyme."""
    if not effects:
        return {}
    verdicts = {v["heads"][0]: v["label"] for v in effects.get("rhyme", {}).get("verdicts", []) if len(v["heads"]) == 1}
    return {(name := f"L{h['layer']}H{h['head']}"): f"off: {h['all']:+.3f} nats/token, {h['rhyme_slot']:+.3f} at "
            f"rhyme slots" + (f" · {verdicts[name]}" if name in verdicts else "") for h in effects["heads"]}


def attention_report(cfg: DictConfig) -> dict:
    """Compute, draw and write everything; returns the JSON report.

    raises FileNotFoundError (no checkpoint, no corpus), UnknownCharactersError (text
    outside the vocabulary), ValueError (text longer than block_size − 1, an unknown tune),
    BackendUnavailableError.
    """
    engine = load_engine(cfg.ckpt_path, cfg.paths.checkpoint_dir, "cpu", cfg.backend, cfg.ablate, cfg.ablate_mode,
                         cfg.heldout.corpus_path)
    gpt, block_size, ckpt = engine.model, engine.model.cfg.block_size, engine.path
    idx, tokens = engine.encode_line(cfg.text, "text", cfg.tune or "")  # raises for a bad text or tune, too long
    plan = PLAN_SLOTS if engine.tokenizer.plan else 0  # every poem is read as trained: <bos>, its plan, the text
    poems = heldout_poems(cfg.heldout.corpus_path, engine.script, cfg.heldout.n_poems, cfg.heldout.forms,
                          block_size - 1 - plan)
    progress(f"attention maps of the probe line and {len(poems)} held-out poems")
    encoded = [engine.encode_line(poem, "held-out poem") for poem in poems]
    torch.manual_seed(cfg.init_seed)
    init_gpt = build_gpt(model_fields(gpt.cfg), engine.tokenizer, engine.script).eval()  # as training started

    sequences = [idx, *(ids for ids, _ in encoded)]
    learned, init = batch_maps(gpt, sequences), batch_maps(init_gpt, sequences)
    heldout_tokens = [t for _, t in encoded]
    report = {
        "checkpoint": str(ckpt), "machine": describe("cpu"), "commit": commit(), "weights_sha": engine.meta.weights_sha,
        "text": engine.to_model_text(cfg.text, "text"), "tune": cfg.tune, "tokens": tokens,
        "settings": {k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
                     for k in ("backend", "ablate_mode", "init_seed", "heldout", "baselines", "flag")}
        | {"ablate": list(engine.ablated)},
        "statistics": {"names": list(STATISTICS), "units": "entropy in nats, the others attention weight (0–1)",
                       "rows": "each a mean over rows i ≥ 1 where defined; held-out: mean over poems",
                       "flag": f"|value − mean| > {cfg.flag.k} std and > {cfg.flag.min_effect} for every baseline "
                               "(random_qk and random_head over seeds, init over the model's heads)"},
        "probe": measure(cfg, learned[:1], init[:1], [tokens]),
        "heldout": {"poems": len(poems), **measure(cfg, learned[1:], init[1:], heldout_tokens)} if poems else None,
    }
    if cfg.head_effects.enabled and not engine.ablated:  # what each head is for, by switching it off
        report["head_effects"] = head_effects_report(cfg, engine, report["heldout"], block_size - 2 - plan)
    out_dir = Path(cfg.out_dir) if cfg.out_dir else Path(cfg.paths.log_dir) / "attention_maps" / (
        ckpt.parent.name + ablated_suffix(engine.ablated, cfg.ablate_mode))
    out_dir.mkdir(parents=True, exist_ok=True)
    draw(cfg, report, learned[0], init[0], tokens, out_dir, ckpt.parent.name)
    report["json"] = str(out_dir / "attention_maps.json")
    Path(report["json"]).write_text(json.dumps(report, ensure_ascii=False, indent=1))
    return report


def head_effects_report(cfg: DictConfig, engine, heldout: dict | None, max_len: int) -> dict | None:
    """Each head switched off on the held-out poems of at most `max_len` characters (`head_effects`),
    then the rhyme study's free poems (`rhyme_study`, with the held-out poems' verdicts `heldout`);
    None where no held-out poem fits."""
    he = cfg.head_effects
    every = heldout_poems(cfg.heldout.corpus_path, engine.script, he.n_poems or 10 ** 9, None, max_len)
    if not every:
        return None
    progress(f"each head switched off on {len(every)} held-out poems, then the rhyme study's free poems "
             f"({he.free.num_samples} a set and seed): the longest part, minutes on a CPU")
    start, scorer = time.perf_counter(), HeadScorer(engine, every)
    effects = {"poems": len(every), **head_effects(engine, every, scorer=scorer)}
    effects["seconds"] = time.perf_counter() - start
    if heldout:
        effects["rhyme"] = rhyme_study(engine, scorer, heldout["heads"], he.control.seeds, he.control.per_seed,
                                       he.free.seeds, he.free.num_samples, cfg.heldout.corpus_path)
    return effects


def draw(cfg: DictConfig, report: dict, learned: torch.Tensor, init: torch.Tensor, tokens: list[str], out_dir: Path,
         run: str) -> None:
    """The probe line's figures, `layer<L>.png` (trained, at initialisation, the lessons' two random
    maps; learned, init: (n_layer, n_head, T, T)) and the page `attention_view.html`, into `out_dir`;
    their paths into `report` ("figures", "html")."""
    n_layer, n_head, T, _ = learned.shape
    b = cfg.baselines
    random_maps = torch.stack([random_qk_maps(T, n_head, b.d, b.seed),
                               random_head_maps(T, n_head, b.d_model, b.d_head, b.seed)])
    row_titles = ["trained", f"at initialisation\n(seed {cfg.init_seed})", f"lesson §3\nrandom q, k (d={b.d})",
                  "lesson §5\nrandom x, W_q, W_k"]
    report["figures"] = []
    for layer in range(n_layer):
        grid = torch.cat([learned[layer : layer + 1], init[layer : layer + 1], random_maps])  # (4, n_head, T, T)
        fig = attention_grid(grid.numpy(), tokens, title=f"layer {layer} of {run}", row_titles=row_titles,
                             col_titles=[f"head {h} / map {h}" for h in range(n_head)])
        fig.savefig(out_dir / f"layer{layer}.png", dpi=100)
        report["figures"].append(str(out_dir / f"layer{layer}.png"))
    kinds = [t.replace("\n", " ") for t in row_titles]  # the same maps on one page, the same labels
    verdicts = {"probe line": report["probe"]["heads"]}
    if report["heldout"]:
        verdicts[f"{report['heldout']['poems']} held-out poems"] = report["heldout"]["heads"]
    view = ProbeView(tokens, dict(zip(kinds, [learned.numpy(), init.numpy(), *random_maps.numpy()])), verdicts)
    report["html"] = str(out_dir / "attention_view.html")
    Path(report["html"]).write_text(attention_view_html([view], f"{run} · {report['text']}",
                                                        effects=card_effects(report.get("head_effects"))),
                                    encoding="utf-8")


@hydra.main(version_base="1.3", config_path="conf", config_name="attention_maps")
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    report = attention_report(cfg)
    print(format_table(f"probe 「{report['text']}」 ({len(report['tokens'])} positions)", report["probe"]))
    if report["heldout"]:
        print()
        print(format_table(f"held-out: {report['heldout']['poems']} validation poems ({', '.join(cfg.heldout.forms)})",
                           report["heldout"]))
    if report.get("head_effects"):
        print(f"\neach head off alone: Δ nats per target on {report['head_effects']['poems']} held-out poems")
        print(format_effects(report["head_effects"]))
        if study := report["head_effects"].get("rhyme"):
            looking = ", ".join(study["looking"]) or "none"
            print(f"\nheads switched off together; the heads that look at the rhyme: {looking}")
            print(format_study(study, report["head_effects"]["kinds"]))
            if found := finding(study):
                print(f"\n{found}")
    print(f"\nwrote {report['json']}, {report['html']} and {len(report['figures'])} figures")


if __name__ == "__main__":
    sys.argv = quote_non_ascii_overrides(sys.argv)
    main()
