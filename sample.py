"""Sample poems from a checkpoint: `python sample.py ckpt_path=checkpoints/<run>/last.ckpt`.

Options (conf/sample.yaml; the sampling recipe from conf/sampling.yaml): prompt, form, tune (a 词 to a
tune; `tunes=list` lists them), acrostic, keywords,
keywords_forced, title, poet (`poets=list` lists the model's poets), rhyme, meter, control,
num_samples, max_new_tokens, temperature, top_k, top_p, repetition_penalty, topic_lean,
seed, use_cache, device, backend, ablate (heads to switch off, e.g. `ablate=[L3H2]`), ablate_mode,
format. The same seed and options give the same poems. A model trained with plan tokens draws
each poem's form and rhyme first; the text never shows them, `format=jsonl` records them
(`plan`: form and rhyme group, null for none; a model with tune tokens: the tune), and the title,
poet and keyword hints it was written to (`conditions`); a title without keywords plans the words
the poem is written around and leans toward (`title_plan`, `topic_lean`, `model.sampling.title_plan`), recorded as
`title_plan_words` (and as `keywords`, in the model's script). A 词 records its tune (`tune`); as text
it is printed under its tune's name, with a blank line between its stanzas (上阕, 下阕).
"""
from __future__ import annotations

import json
import sys

import hydra
import rootutils
import torch
from omegaconf import DictConfig, OmegaConf

from data.tokenizer import StreamDecoder
from data.verse.plan import plan_ids
from data.verse.poetry import LINE_END
from data.verse.tunes import stanza_ends, stanzas, tunes
from model.cli import exit_on_user_error, quote_non_ascii_overrides
from model.loading import load_engine
from model.sampling.conditions import known_poets
from model.sampling.poems import Decision, SamplingOptions, poem_steps, poem_text, read_plans
from model.sampling.title_plan import unplanned

rootutils.setup_root(__file__, indicator=".project-root")  # PROJECT_ROOT, which conf/paths reads

OPTIONS = tuple(SamplingOptions.__dataclass_fields__)


def break_couplets(text: str) -> str:
    """A line break after each sentence-final mark (。？！；): one couplet per line."""
    return "".join(c + "\n" if c in LINE_END[1:] else c for c in text)


FORMATS = ("text", "jsonl")
"""How `sample` prints the poems (conf/sample.yaml's `format`)."""


def as_lines(poem: str) -> str:
    """A poem printed one couplet per line, without trailing line break."""
    return break_couplets(poem).strip()


def sample(cfg: DictConfig, out=sys.stdout) -> list[str]:
    """Generate `cfg.num_samples` poems, print them in `cfg.format`, return them as plain text.

    A single poem in text format is printed as it is generated. raises FileNotFoundError (no
    checkpoint), ValueError (bad options, an unknown format, a prompt or acrostic outside the
    vocabulary or not fitting the form), BackendUnavailableError — all before any generation.
    """
    if cfg.tunes == "list":
        return list_tunes(out)
    if cfg.format not in FORMATS:
        raise ValueError(f"format={cfg.format!r} is not one of {', '.join(FORMATS)}")
    opts = SamplingOptions(**{k: OmegaConf.to_container(cfg[k]) if OmegaConf.is_config(cfg[k]) else cfg[k]
                              for k in OPTIONS})  # per-poem lists as Python lists, as from Python
    corpus = cfg.corpus_path if cfg.ablate and cfg.ablate_mode == "mean" else None  # read only for the means
    engine = load_engine(cfg.ckpt_path, cfg.paths.checkpoint_dir, cfg.device, cfg.backend, cfg.ablate,
                         cfg.ablate_mode, corpus)
    if engine.ablated:  # said once the model has the heads (a head it lacks is refused before)
        print(f"with {', '.join(engine.ablated)} off ({cfg.ablate_mode})", file=sys.stderr)
    if cfg.poets == "list":
        return list_poets(engine, out)
    start, steps, decision = poem_steps(engine, opts)
    if note := unplanned(opts, decision.title_plan_words):
        print(note, file=sys.stderr)
    elif decision.title_plan_words and cfg.format == "text":  # what the title planned (jsonl records it per poem)
        print("title_plan: " + " | ".join(map("、".join, dict.fromkeys(decision.title_plan_words))), file=sys.stderr)
    live = LivePoem(engine.tokenizer, decision.tunes, out) if cfg.format == "text" and opts.num_samples == 1 \
        else None
    if live:
        live.begin(start)
    tokens = [start]
    for step in steps:
        tokens.append(step if isinstance(step, torch.Tensor) else step.ids)  # a prompt after a drawn plan, or a token
        if live:
            live.show(tokens[-1][0].tolist())
    rows = torch.cat(tokens, dim=1)  # (B, T)
    poems = [poem_text(engine.tokenizer, row) for row in rows]
    if cfg.format == "jsonl":
        write_jsonl(cfg, engine, decision, rows, poems, out)
    elif live:
        live.end(poems[0])
    else:
        for poem, tune in zip(poems, decision.tunes or [None] * len(poems)):
            parts = stanzas(poem, tune) if tune else [poem]  # a 词: a blank line between 上阕 and 下阕
            print((f"{tune}\n" if tune else "") + "\n\n".join(map(as_lines, parts)), end="\n\n", file=out)
    return poems


