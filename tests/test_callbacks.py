"""AttentionMapLogger and SampleLogger on a tiny model, without a trainer run (the end-to-end run is in test_train.py)."""
import gc
import resource
import types
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import torch
from lightning.pytorch.loggers import WandbLogger
from matplotlib.figure import Figure

from data.tokenizer import CharTokenizer
from data.verse.script import corpus_to_script
from model.sampling.poems import SamplingOptions, sample_poems
from model.training.callbacks import AttentionMapLogger, SampleLogger
from model.training.lit import LitGPT
from tests.conftest import POEMS, generate
from tests.html_views import embedded_data
from tests.wandb_records import history


def tiny_lit(n_layer=1, n_head=2, block_size=16) -> LitGPT:
    tok = CharTokenizer.from_texts(corpus_to_script(POEMS, "simplified"))
    return LitGPT(model=dict(block_size=block_size, n_layer=n_layer, n_head=n_head, n_embd=16, dropout=0.0,
                             backend="sdpa"), optim={}, tokenizer=tok.state_dict())


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()


@pytest.mark.parametrize("n_logs", [10, pytest.param(100, marks=pytest.mark.slow)])
def test_memory_stays_flat_and_no_figure_stays_open(tmp_path, n_logs):
    """Each log draws and frees its figures. The 100-log run (`-m slow`) also bounds the RSS
    growth after warm-up (matplotlib's caches and the allocator settle over the first half):
    a figure kept per log would add about 1.5 MiB each, 75 MiB over the measured 50 logs;
    the bound, 30 MiB, leaves room for the allocator's noise (about 20 MiB seen here)."""
    lit = tiny_lit()
    logger = AttentionMapLogger(["床前"], n_samples=4)
    trainer = types.SimpleNamespace(default_root_dir=str(tmp_path), global_step=0, loggers=[])
    logger.setup(trainer, lit, "fit")
    rss = {}
    for step in range(n_logs):
        trainer.global_step = step
        logger.log_probes(trainer, lit)
        if step in (49, 99):
            gc.collect()
            rss[step] = rss_bytes()
    gc.collect()  # a Figure's artists hold reference cycles: freed by the collector, not at once
    assert plt.get_fignums() == []  # nothing registered with pyplot
    assert not [o for o in gc.get_objects() if type(o) is Figure]  # no figure kept alive
    assert len(list((tmp_path / "attention").glob("step*_probe0.png"))) == n_logs
    if n_logs == 100:
        assert rss[99] - rss[49] < 30 * 2**20


def test_probes_are_checked_at_setup():
    lit = tiny_lit(block_size=8)
    trainer = types.SimpleNamespace(default_root_dir=".", global_step=0, loggers=[])
    with pytest.raises(ValueError, match="block_size 8"):
        AttentionMapLogger(["床前明月光，疑是地上霜。"]).setup(trainer, lit, "fit")
    with pytest.raises(ValueError, match="ABC"):
        AttentionMapLogger(["床前ABC"]).setup(trainer, lit, "fit")
    with pytest.raises(ValueError, match="list"):
        AttentionMapLogger("床前明月光")


def test_probe_lines_with_bad_code_points_are_named():
    trainer = types.SimpleNamespace(default_root_dir=".", global_step=0, loggers=[])
    with pytest.raises(ValueError, match=r"probe_lines\[1\]: 1 code point.*U\+D800"):
        AttentionMapLogger(["床前", "明\ud800"]).setup(trainer, tiny_lit(), "fit")


class RecordingWandb(WandbLogger):
    """A WandbLogger stand-in that keeps the tables it is given (no wandb run)."""

    def __init__(self):
        self.tables = []

    def log_text(self, key, columns, data, step):
        self.tables.append((key, columns, [list(row) for row in data], step))


def test_sample_table_poems_keep_the_poem_rules():
    """A model that would end every poem at once, and otherwise write ， after ，: the callback's
    poems (through `sample_poems`, like sample.py) still never start with a mark, never put
    two marks together and never end after ，. Through the bare engine they were empty."""
    lit = tiny_lit()
    tok = lit.tokenizer
    scores = torch.zeros(tok.vocab_size)
    scores[[tok.eos_id, tok.stoi["，"], tok.stoi["。"], tok.stoi["月"]]] = torch.tensor([100.0, 90.0, 80.0, 10.0])
    lit.gpt.forward = lambda idx, cache=None: scores.expand(idx.size(0), idx.size(1), -1)
    assert tok.decode(generate(lit.gpt, torch.zeros(1, 1, dtype=torch.long), 10, temperature=0.8)[0].tolist()) == ""
    logger, wandb = SampleLogger(num_samples=3, max_new_tokens=10), RecordingWandb()
    trainer = types.SimpleNamespace(sanity_checking=False, loggers=[wandb], global_step=7)
    logger.on_validation_end(trainer, lit)
    [(key, columns, rows, step)] = wandb.tables
    assert (key, columns, step) == ("samples", ["step", "poem"], 7)
    assert rows == [[7, "月，月，月，月，月，"]] * 3  # ran to max_new_tokens: no 。 was likelier than ，
    assert logger.poems == sample_poems(lit.engine, SamplingOptions(num_samples=3, max_new_tokens=10))


def test_each_validation_logs_an_attention_view_to_wandb(tmp_path, monkeypatch):
    """`attention/view` as wandb HTML, one per log, at the log's step, read back from the offline
    run: the page as written under the run folder, passed through unchanged (inject=False: no
    stylesheet), holding every probe. The logger starts at step 60, as in a run resumed from a
    step-40 checkpoint: its views start at its own first validation."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    lit = tiny_lit(n_layer=2)
    wandb_logger = WandbLogger(project="mingyue-test", save_dir=str(tmp_path), offline=True)
    trainer = types.SimpleNamespace(default_root_dir=str(tmp_path), global_step=60, loggers=[wandb_logger])
    logger = AttentionMapLogger(["床前明月光，", "疑是地上霜。"], n_samples=4)
    logger.setup(trainer, lit, "fit")
    for step in (60, 80):
        trainer.global_step = step
        logger.log_probes(trainer, lit)
    run_dir = Path(wandb_logger.experiment.dir).parent
    wandb_logger.experiment.finish()
    all_rows = history(run_dir)
    rows = [r for r in all_rows if "attention/view" in r]
    assert [r["trainer/global_step"] for r in rows] == [60, 80], [sorted(r) for r in all_rows]
    for row, step in zip(rows, (60, 80)):
        assert row["attention/view"]["_type"] == "html-file"
        logged = (run_dir / "files" / row["attention/view"]["path"]).read_text(encoding="utf-8")
        written = (tmp_path / "attention" / f"step{step:06d}_view.html").read_text(encoding="utf-8")
        assert logged == written and "<link" not in logged  # nothing injected
        data = embedded_data(logged)
        assert data["title"] == f"attention · step {step}" and (data["n_layer"], data["n_head"]) == (2, 2)
        assert [p["tokens"][1:] for p in data["probes"]] == [list("床前明月光，"), list("疑是地上霜。")]
        assert [len(p["verdicts"][0]["heads"]) for p in data["probes"]] == [4, 4]
