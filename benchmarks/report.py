"""The generated blocks (between `<!-- report:NAME -->` and `<!-- /report:NAME -->`) of docs/results.md,
README.md and docs/studio.md, from `benchmarks/results/*.json`; the text around the blocks is the pages' own.

    python -m benchmarks.report           # rewrite the blocks
    python -m benchmarks.report --check   # exit 1 for a page that differs from the JSON, a result without its
                                          # machine or far from the default run's step, or a result of the
                                          # default run measured on another behaviour
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from attention_maps import format_table as heads_table
from benchmarks.attention import tables as attention_tables
from benchmarks.ddp_step import table as ddp_table
from benchmarks.markdown import n, table
from data.verse.plan import poem_rhyme_groups
from model.inspection.ci_metrics import format_ci_table
from model.inspection.head_effects import format_effects
from model.inspection.poem_metrics import format_placement, format_table
from model.inspection.rhyme_heads import finding, format_study
from model.training.fingerprint import differences, fingerprint

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGES = {"results": ROOT / "docs" / "results.md", "readme": ROOT / "README.md", "studio": ROOT / "docs" / "studio.md"}
PENDING_RUN = ("python benchmarks/fixed_time.py  # the default run, checkpoints/bench-fixed-time-default, beside nanoGPT\n"
               "python evaluate.py ckpt_path=checkpoints/bench-fixed-time-default out_dir=logs/evaluate/default\n"
               "python attention_maps.py ckpt_path=checkpoints/bench-fixed-time-default "
               "out_dir=logs/attention_maps/default\n"
               "cp logs/evaluate/default/evaluate.json benchmarks/results/evaluate-default-cpu.json\n"
               "cp logs/attention_maps/default/attention_maps.json benchmarks/results/attention-maps-default-cpu.json\n"
               "cp logs/attention_maps/default/layer2.png docs/attention-maps-default-run-layer2.png\n"
               "python benchmarks/conditions.py  # titles, poets, keyword hints\n"
               "python -m benchmarks.report")
"""How every result that describes the default run is made, from one run."""


DESCRIBE_DEFAULT = ("fixed-time-cpu", "evaluate-default-cpu", "attention-maps-default-cpu", "conditions-cpu")
"""The results that describe the default run: fixed-time's records the run's behaviour (`fingerprint`)
and its checkpoint's `weights_sha`; the others the `weights_sha` of the checkpoint they measured."""


def default_fingerprint() -> dict:
    """`model.training.fingerprint.fingerprint` of the default `python train.py` config (the
    checkout's conf/train.yaml, no overrides)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return fingerprint(compose("train", [f"paths.root_dir={ROOT}"]))


def outdated(res: dict, today: dict) -> list[str]:
    """The results of DESCRIBE_DEFAULT that do not describe today's default: the default run's
    fingerprint differs from `today` (`default_fingerprint`; the parts named), or another result
    measured other weights than that run's checkpoint."""
    if "fixed-time-cpu" not in res:
        return []
    run = res["fixed-time-cpu"]["runs"]["default"]
    parts = differences(run.get("fingerprint"), today)
    old = [f"fixed-time-cpu.json (trains otherwise: {', '.join(parts)})"] if parts else []
    return old + [f"{name}.json (other weights than the default run's)" for name in DESCRIBE_DEFAULT[1:]
                  if name in res and (old or res[name].get("weights_sha") != run.get("weights_sha"))]


def machine_of(r) -> str | None:
    """The machine a result file records (`machine`, or `meta.machine`)."""
    return (r.get("machine") or (r.get("meta") or {}).get("machine")) if isinstance(r, dict) else None


def unrecorded_machines(res: dict) -> list[str]:
    return [f"{name}.json" for name, r in res.items() if not machine_of(r)]


MFU_LIMIT = 2.0
"""How many times the default run's step time (`fixed-time-cpu.json`) the CPU throughput figure may be
before `--check` calls it measured beside other work (the first one was 160×)."""