class LivePoem:
    """A single poem printed as it is drawn: a couplet a line, a 词 under its tune with a blank line
    after its 上阕; never part of a character (`StreamDecoder`)."""

    def __init__(self, tok, tunes_: tuple[str, ...], out):
        self.tok, self.tune, self.out = tok, next(iter(tunes_), None), out
        self.stream, self.written = StreamDecoder(tok), ""

    def begin(self, start: torch.Tensor) -> None:
        """The heading (a 词's tune) and the given text of `start` (B, T0), not the condition segment."""
        if self.tune:
            print(self.tune, file=self.out, flush=True)
        ids = plan_ids(self.tok)
        self.show(ids.body(start[0].tolist()) if ids else start[0].tolist())

    def show(self, ids_: list[int]) -> None:
        text = self.stream.feed(ids_)
        self.written += text
        shown = break_couplets(text)
        if text and self.tune and stanza_ends(self.written, self.tune):
            shown += "\n" if shown.endswith("\n") else "\n\n"
        print(shown, end="", file=self.out, flush=True)

    def end(self, poem: str) -> None:
        print(self.stream.flush() + ("" if poem.endswith(tuple(LINE_END[1:])) else "\n"), file=self.out)


def write_jsonl(cfg: DictConfig, engine, decided: Decision, rows: torch.Tensor, poems: list[str], out) -> None:
    """One JSON line a poem: the poem, its plan and conditions (a plan model), the settings in force
    (`decided`: form, control, keywords_forced), its tune (a 词), its keywords, and the title's plan."""
    tok, ids, plans = engine.tokenizer, plan_ids(engine.tokenizer), read_plans(engine.tokenizer, rows)
    chosen = {k: OmegaConf.to_container(cfg[k]) if OmegaConf.is_config(cfg[k]) else cfg[k]
              for k in (*OPTIONS, "backend", "ablate", "ablate_mode")}
    chosen |= {"form": decided.form, "control": decided.control,
               "keywords_forced": decided.keywords_forced}  # in force (title_plan=hints: the plan's words as hints)
    settings = {"ckpt_path": str(engine.path), **chosen, "device": str(engine.device)}
    keywords = decided.keywords  # cleaned, in the model's script: one tuple for every poem, or one each
    for i, poem in enumerate(poems):
        plan = {} if plans is None else {"plan": plans[i], "conditions": ids.read_segment(tok, rows[i].tolist())}
        tune = {"tune": decided.tunes[i]} if decided.tunes else {}
        kept = {"keywords": list(keywords[i % len(keywords)])}
        if decided.title_plan_words is not None:  # the title's plan: the words it chose, forced or as hints
            kept["title_plan_words"] = kept["keywords"]
        print(json.dumps({"poem": poem, "index": i, **plan, **settings, **tune, **kept}, ensure_ascii=False), file=out)


def list_poets(engine, out) -> list[str]:
    """Print the poets a model was trained with (`poet=`), under a header, one per line with its
    training poems; returns their names. raises ValueError for a model without them."""
    poets = known_poets(engine)
    if not poets:
        raise ValueError("this model was trained without poets (data.conditions): it has none to list")
    print("poet\ttraining poems", file=out)
    for name, n in poets.items():
        print(f"{name}\t{n}", file=out)
    return list(poets)


def list_tunes(out) -> list[str]:
    """Print the tunes `tune=` takes, under a header, one per line: its templates and its commonest
    shape, `|` at the stanza break (docs/tunes.md has them all), commonest tune first; returns their names."""
    print("tune\ttemplates\tcommonest shape", file=out)
    for name, variants in tunes().items():
        print(f"{name}\t{len(variants)}\t{variants[0].layout()}", file=out)
    return list(tunes())


@hydra.main(version_base="1.3", config_path="conf", config_name="sample")
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    sample(cfg)


if __name__ == "__main__":
    sys.argv = quote_non_ascii_overrides(sys.argv)
    main()
