"""Every command in docs/benchmarks.md's table runs on today's code (issue 37, item 5): each at its smallest
settings, on a tiny corpus where it reads one, its JSON written under tmp_path, never into benchmarks/results.
A renamed setting (`attention` → `backend` broke `benchmarks/attention.py` unnoticed) fails here."""
import json
import re
import subprocess
import sys

import pytest

from benchmarks import fixed_time, mfu
from tests.conftest import POEMS, ROOT, write_corpus

SMALL = {
    "python benchmarks/fixed_time.py": [],
    "python benchmarks/fixed_time.py --check-reference": ["--check-reference", "2"],
    "python benchmarks/fixed_time.py --keep-reference": ["--keep-reference"],
    "python benchmarks/fixed_time.py --quick --variant NAME=OVERRIDES …": [
        "--quick", "--seconds", "3", "--no-reference", "--variant", "wd0=model.optim.weight_decay=0"],
    "python benchmarks/fixed_time.py --overhead 300": ["--overhead", "22"],
    "python benchmarks/ddp_step.py": ["--batch", "2", "--steps", "1", "--warmup", "0", "--rounds", "1"],
    "python benchmarks/attention.py": ["--seq-lens", "16", "--dropouts", "0", "0.1", "--repeats", "1", "--no-memory",
                                       "--models", "tiny"],
    "python benchmarks/sampling.py": ["--models", "tiny", "--batches", "1", "--repeats", "1", "--keyword-batches", "1"],
    "python benchmarks/ablation.py": ["--batch", "2", "--rounds", "1"],
    "python benchmarks/tokenizers.py": ["--minutes", "0", "--encodings"],
    "python benchmarks/mfu.py": ["--model", "tiny", "--device", "cpu", "--batch", "2", "--steps", "2", "--warmup", "1"],
    "python benchmarks/conditions.py": ["--per-poet", "1", "--titles", "2", "--topic-titles", "2", "--keyword-poems", "2"],
}
"""Each documented command → the arguments that make it smallest."""


def documented() -> list[str]:
    return re.findall(r"^\| `(python benchmarks/[^`]+)` \|", (ROOT / "docs" / "benchmarks.md").read_text(), re.M)


def test_every_documented_command_is_run_here():
    assert len(documented()) == 12 and set(documented()) == set(SMALL)


@pytest.fixture
def tiny(tmp_path):
    """A tiny corpus, and the train.py overrides of a tiny model on it writing under tmp_path."""
    corpus = write_corpus(tmp_path / "corpus" / "tang.jsonl.xz")
    return corpus, [f"data.corpus_path={corpus}", f"data.cache_dir={tmp_path / 'cache'}",
                    f"paths.checkpoint_dir={tmp_path / 'checkpoints'}", f"paths.log_dir={tmp_path / 'logs'}",
                    "trainer=cpu", "model.n_layer=1", "model.n_head=2", "model.n_embd=16", "model.block_size=16",
                    "data.batch_size=2", "model.optim.warmup_steps=1", "trainer.max_steps=4",
                    "trainer.val_check_interval=2", "trainer.num_sanity_val_steps=0", "trainer.enable_progress_bar=false",
                    "trainer.log_every_n_steps=1"]


CALLBACKS_OFF = ["~callbacks.samples", "~callbacks.attention_maps", "~callbacks.evaluation", "~callbacks.head_effects"]
"""The end-of-run and per-validation callbacks, which `--overhead` and ddp_step.py leave out on their own."""


def run(command: str, *extra: str) -> None:
    subprocess.run([sys.executable, command.split()[1], *SMALL[command], *extra], cwd=ROOT, check=True,
                   capture_output=True)