def step_ratio(res: dict) -> float:
    """The CPU throughput figure's step time over the default run's (wall-clock ÷ steps)."""
    d = res["fixed-time-cpu"]["runs"]["default"]
    return res["mfu-cpu"]["ms_per_step"] / (1000 * d["wall_seconds"] / d["steps"])


def implausible(res: dict) -> list[str]:
    """The CPU step-time figures that disagree with the default run's by more than MFU_LIMIT times, either way."""
    if "mfu-cpu" not in res or "fixed-time-cpu" not in res:
        return []
    return [] if 1 / MFU_LIMIT <= (ratio := step_ratio(res)) <= MFU_LIMIT else [
        f"mfu-cpu.json ({ratio:.1f}× the default run's step time; re-run `python benchmarks/mfu.py --model tiny "
        f"--device cpu --batch 32` on a quiet machine)"]


def load(results_dir: Path = RESULTS) -> dict[str, dict]:
    """{file stem: parsed JSON} of every `*.json` in results_dir."""
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(results_dir.glob("*.json"))}


def machine_line(name: str, machine: str | None) -> str:
    return f"Machine: {machine or 'not recorded in the file'} (`benchmarks/results/{name}.json`)."


def fixed_time_rows(runs: dict) -> list[list[str]]:
    return [["default, `python train.py`" if name == "default" else name, n(r.get("steps", r.get("iterations"))),
             n(r.get("wall_seconds", r.get("train_seconds")), 1), n(r["tokens_per_sec"]),
             *(cell for p in ("poems", "blocks") for cell in (n(r[p]["val_loss"], 3), bpc_cell(r[p])))]
            for name, r in runs.items()]


def bpc_cell(score: dict) -> str:
    """A score's `val_bpc` and, where recorded, its 95 % interval over the held-out windows."""
    low_high = score.get("bpc_interval_95")
    return n(score["val_bpc"], 3) + (f" ({n(low_high[0], 3)}–{n(low_high[1], 3)})" if low_high else "")


FIXED_TIME_HEADER = ["run", "steps", "wall-clock s", "tokens/s", "`poems` val/loss", "`poems` val/bpc (95 %)",
                     "`blocks` val/loss", "`blocks` val/bpc (95 %)"]


def block(res: dict, name: str, header: list[str], rows: list[list[str]], *text: str) -> str:
    """A block of docs/results.md: the machine `name`'s file records, a table, then the sentences `text`."""
    return "\n\n".join([machine_line(name, machine_of(res[name])), table(header, rows), *text])


def kept_reference(ft: dict) -> str:
    """The sentence that says nanoGPT's rows were kept from another run (`--keep-reference`): their
    budgets are that day's, not k× this default's wall-clock; "" when they were trained beside it."""
    if ft.get("reference_commit", ft["commit"]) == ft["commit"]:
        return ""
    return (f"**nanoGPT's rows are kept from commit {ft['reference_commit'][:7]}** (`--keep-reference`): their budgets "
            "are k× that run's default, not this one's; a quick look, not a comparison (docs/benchmarks.md). ")


def fixed_time(res: dict) -> str:
    runs = res["fixed-time-cpu"]["runs"]
    d, refs = runs["default"], [r for k, r in runs.items() if k.startswith("nanoGPT")]
    return block(res, "fixed-time-cpu", FIXED_TIME_HEADER, fixed_time_rows(runs), kept_reference(res["fixed-time-cpu"]) +
                 f"The default run: `val/bpc` **{n(d['poems']['val_bpc'], 2)}**, {n(d['wall_seconds'] / 60, 1)} "
                 f"minutes from start to exit, peak memory {n(d['peak_rss_mib'])} MiB. Its `val/bpc` minus nanoGPT's "
                 "configuration's: "
                 + "; ".join(f"at {k}× the time " + ", ".join(f"{d[p]['val_bpc'] - r[p]['val_bpc']:+.2f} (`{p}`)"
                                                               for p in ("poems", "blocks"))
                             for k, r in enumerate(refs, 1)) + ".")


