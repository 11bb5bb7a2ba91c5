"""Issue 17, item 5: the training bar counts optimizer steps against max_steps, or seconds against max_time."""
import re

import train as train_script
from tests.conftest import make_train_cfg

QUIET = ["trainer.enable_progress_bar=true", "logger=none", "~callbacks.samples", "~callbacks.attention_maps",
         "~callbacks.evaluation", "trainer.val_check_interval=15", "trainer.limit_val_batches=1"]


def training_bar(capfd, cfg) -> list[tuple[int, int]]:
    """Every `n/total` the training bar showed while `cfg` trained (validation bars left out)."""
    train_script.train(cfg)
    text = capfd.readouterr().out
    frames = [f for f in re.split(r"[\r\n]", text) if f.startswith("Epoch")]
    return [tuple(map(int, m.groups())) for f in frames if (m := re.search(r"\| (\d+)/(\d+)", f))]


def test_the_bar_counts_steps_against_max_steps_also_when_resumed(tmp_path, tiny_corpus, monkeypatch, capfd):
    first = training_bar(capfd, make_train_cfg(tmp_path / "a", tiny_corpus, monkeypatch)(*QUIET, "trainer.max_steps=30"))
    assert {total for _, total in first} == {30} and first[-1] == (30, 30)  # over epochs of 25 batches
    ckpt = tmp_path / "a" / "checkpoints" / "test"
    second = training_bar(capfd, make_train_cfg(tmp_path / "b", tiny_corpus, monkeypatch)(
        *QUIET, "trainer.max_steps=45", f"ckpt_path={ckpt}"))
    assert second[0] == (30, 45) and second[-1] == (45, 45) and {t for _, t in second} == {45}


def test_in_budget_mode_the_bar_counts_seconds_against_the_budget(tmp_path, tiny_corpus, monkeypatch, capfd):
    cfg = make_train_cfg(tmp_path, tiny_corpus, monkeypatch)(*QUIET, "trainer.max_steps=-1",
                                                             "trainer.max_time=00:00:00:04")
    train_script.train(cfg)
    frames = [f for f in re.split(r"[\r\n]", capfd.readouterr().out) if "s of the time budget" in f]
    seconds = [int(re.search(r"\| (\d+)/4 s of the time budget", f)[1]) for f in frames]
    assert seconds and seconds == sorted(seconds) and seconds[-1] >= 3
    assert re.search(r"step=\d+", frames[-1])
