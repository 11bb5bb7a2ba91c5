"""End to end on a tiny model and corpus: train.py's `train`, then sample.py's `sample`."""
import io
import json

import pytest
import torch
from omegaconf import OmegaConf

import sample as sample_script
import train as train_script
from data.poetry import form_of
from model.attention import BackendUnavailableError
from tests.conftest import make_train_cfg, write_corpus
from tests.wandb_records import history


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny training run shared by the tests of this module."""
    tmp_path = tmp_path_factory.mktemp("run")
    with pytest.MonkeyPatch.context() as mp:
        cfg = make_train_cfg(tmp_path, write_corpus(tmp_path / "corpus" / "tang.jsonl.xz"), mp)()
        metrics = train_script.train(cfg)
    return cfg, metrics, tmp_path


def test_training_lowers_the_loss_and_writes_checkpoints(trained):
    cfg, metrics, tmp_path = trained
    ckpt_dir = tmp_path / "checkpoints" / "test"
    assert (ckpt_dir / "last.ckpt").is_file()
    assert len(list(ckpt_dir.glob("best-step*.ckpt"))) == 1
    (run,) = (tmp_path / "logs" / "test" / "wandb").glob("offline-run-*")
    rows = history(run)
    val = [r["val/loss"] for r in rows if "val/loss" in r]
    assert len(val) == 2, f"{len(rows)} history rows in {run}: {sorted(p.name for p in run.iterdir())}"
    train_losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(val) == 2 and val[-1] < val[0] - 0.1
    assert train_losses[-1] < train_losses[0] - 0.5
    bpc = [r["val/bpc"] for r in rows if "val/bpc" in r]
    assert bpc[-1] > val[-1] / 0.6932  # more bits per character than per token: <eos> costs nats, not characters
    assert any("lr-AdamW" in k for r in rows for k in r)
    assert any("train/tokens_per_sec" in r and r["train/tokens_per_sec"] > 0 for r in rows)
    assert metrics["val/loss"] == pytest.approx(val[-1], rel=1e-5)


def test_wandb_offline_run_holds_attention_maps_stats_and_samples(trained):
    _, _, tmp_path = trained
    (run,) = (tmp_path / "logs" / "test" / "wandb").glob("offline-run-*")
    images = sorted((run / "files" / "media" / "images" / "attention").glob("*.png"))
    assert len(images) == 2 * 2 + 2  # two probes at two validations, and the probes' baselines once
    assert all(p.stat().st_size > 5000 for p in images)
    assert len(list((run / "files" / "media" / "table").glob("samples_*.table.json"))) == 2
    rows = history(run)
    logged = [f for r in rows if "attention/probe1" in r for f in r["attention/probe1"]["filenames"]]
    assert len(logged) == 2 and all((run / "files" / f).is_file() for f in logged)
    assert sum("attention/probe0_baselines" in r for r in rows) == 1
    tables = sorted((run / "files" / "media" / "table" / "attention").glob("stats_*.table.json"))
    assert len(tables) == 2
    table = json.loads(tables[-1].read_text())
    assert table["columns"][:5] == ["step", "probe", "layer", "head", "entropy"]
    assert len(table["data"]) == 2 * 2 * 2  # probes × layers × heads
    assert {row[1] for row in table["data"]} == {0, 1} and all(row[-1] for row in table["data"])
    scalars = [r for r in rows if "attn/L1H1/prev_token" in r]
    assert len(scalars) == 2 and all(0 <= r["attn/L1H1/prev_token"] <= 1 for r in scalars)
    seconds = [r["attn/logger_seconds"] for r in rows if "attn/logger_seconds" in r]
    assert len(seconds) == 2 and 0 < seconds[0] < seconds[1]
    files = sorted(p.name for p in (tmp_path / "logs" / "test" / "attention").glob("*.png"))
    assert files[:3] == ["baselines_probe0.png", "baselines_probe1.png", "step000020_probe0.png"]


def test_everything_logged_at_one_validation_has_its_step(trained):
    """Issue 12, item 6: val/loss was logged at global_step − 1, the images at global_step."""
    _, _, tmp_path = trained
    (run,) = (tmp_path / "logs" / "test" / "wandb").glob("offline-run-*")
    rows = history(run)
    steps = {key: [r["trainer/global_step"] for r in rows if key in r]
             for key in ("val/loss", "val/bpc", "attention/probe0", "attention/stats", "attn/L1H1/prev_token", "samples")}
    assert all(s == [20, 40] for s in steps.values()), steps
    assert [p.name[:15] for p in (tmp_path / "checkpoints" / "test").glob("best-*")] == ["best-step000040"]


def test_validation_interval_counts_optimizer_steps_under_accumulation(train_cfg, monkeypatch, caplog):
    """Issue 12, item 6: validation ran at global steps 2, 5, 7, 10 (every 5 batches)."""
    from model.training.lit import LitGPT

    validated, end = [], LitGPT.on_validation_epoch_end
    monkeypatch.setattr(LitGPT, "on_validation_epoch_end", lambda lit: (validated.append(lit.global_step), end(lit)))
    cfg = train_cfg("+trainer.accumulate_grad_batches=2", "trainer.max_steps=10", "trainer.val_check_interval=5",
                    "logger=none", "~callbacks.samples", "~callbacks.attention_maps")
    with caplog.at_level("INFO"):
        train_script.train(cfg)
    assert validated == [5, 10]
    assert "validation every 5 optimizer steps = every 10 batches (trainer.accumulate_grad_batches=2)" in caplog.text


def test_checkpoint_alone_is_enough_to_sample(trained, monkeypatch):
    cfg, _, tmp_path = trained
    ckpt = tmp_path / "checkpoints" / "test" / "last.ckpt"
    scfg = OmegaConf.load(train_script.rootutils.find_root(indicator=".project-root") / "conf" / "sample.yaml")
    scfg = OmegaConf.merge(scfg, {"ckpt_path": str(ckpt), "paths": {"checkpoint_dir": str(tmp_path / "checkpoints")},
                                  "num_samples": 3, "max_new_tokens": 30, "prompt": "舉頭"})
    del scfg["defaults"], scfg["hydra"]
    monkeypatch.setattr(train_script, "train", None)  # sampling must not need the training code path
    (tmp_path / "cache").rename(tmp_path / "cache-moved")  # nor the prepared data
    poems = sample_script.sample(scfg)
    assert len(poems) == 3 and all(p.startswith("举头") for p in poems)  # prompt converted to simplified
    assert all(p[-1] == "。" or len(p) == 2 + 30 for p in poems)  # ended after a full stop, or ran out
    assert sample_script.sample(scfg) == poems  # same seed, same poems
    scfg.backend = "naive"
    assert sample_script.sample(scfg) == poems  # another backend, the same model
    scfg.backend = None
    scfg.ckpt_path = None
    assert sample_script.sample(scfg) == poems  # default: the newest last.ckpt
    scfg.prompt = "床前ABC"
    with pytest.raises(ValueError, match="ABC"):
        sample_script.sample(scfg)


def sample_cfg(trained, **options):
    cfg, _, tmp_path = trained
    scfg = OmegaConf.load(train_script.rootutils.find_root(indicator=".project-root") / "conf" / "sample.yaml")
    del scfg["defaults"], scfg["hydra"]
    return OmegaConf.merge(scfg, {"ckpt_path": str(tmp_path / "checkpoints" / "test" / "last.ckpt"), **options})


def test_sample_script_writes_jsonl_with_the_settings(trained):
    out = io.StringIO()
    poems = sample_script.sample(sample_cfg(trained, form="wujue", num_samples=3, format="jsonl", seed=7), out)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["poem"] for r in records] == poems and [r["index"] for r in records] == [0, 1, 2]
    assert all(r["seed"] == 7 and r["form"] == "wujue" and r["top_p"] is None and r["device"] == "cpu" for r in records)
    out = io.StringIO()
    cfg = sample_cfg(trained, num_samples=1, format="jsonl", ckpt_path=None,
                     paths={"checkpoint_dir": str(trained[2] / "checkpoints")})
    sample_script.sample(cfg, out)
    assert json.loads(out.getvalue())["ckpt_path"].endswith("test/last.ckpt")  # the one used, not null
    assert all(form_of(p) == "wujue" for p in poems)  # 25 tokens > block_size 16: the cache is re-filled


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine's message")
def test_sample_on_cuda_without_a_gpu_is_a_one_line_error(trained):
    with pytest.raises(ValueError, match="no CUDA GPU"):
        sample_script.sample(sample_cfg(trained, device="cuda"))


def test_sample_script_streams_a_single_poem(trained):
    out = io.StringIO()
    [poem] = sample_script.sample(sample_cfg(trained, prompt="举头", num_samples=1, form="wujue"), out)
    assert out.getvalue() == sample_script.as_lines(poem) + "\n\n"
    assert poem.startswith("举头") and form_of(poem) == "wujue"


@pytest.mark.parametrize("backend", ["naive", "flash"])
def test_other_backends_train(train_cfg, backend):
    metrics = train_script.train(train_cfg(f"attention={backend}", "trainer.max_steps=4", "trainer.val_check_interval=4",
                                           "logger=none", "~callbacks.samples"))
    assert torch.isfinite(torch.tensor(metrics["val/loss"]))


def test_flash_with_dropout_on_cpu_stops_before_any_work(train_cfg, tmp_path):
    cfg = train_cfg("attention=flash", "model.dropout=0.1", "logger=none")
    with pytest.raises(BackendUnavailableError, match="attention=sdpa"):
        train_script.train(cfg)
    assert not (tmp_path / "cache").exists()


def test_resuming_from_another_vocabulary_is_refused(trained, train_cfg):
    ckpt = trained[2] / "checkpoints" / "test" / "last.ckpt"
    cfg = train_cfg("data.script=traditional", "logger=none", f"ckpt_path={ckpt}")
    with pytest.raises(ValueError, match="data.script: checkpoint simplified, asked traditional .*another vocabulary"):
        train_script.train(cfg)


def test_probe_line_outside_the_vocabulary_stops_before_training(train_cfg, monkeypatch):
    from model.training.lit import LitGPT

    def no_training(*args):
        raise AssertionError("a training step ran before the probe line was checked")

    monkeypatch.setattr(LitGPT, "training_step", no_training)
    cfg = train_cfg("callbacks.attention_maps.probe_lines=['床前ABC']", "logger=none", "trainer.num_sanity_val_steps=0")
    with pytest.raises(ValueError, match="ABC"):
        train_script.train(cfg)


def test_tiktoken_tokenizer_trains_and_samples(train_cfg, tmp_path):
    from data.bpe import learn_ranks, write_ranks
    from tests.conftest import POEMS

    ranks = write_ranks(learn_ranks(POEMS, 256 + 64), tmp_path / "poems.tiktoken")
    cfg = train_cfg("tokenizer=tiktoken", f"tokenizer.encoding={ranks}", "trainer.max_steps=4",
                    "trainer.val_check_interval=4", "logger=none", "~callbacks.samples",
                    "callbacks.attention_maps.probe_lines=['床前明月光']")  # BPE: 12 characters pass block 16
    metrics = train_script.train(cfg)
    assert torch.isfinite(torch.tensor(metrics["val/bpc"]))
    scfg = sample_cfg((cfg, metrics, tmp_path), prompt="舉頭", num_samples=2, max_new_tokens=20, top_k=None, seed=1)
    poems = sample_script.sample(scfg)
    assert len(poems) == 2 and all(p.startswith("举头") for p in poems)
    out = io.StringIO()
    scfg.num_samples = 1
    [poem] = sample_script.sample(scfg, out)  # streamed token by token, whole characters only
    assert out.getvalue().replace("\n", "") == poem
    scfg.form = "wujue"
    with pytest.raises(ValueError, match="character-level"):
        sample_script.sample(scfg)


def test_unreachable_encoding_stops_training_before_any_work(train_cfg, tmp_path, monkeypatch):
    import socket

    from data.tokenizer import EncodingUnavailableError

    def no_network(*args, **kwargs):
        raise OSError("Network is unreachable")

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(socket, "create_connection", no_network)
    cfg = train_cfg("tokenizer=tiktoken", "tokenizer.encoding=o200k_base", "logger=none")
    with pytest.raises(EncodingUnavailableError, match="TIKTOKEN_CACHE_DIR"):
        train_script.train(cfg)
    assert not (tmp_path / "cache").exists()


def test_training_starts_from_the_seeded_initialisation(train_cfg, monkeypatch):
    """attention_maps.py's "at initialisation" baseline: GPT(cfg) right after torch.manual_seed(seed)."""
    import model.training.lit
    from model.gpt import GPT

    built = {}

    class Recorded(GPT):
        def __init__(self, cfg):
            super().__init__(cfg)
            built.update(cfg=cfg, state={k: v.clone() for k, v in self.state_dict().items()})

    monkeypatch.setattr(model.training.lit, "GPT", Recorded)
    train_script.train(train_cfg("seed=7", "trainer.max_steps=1", "trainer.val_check_interval=1", "logger=none"))
    torch.manual_seed(7)
    fresh = GPT(built["cfg"]).state_dict()
    assert all(torch.equal(fresh[k], v) for k, v in built["state"].items())