def reference(res: dict) -> str:
    ref = res["fixed-time-reference-cpu"]
    return "\n\n".join([machine_line("fixed-time-reference-cpu", machine_of(ref)), "`blocks` `val/loss` after "
                         + "; after ".join(
        f"{n(int(it))} iterations: {r['blocks']['val_loss']:.3f} here, {r['nanogpt_val_loss']:.3f} nanoGPT's "
        f"({r['difference']:+.3f}, {'' if r['faithful'] else 'not '}faithful)" for it, r in ref["reference"].items()) + "."])


def overhead(res: dict) -> str:
    o = res["lightning-overhead-cpu"]
    r = o["lightning_overhead"]
    runs = {loop: (r[k + "_ms"], ", ".join(f"{x:.1f}" for x in r[k + "_runs_ms"]))
            for loop, k in (("bare PyTorch", "bare"), ("Lightning", "lightning"))}
    return "\n\n".join([machine_line("lightning-overhead-cpu", machine_of(o)), f"Median ms per step over {n(r['steps'])} "
                         "steps: " + ", ".join(f"{loop} {ms:.1f} (runs {each})" for loop, (ms, each) in runs.items())
                         + f"; overhead **{r['overhead']:+.1%}**."])


def ddp_step(res: dict) -> str:
    return "\n\n".join([machine_line("ddp-step-cpu", machine_of(res["ddp-step-cpu"])), ddp_table(res["ddp-step-cpu"])])


def attention(res: dict, device: str = "cpu") -> str:
    a = res[f"attention-{device}"]
    return "\n\n".join([machine_line(f"attention-{device}", machine_of(a)), attention_tables(a)])


TURNS = ("each tokens/s is over its median time, the ratio the median of the turns' own ratios, each turn timing "
         "the two back to back, so it need not be the quotient of the two columns")


def sampling(res: dict, device: str = "cpu") -> str:
    s = res[f"sampling-{device}"]
    keywords = [[f"`{r['set']}`", n(r["batch"]), n(r["tokens_per_sec"]), n(r["keywords_tokens_per_sec"]),
                 f"{r['ratio']:.2f}×"] for r in s.get("keyword_rows", [])]
    tunes = [[r["tune"], n(r["batch"]), n(r["tokens"]), n(r["free_tokens_per_sec"]), n(r["tune_tokens_per_sec"]),
              f"{r['ratio']:.2f}×"] for r in s.get("tune_rows", [])]
    return block(res, f"sampling-{device}", ["model", "batch", "new tokens", "no cache, tokens/s", "KV cache, tokens/s",
                                             "ratio"],
                 [[f"`{r['model']}`", n(r["batch"]), n(r["new_tokens"]), n(r["no_cache_tokens_per_sec"]),
                   n(r["cache_tokens_per_sec"]), f"{r['ratio']:.1f}×"] for r in s["rows"]],
                 *([f"With `keywords=[{','.join(s['keywords'])}]` (`tiny`, KV cache, alternated; {TURNS}):",
                    table(["set", "batch", "tokens/s", "+ keywords, tokens/s", "ratio"], keywords)] if keywords else []),
                 *([f"To a tune with every mask (`tune=… {s['tune_rows'][0].get('masks', 'rhyme=true meter=true')}`) "
                    f"against free sampling of as many tokens (`tiny`, KV cache, alternated; {TURNS}):",
                    table(["tune", "batch", "tokens", "free, tokens/s", "tune, tokens/s", "ratio"], tunes)]
                   if tunes else []))