@pytest.mark.parametrize("command", [c for c in SMALL if "fixed_time" in c])
def test_fixed_time(command, tiny, tmp_path, monkeypatch):
    """In this process: the reference at nanoGPT's shape shrunk, trained 2 iterations where it would train for a
    multiple of the default's wall-clock; the default runs through train.py with the tiny overrides."""
    corpus, overrides = tiny
    monkeypatch.setattr(fixed_time, "CORPUS", corpus)
    monkeypatch.setattr(fixed_time, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(fixed_time, "NANOGPT", {**fixed_time.NANOGPT, "n_layer": 1, "n_head": 2, "n_embd": 16,
                                                "block_size": 16, "batch_size": 2, "warmup_iters": 1})
    monkeypatch.setattr(fixed_time, "NANOGPT_FIGURES", {2: 9.0})
    reference = fixed_time.nanogpt_reference
    monkeypatch.setattr(fixed_time, "nanogpt_reference", lambda max_iters=None, seconds=None: reference(max_iters=2))
    out = tmp_path / "results"
    overrides += [] if "--overhead" in command else CALLBACKS_OFF
    if "--keep-reference" in command:  # the JSON whose reference rows are kept
        out.mkdir()
        kept = {"commit": "abc", "runs": {"default": {}, "nanoGPT configuration, 1× the time": {
            "iterations": 7, "train_seconds": 5.0, "poems": {"val_bpc": 99.0, "val_loss": 9.0},
            "blocks": {"val_bpc": 99.0, "val_loss": 9.0}}}}
        (out / "fixed-time-cpu.json").write_text(json.dumps(kept))
    fixed_time.main([*SMALL[command], "--out", str(out), *(f"--override={o}" for o in overrides)])
    (written,) = out.glob("*.json")
    r = json.loads(written.read_text())
    assert r["machine"]
    if "--check-reference" in command:
        assert r["reference"]["2"]["iterations"] == 2 and r["reference"]["2"]["nanogpt_val_loss"] == 9.0
    elif "--overhead" in command:
        assert r["lightning_overhead"]["steps"] == 22 and len(r["lightning_overhead"]["lightning_runs_ms"]) == 2
    elif "--keep-reference" in command:
        assert list(r["runs"]) == ["default", "nanoGPT configuration, 1× the time"] and r["reference_commit"] == "abc"
        assert r["runs"]["nanoGPT configuration, 1× the time"]["iterations"] == 7
        assert r["runs"]["default"]["steps"] == 4 and r["runs"]["default"]["beats_1x_reference"]["poems"]
    elif "--quick" in command:
        assert written.name == "fixed-time-quick-cpu.json" and set(r["runs"]) == {"default: wd0"}
    else:
        assert list(r["runs"]) == ["default", *(f"nanoGPT configuration, {k}× the time" for k in (1, 2, 3, 4))]
        assert r["runs"]["default"]["steps"] == 4 and r["runs"]["nanoGPT configuration, 4× the time"]["iterations"] == 2


def test_mfu(tmp_path, monkeypatch):
    monkeypatch.setattr(mfu, "machine_load", lambda: 0.0)  # the test machine may be busy; the refusal: test_mfu.py
    mfu.main([*SMALL["python benchmarks/mfu.py"], "--out", str(tmp_path / "mfu.json")])
    r = json.loads((tmp_path / "mfu.json").read_text())
    assert (r["model"], r["batch"], r["mfu"]) == ("tiny", 2, None) and r["ms_per_step"] > 0


def test_attention_sampling_and_ablation(tmp_path):
    for name in ("attention", "sampling", "ablation"):
        run(f"python benchmarks/{name}.py", "--out", str(tmp_path / f"{name}.json"))
    attention = json.loads((tmp_path / "attention.json").read_text())
    assert [(row["T"], row["dropout"]) for row in attention["layer"]] == [(16, 0.0), (16, 0.1)]
    assert "unavailable" in attention["layer"][1]["flash"] and set(attention["train_step_ms"]) == {"tiny"}
    sampling = json.loads((tmp_path / "sampling.json").read_text())
    assert [(r["model"], r["batch"]) for r in sampling["rows"]] == [("tiny", 1)]
    assert [(r["tune"], r["batch"]) for r in sampling["tune_rows"]] == [("浣溪沙", 1), ("水调歌头", 1), ("沁园春", 1)]
    assert all(r["tokens"] > 40 and r["ratio"] > 0 for r in sampling["tune_rows"])
    ablation = json.loads((tmp_path / "ablation.json").read_text())
    assert ablation["batch"] == 2 and ablation["rows"][0]["ratio"] == 1.0


def test_ddp_step(tiny, tmp_path):
    _, overrides = tiny
    # no rhyme loss: every parameter takes part in every step, which the find_unused=False variant needs
    run("python benchmarks/ddp_step.py", "--out", str(tmp_path / "ddp.json"),
        *(f"--override={o}" for o in [*overrides, "model.rhyme_loss_weight=0.0"]))
    r = json.loads((tmp_path / "ddp.json").read_text())
    assert [row["variant"] for row in r["rows"]] == ["one process", "find_unused=False", "find_unused=True",
                                                     "all in graph"]


def test_tokenizers(tiny, tmp_path):
    from data.bpe import learn_ranks, write_ranks

    corpus, _ = tiny
    ranks = write_ranks(learn_ranks(POEMS, 300), tmp_path / "tiny-bpe-300.tiktoken")
    run("python benchmarks/tokenizers.py", "--corpus", str(corpus), "--cache", str(tmp_path / "cache"),
        "--ranks", str(ranks), "--out", str(tmp_path / "tokenizers.json"))
    counts = json.loads((tmp_path / "tokenizers.json").read_text())["counts"]
    assert counts["char"]["tokens_per_char"] == 1.0 and counts[ranks.name]["tokens_per_char"] > 1.0


def test_conditions(tmp_path, monkeypatch):
    """A tiny model trained with every condition on a corpus whose one poet has enough poems, then every figure."""
    import lzma

    import train as train_script
    from benchmarks import conditions
    from data.verse.poetry import form_of
    from tests.conftest import make_train_cfg

    corpus = tmp_path / "corpus" / "tang.jsonl.xz"
    corpus.parent.mkdir()
    with lzma.open(corpus, "wt", encoding="utf-8") as f:
        for c in range(45):  # two poets, each with ≥ 100 training poems
            for i, text in enumerate(POEMS):
                f.write(json.dumps({"id": f"{c}-{i}", "title": f"靜夜思{i}", "author": "李白杜甫"[i % 2 * 2:][:2],
                                    "form": form_of(text),
                                    "split": "val" if c % 5 == 0 else "train", "text": text}, ensure_ascii=False) + "\n")
    cfg = make_train_cfg(tmp_path, corpus, monkeypatch)(
        *CALLBACKS_OFF, "logger=none", "trainer.max_steps=4", "trainer.val_check_interval=2", "model.block_size=48",
        "data.conditions.title=1.0", "data.conditions.poet=1.0", "data.conditions.keywords=0.5")
    train_script.train(cfg)
    for module in (conditions, fixed_time):
        monkeypatch.setattr(module, "CORPUS", corpus)
    monkeypatch.setattr(fixed_time, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(conditions, "NANOGPT", {**fixed_time.NANOGPT, "block_size": 16})
    conditions.main([*SMALL["python benchmarks/conditions.py"], "--ckpt", str(tmp_path / "checkpoints" / "test"),
                     "--out", str(tmp_path / "results"), "--finetune-dir", str(tmp_path), "--finetune-poets", "1",
                     "--finetune-poems", "3", *(f"--override={o}" for o in (*CALLBACKS_OFF, "logger=none",
                                                                            "trainer.max_steps=2",
                                                                            "trainer.val_check_interval=1"))])
    r = json.loads((tmp_path / "results" / "conditions-cpu.json").read_text())
    assert set(r["title_bpc"]) == {"poems", "blocks"} and r["poet"]["poets"] == 2 and r["relevance"]["titles"] == 2
    topic = r["topic_relevance"]
    assert topic["titles"] == 2 and set(topic["forms"]) == set(conditions.TOPIC_FORMS)
    assert all(0 <= row[k] <= 1 for row in topic["forms"].values() for k in ("plan", "title_alone", "untitled"))
    assert r["title_bpc"]["poems"]["interval_95"][0] <= r["title_bpc"]["poems"]["difference"]
    assert len(r["probe_with_title"]["layers"]) == cfg.model.n_layer
    tuned = r["finetune"]["poets"][0]
    assert tuned["poet"] == "李白" and 0 <= tuned["attributed"] <= 1 and tuned["val_bpc_after"] != tuned["val_bpc_before"]
    assert len(list((tmp_path / "checkpoints").glob("bench-ft-libai-*/last.ckpt"))) == 1  # a variant's own folder