def mfu(res: dict, device: str = "cpu") -> str:
    f = res[f"mfu-{device}"]
    text = [f"`python benchmarks/mfu.py --model {f['model']} --device {f['device']} --batch {f['batch']}`" + (
        f"; {step_ratio(res):.2f}× the default run's step time (`--check` fails beyond {MFU_LIMIT:g}× either way)"
        if device == "cpu" else "") + "."]
    return block(res, f"mfu-{device}", ["model", "batch", "block", "ms per step", "tokens/s", "FLOP per token",
                                        "achieved TFLOP/s", "MFU"],
                 [[f"`{f['model']}`", n(f["batch"]), n(f["block_size"]), n(f["ms_per_step"], 1), n(f["tokens_per_sec"]),
                   n(f["flops_per_token"]), f"{f['achieved_tflops']:g}", "–" if f["mfu"] is None else f"{f['mfu']:.1%}"]],
                 *text)


def fenced(text: str) -> str:
    return f"```text\n{text}\n```"


def evaluation(res: dict) -> str:
    """evaluate.py's table (its own `format_table`), and the first free poems with their rhyme."""
    if (e := res.get("evaluate-default-cpu")) is None:
        return f"Pending: `benchmarks/results/evaluate-default-cpu.json`, made by\n\n```bash\n{PENDING_RUN}\n```"
    val = ", ".join(f"`{k}` {v:.4f}" for k, v in e.get("val", {}).items() if k != "step")
    return "\n\n".join([
        f"{e['settings']['num_samples']} poems per sample set, {e['settings']['reference']} held-out human poems "
        f"(`reference`); {val or 'no validation pass'}; {n(sum(e['seconds'].values()))} s in all.",
        machine_line("evaluate-default-cpu", e.get("machine", f"device {e['device']}")),
        fenced(format_table(e["rows"])), *filter(None, [free_samples(e)]),
        *([f"Where keywords stand:\n\n{fenced(format_placement(e['keywords']['placement']))}"] if "keywords" in e else []),
        *([f"词 to a tune (the human row: {e['ci_rows']['human (held-out)']['n']} held-out 词 of the tunes with templates, "
           f"all there are up to `reference`; "
           f"[evaluation](evaluation.md#词-sets)):\n\n{fenced(format_ci_table(e['ci_rows']))}"] if "ci_rows" in e else [])])


def free_samples(e: dict, k: int = 5) -> str:
    """The first k free poems of the evaluation, each with the 平水韵 group its even lines share, or "no rhyme"."""
    script = e.get("settings", {}).get("script", "simplified")
    return "\n".join(f"{i}. {p} — {'/'.join(sorted(g)) if (g := poem_rhyme_groups(p, script)) else 'no rhyme'}"
                     for i, p in enumerate(e.get("poems", {}).get("free", [])[:k], 1))


def attention_maps(res: dict) -> str:
    """attention_maps.py's own tables (`main`'s console output): the heads' statistics beside the baselines, each
    head switched off alone, and the rhyme study with its verdicts."""
    if (a := res.get("attention-maps-default-cpu")) is None:
        return f"Pending: `benchmarks/results/attention-maps-default-cpu.json`, made by\n\n```bash\n{PENDING_RUN}\n```"
    parts = [machine_line("attention-maps-default-cpu", a.get("machine", "the CPU (attention_maps.py runs there)"))]
    for title, r in ((f"{(a['heldout'] or {}).get('poems')} held-out poems", a["heldout"]),
                     (f"the probe line 「{a['text']}」", a["probe"])):
        if r:
            parts += [f"### On {title}", fenced(heads_table(title, r))]
    if e := a.get("head_effects"):
        parts += ["### Each head switched off alone", f"Δ nats per predicted token on {n(e['poems'])} held-out poems:",
                  fenced(format_effects(e))]
        if study := e.get("rhyme"):
            parts += ["### Is a head that looks at the rhyme a rhyme head?",
                      f"The heads flagged high on `prev_line_rhyme`: {', '.join(study['looking']) or 'none'}. Heads "
                      "switched off together, Δ nats per target; free poems with the heads off; the verdicts:",
                      fenced(format_study(study, e["kinds"]))]
    return "\n\n".join(parts)


def ablation(res: dict) -> str:
    a = res["ablation-cpu"]
    return block(res, "ablation-cpu", ["heads off", "heads", "median ms", "ratio"],
                 [[r["ablated"], n(r["heads"]), n(r["median_ms"], 2), f"{r['ratio']:.3f}×"] for r in a["rows"]],
                 f"{n(a['batch'])} windows of {n(a['block_size'])} tokens, {n(a['rounds'])} rounds.")


def gpu_run(res: dict) -> str:
    """The short `experiment=small_gpu` run scripts/gpu_check.sh makes, once it has."""
    if (r := res.get(name := "run-small-gpu-tang-song-cuda")) is None:
        return f"Not yet measured on a GPU (`{name}.json`)."
    return block(res, name, ["overrides", "steps", "wall-clock s", "tokens/s", "Tang `val/bpc`", "Song `val/bpc`"],
                 [[" ".join(f"`{o}`" for o in r["overrides"]), n(r["steps"]), n(r["wall_seconds"], 1),
                   "–" if r["tokens_per_sec"] is None else n(r["tokens_per_sec"]),
                   *(f"{r[k]:.3f}" if k in r else "–" for k in ("val/bpc", "val/song/bpc"))]])


def per_device(show):
    """A block of `show(res, device)` for the CPU and, once scripts/gpu_check.sh has written its file, the GPU."""
    return lambda res: "\n\n".join(show(res, d) for d in ("cpu", "cuda") if f"{show.__name__}-{d}" in res)


def conditions(res: dict) -> str:
    c = res["conditions-cpu"]
    rel, kw, p, pr = c["relevance"], c["keyword_hints"], c["poet"], c["probe_with_title"]
    rows = [[f"`{k}`{label}", n(d["untitled_bpc"], 4), n(d["titled_bpc"], 4), f"{d['difference']:+.4f}",
             f"{d['interval_95'][0]:+.4f} to {d['interval_95'][1]:+.4f}"]
            for k, r in c["title_bpc"].items()
            for label, d in [(f", all {n(r['poems'])}", r)]
            + ([(f", the {n(r['titled_poems'])} given one", r["titled_only"])] if "titled_only" in r else [])]
    return block(
        res, "conditions-cpu", ["protocol, held-out poems", "val/bpc, no title", "given the true title", "difference",
                                "95 % interval"],
        rows, relevance_text(rel), *topic_text(c.get("topic_relevance")),
        f"Keyword hints (`keywords_forced=false`, {kw['poems']} poems, two TextRank keywords of a held-out poem each): "
        f"every keyword in {kw['hints']['all']:.1%} of the poems, each keyword {kw['hints']['each']:.1%}; without the "
        f"hints {kw['chance']['all']:.1%} / {kw['chance']['each']:.1%} (chance).",
        f"Poets ({p['poets']}, {p['samples_per_poet']} poems each): the classifier attributes {p['attributed']:.1%} of "
        f"`poet=X` poems to X, {p['ceiling']:.1%} of X's held-out poems (the ceiling), {p['chance']:.1%} of poems "
        f"without a poet (chance): {p['ratio_to_ceiling']:.2f} of the ceiling.",
        f"The probe 「{pr['probe']}」 after `<题>{pr['title']}`: per layer, the share of its characters' attention on "
        "the title, and how far their attention over the probe moves (total variation): "
        + "; ".join(f"L{i} {r['to_title']:.1%}, {r['moved']:.3f}" for i, r in enumerate(pr["layers"])) + ".")


def topic_text(topic: dict | None) -> list[str]:
    """The relevance without the title's echo (`conditions.topic_relevance`): a sentence and a table per form and
    plan (its relevance, with its words taken out too, regular form, rhyme, distinct-2)."""
    if not topic:
        return []
    labels = {"plan": "`title_plan=true`", "no_lean": "the same, `topic_lean=0`", "echo": "`title_plan=echo`",
              "hints": "`title_plan=hints`", "line": "a word a line", "title_alone": "title alone", "untitled": "untitled"}
    rows = [[f"`{form}`", label, f"{r[name]:.3f}", *(f"{r[f'{name}_without_its_words{k}']:.3f}"
                                                     if f"{name}_without_its_words{k}" in r else "–"
                                                     for k in ("", "_other_title")),
             *(f"{r['metrics'][name][k]:.1%}" for k in ("regulated", "rhyme_regulated", "distinct_2"))]
            for form, r in topic["forms"].items() for name, label in labels.items() if name in r]
    halfway = ", ".join(f"`{form}` {r['halfway']:.2f}" for form, r in topic["forms"].items())
    return [f"Relevance without the title's echo ({topic['titles']} held-out titles; the title's characters taken out "
            "of the poem, which is compared with the poems of the training titles nearest it): the real poems "
            f"{topic['real_poems']:.3f}, chance (the real poems against another title) {topic['chance']:.3f}; the "
            f"plan's share of the way from chance to the real poems: {halfway}.",
            table(["form", "poems", "relevance", "its words taken out too", "the same, another title's topic",
                   "regular form", "rhyme", "distinct-2"], rows)]


def relevance_text(rel: dict) -> str:
    """The relevance sentences: the plan, the title alone, untitled, chance and the ceiling, and the plan's cost."""
    text = (f"Relevance to the title (TF-IDF character cosine, {rel['titles']} held-out titles): poems sampled for "
            f"it with the title alone (`title_plan=false`) {rel['given']:.3f}; the same poems against another title "
            f"{rel['chance_other_title']:.3f} (chance); untitled poems {rel['untitled_samples']:.3f}; the real poems "
            f"{rel['real_poems']:.3f} (ceiling).")
    if "plan" not in rel:
        return text
    m = rel["metrics"]
    return text + (
        f" **With the title's plan** (`title_plan=true`, the default: {rel['planned']} of the {rel['titles']} titles "
        f"planned words): **{rel['plan']:.3f}**, {rel['plan_without_its_characters']:.3f} with the planned words' "
        f"characters left out of the poems, {rel['plan_chance_other_title']:.3f} against another title. Beside the "
        "title alone: " + ", ".join(f"{label} {m['plan'][k]:.1%} (alone {m['title_alone'][k]:.1%})" for label, k in
                                   (("regular form", "regulated"), ("rhyme", "rhyme_regulated"),
                                    ("distinct-2", "distinct_2"))) + ".")


FINETUNE_HEADER = ["poet", "attributed", "copy", "poet's own copy", "own, whole corpus", "val/bpc before",
                   "after", "free rhyme before", "after", "minutes"]


def finetune(res: dict) -> str:
    f = res["conditions-cpu"].get("finetune")
    if not f:
        return "(pending: `python benchmarks/conditions.py --parts finetune`)"
    rows = [[r["poet"], f"{r['attributed']:.1%}", f"{r['copy']:.2%}", f"{r['poet_own_copy']:.2%}",
             f"{r['poet_own_copy_corpus']:.2%}", n(r["val_bpc_before"], 3), n(r["val_bpc_after"], 3),
             f"{r['rhyme_before']:.1%}", f"{r['rhyme_after']:.1%}", n(r["minutes"], 2)] for r in f["poets"]]
    first, p = f["poets"][0], res["conditions-cpu"]["poet"]
    return block(res, "conditions-cpu", FINETUNE_HEADER, rows,
                 f"Each poet: `python train.py experiment=finetune init_from=<the default run> data.poets=[X]`, then "
                 f"{f['poems']} free poems. Attributed: the share the poet classifier gives X (ceiling "
                 f"{p['ceiling']:.1%} on the poets' own held-out poems, chance {p['chance']:.1%}); copy: 5-character "
                 "runs found in X's training lines, beside X's own held-out poems against the same lines and "
                 "against the whole training corpus; free rhyme: "
                 "`rhyme_regulated` of the base's free poems and of the fine-tuned model's. " + first["poet"] + ":",
                 "```\n" + "\n".join(first["examples"][:2]) + "\n```")


RESULTS_BLOCKS = {"fixed-time": fixed_time, "reference": reference, "overhead": overhead, "ddp-step": ddp_step,
                  "attention": per_device(attention), "sampling": per_device(sampling), "mfu": per_device(mfu),
                  "poems": evaluation, "heads": attention_maps, "ablation": ablation, "gpu-run": gpu_run,
                  "conditions": conditions, "finetune": finetune}
"""docs/results.md's blocks, each written by its function from the results."""


def readme_blocks(res: dict) -> dict[str, str]:
    """The README's generated blocks: the quick start's figures, the figure's caption and the headline table."""
    ft = res["fixed-time-cpu"]
    d = ft["runs"]["default"]
    return {
        "train": (f"{n(d['steps'])} steps, about {round(d['wall_seconds'] / 60)} minutes on {ft['machine']}, ending "
                  f"at `val/bpc` ≈ {n(d['poems']['val_bpc'], 1)} (bits per held-out character; "
                  "[results](docs/results.md#the-default-run))."),
        "sample": readme_sample(res.get("evaluate-default-cpu", {})),
        "voice": readme_voice(res.get("conditions-cpu", {})),
        "caption": readme_caption(res.get("attention-maps-default-cpu", {})),
        "headline": "\n\n".join([table(FIXED_TIME_HEADER, fixed_time_rows(ft["runs"])),
                                 kept_reference(ft) + f"{ft['machine']}; `python benchmarks/fixed_time.py`, "
                                 "[more results](docs/results.md)."]),
    }


def readme_caption(a: dict) -> str:
    """The README figure's caption: the attention maps' rhyme study in two sentences (`rhyme_heads.finding`)."""
    if not (found := finding((a.get("head_effects") or {}).get("rhyme") or {})):
        return "*(pending: `benchmarks/results/attention-maps-default-cpu.json` with its rhyme study)*"
    last = len(a.get("figures") or [None] * 4) - 1  # the README shows the last layer's figure
    return (f"*Layer {last} (the last) of the default run on 「{a['text']}」 (trained heads, the same heads at "
            "initialisation, the "
            f"lesson's random maps): {found[0].lower() + found[1:-1]} ([every verdict](docs/results.md#is-a-head-that-"
            "looks-at-the-rhyme-a-rhyme-head); [reading the figure](docs/attention-maps.md)).*")


def readme_sample(e: dict) -> str:
    """The evaluation's first free poem of a regular form, a couplet per line, with its rhyme group."""
    for poem in e.get("poems", {}).get("free", []):
        couplets = [c + "。" for c in poem.split("。") if c]
        if len(couplets) in (2, 4) and "".join(couplets) == poem:
            groups = poem_rhyme_groups(poem, e.get("settings", {}).get("script", "simplified"))
            return "```\n" + "\n".join(couplets) + "\n```\n\n" + (
                f"(even lines in {'/'.join(sorted(groups))}; [more](docs/results.md#the-default-runs-poems))"
                if groups else "(no rhyme; [more](docs/results.md#the-default-runs-poems))")
    return "(pending: `benchmarks/results/evaluate-default-cpu.json`)"


def readme_voice(c: dict) -> str:
    """The quick start's plan (a held-out title, the words it planned, the first poem of at most four couplets) and a
    fine-tuned poet's poem."""
    rel, ft, topic = c.get("relevance", {}), c.get("finetune", {}), c.get("topic_relevance", {})
    if "plan" not in rel or not ft or not topic:
        return "(pending: `python benchmarks/conditions.py`)"
    free = topic["forms"]["free"]
    ex = next((e for e in rel["examples"] if e["poem"].count("。") <= 4), rel["examples"][0])
    poet = ft["poets"][0]
    return (f"`title={ex['title']}` planned {'、'.join(ex['words'])}:\n\n```\n" + as_couplets(ex["poem"]) + "\n```\n\n"
            f"Fine-tuned on {poet['poet']} ({n(poet['minutes'], 1)} minutes), free:\n\n```\n"
            + as_couplets(poet["examples"][0]) + f"\n```\n\n(the poet classifier attributes {poet['attributed']:.0%} of "
            f"its poems to {poet['poet']}; relevance to the title's topic, its own characters taken out, "
            f"{free['plan']:.3f} with the plan, {free['title_alone']:.3f} with the title alone, "
            f"{topic['real_poems']:.3f} for the real poems, {topic['chance']:.3f} by chance: "
            "[results](docs/results.md#titles-poets-and-keyword-hints))")


def as_couplets(poem: str) -> str:
    """A poem one couplet a line (each ending in 。)."""
    return "\n".join(c + "。" for c in poem.split("。") if c)


def studio_blocks(res: dict) -> dict[str, str]:
    """docs/studio.md's generated block: the measured latency, speed and sizes, by option set."""
    s = res["studio-cpu"]
    m = s["model"]
    return {"studio": block(
        res, "studio-cpu", ["options", "poems", "first character, server ms", "client ms", "slowest, server ms",
                            "characters/s", "characters"],
        [[r["options"], n(r["poems"]), n(r["first_ms"]), n(r["client_first_ms"]), n(r["max_first_ms"]),
          n(r["chars_per_s"]), n(r["chars"])] for r in s["rows"]],
        f"`{s['ckpt']}`: {n(s['ckpt_step'])} training steps, n_layer {m['n_layer']}, n_head {m['n_head']}, n_embd "
        f"{m['n_embd']}. The first poem after start (a 七律 with meter) had its first character after "
        f"{n(s['cold_first_ms'])} ms. The page is {n(s['page_bytes'])} bytes as served (`studio.html` "
        f"{n(s['template_bytes'])}); " + ", ".join(f"`{p}` {n(k)} lines" for p, k in s["lines"].items()) + ".")}


def fill_blocks(text: str, blocks: dict[str, str], page: str = "README.md") -> str:
    """Each block's text between `<!-- report:NAME -->` and `<!-- /report:NAME -->`; raises ValueError naming a
    block whose markers are missing."""
    for name, body in blocks.items():
        pattern = re.compile(rf"(<!-- report:{name} -->\n).*?(\n<!-- /report:{name} -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"{page} has no block <!-- report:{name} --> … <!-- /report:{name} -->")
        text = pattern.sub(lambda m: m.group(1) + body + m.group(2), text)
    return text


def expected(results_dir: Path = RESULTS) -> dict[Path, str]:
    """{page: the text it should have} for the JSON in results_dir."""
    res = load(results_dir)
    return {PAGES[name]: fill_blocks(PAGES[name].read_text(encoding="utf-8"), blocks(res), PAGES[name].name)
            for name, blocks in (("results", lambda r: {k: f(r) for k, f in RESULTS_BLOCKS.items()}),
                                 ("readme", readme_blocks), ("studio", studio_blocks))}


def stale(results_dir: Path = RESULTS) -> list[Path]:
    """The pages whose text differs from what results_dir's JSON gives."""
    return [p for p, text in expected(results_dir).items() if p.read_text(encoding="utf-8") != text]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page differs from the JSON")
    p.add_argument("--results", type=Path, default=RESULTS, help="the folder of result JSON (default: %(default)s)")
    args = p.parse_args(argv)
    if args.check:
        res = load(args.results)
        errors = [([str(p.relative_to(ROOT)) for p in stale(args.results)],
                   "out of date with the JSON: {}; run `python -m benchmarks.report`"),
                  (unrecorded_machines(res), "no machine recorded in {}: re-run the benchmark that wrote it "
                                             "(docs/benchmarks.md)"),
                  (implausible(res), "measured beside other work? {}"),
                  (outdated(res, default_fingerprint()),
                   "measured on another default than today's behaviour: {}; re-run them:\n" + PENDING_RUN)]
        for found, message in errors:
            if found:
                print("error: " + message.format(", ".join(found)), file=sys.stderr)
        return int(any(found for found, _ in errors))
    for page, text in expected(args.results).items():
        page.write_text(text, encoding="utf-8")
        print(f"wrote {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
