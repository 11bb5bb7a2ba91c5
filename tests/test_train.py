"""End to end on a tiny model and corpus: train.py's `train`, then sample.py's `sample`."""
import io
import json
import os
import re
import subprocess
import sys

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Timer
from omegaconf import OmegaConf

import sample as sample_script
import train as train_script
from data.verse.plan import PLAN_SLOTS
from data.verse.poetry import LINE_END, form_of
from model.device import BackendUnavailableError
from model.inspection.attention_stats import STATISTICS
from model.inspection.poem_metrics import METRICS
from tests.conftest import ROOT, compose_sample, make_train_cfg, write_corpus
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
    for ckpt in ckpt_dir.glob("*.ckpt"):  # plain data: loadable with weights_only=True (issue 17)
        assert torch.serialization.get_unsafe_globals_in_checkpoint(ckpt) == []
    (run,) = (tmp_path / "logs" / "test" / "wandb").glob("offline-run-*")
    rows = history(run)
    val = [r["val/loss"] for r in rows if "val/loss" in r]
    assert len(val) == 2, f"{len(rows)} history rows in {run}: {sorted(p.name for p in run.iterdir())}"
    train_losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(val) == 2 and val[-1] < val[0] - 0.1
    assert train_losses[-1] < train_losses[0] - 0.5
    bpc = [r["val/bpc"] for r in rows if "val/bpc" in r]
    assert bpc[-1] > val[-1] / 0.6932  # more bits per character than per token: <eos> costs nats, not characters
    assert any("lr-MuonAdamW/muon" in r and "lr-MuonAdamW/decay" in r and "lr-MuonAdamW/no_decay" in r for r in rows)
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
             for key in ("val/loss", "val/bpc", "attention/probe0", "attention/stats", "attention/view",
                         "attn/L1H1/prev_token", "samples")}
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


def test_a_run_shorter_than_the_validation_interval_still_ends_with_a_validation(train_cfg, monkeypatch, caplog):
    from model.training.lit import LitGPT

    validated, end = [], LitGPT.on_validation_epoch_end
    monkeypatch.setattr(LitGPT, "on_validation_epoch_end", lambda lit: (validated.append(lit.global_step), end(lit)))
    cfg = train_cfg("trainer.max_steps=6", "trainer.val_check_interval=550", "logger=none", "~callbacks.samples",
                    "~callbacks.attention_maps", "~callbacks.evaluation", "~callbacks.head_effects")
    with caplog.at_level("INFO"):
        metrics = train_script.train(cfg)
    assert validated == [6] and metrics["val/bpc"] > 0
    assert "validation at the last step: trainer.val_check_interval=550 is past trainer.max_steps=6" in caplog.text


def test_checkpoint_alone_is_enough_to_sample(trained, monkeypatch):
    cfg, _, tmp_path = trained
    ckpt = tmp_path / "checkpoints" / "test" / "last.ckpt"
    scfg = OmegaConf.merge(compose_sample(), {"ckpt_path": str(ckpt), "num_samples": 3, "max_new_tokens": 30,
                                              "prompt": "舉頭", "paths": {"checkpoint_dir": str(tmp_path / "checkpoints")}})
    monkeypatch.setattr(train_script, "train", None)  # sampling must not need the training code path
    (tmp_path / "cache").rename(tmp_path / "cache-moved")  # nor the prepared data
    poems = sample_script.sample(scfg)
    assert len(poems) == 3 and all(p.startswith("举头") for p in poems)  # prompt converted to simplified
    planned = PLAN_SLOTS if cfg.data.plan_tokens else 0  # drawn plan tokens count in max_new_tokens
    assert all(p[-1] == "。" or len(p) == 2 + 30 - planned for p in poems)  # ended after a full stop, or ran out
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
    return OmegaConf.merge(compose_sample(), {"ckpt_path": str(tmp_path / "checkpoints" / "test" / "last.ckpt"),
                                              "paths": {"checkpoint_dir": str(tmp_path / "checkpoints")}, **options})


def test_sample_script_says_which_heads_are_off_only_once_the_model_has_them(trained, capsys):
    with pytest.raises(ValueError, match="L9H0 is not a head of this model"):
        sample_script.sample(sample_cfg(trained, ablate=["L9H0"], num_samples=1, max_new_tokens=8), io.StringIO())
    assert "off" not in capsys.readouterr().err  # refused before anything is said of it
    sample_script.sample(sample_cfg(trained, ablate=["L0H0"], num_samples=1, max_new_tokens=8), io.StringIO())
    assert "with L0H0 off (zero)" in capsys.readouterr().err
    sample_script.sample(sample_cfg(trained, ablate="L0H1", num_samples=1, max_new_tokens=8), io.StringIO())
    assert "with L0H1 off (zero)" in capsys.readouterr().err  # `ablate=L0H1`, no brackets: one head, named whole


def test_sample_script_writes_jsonl_with_the_settings(trained):
    out = io.StringIO()
    poems = sample_script.sample(sample_cfg(trained, form="wujue", num_samples=3, format="jsonl", seed=7), out)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["poem"] for r in records] == poems and [r["index"] for r in records] == [0, 1, 2]
    assert all(r["seed"] == 7 and r["form"] == "wujue" and r["top_p"] == 0.9 and r["device"] == "cpu" for r in records)
    out = io.StringIO()
    cfg = sample_cfg(trained, num_samples=1, format="jsonl", ckpt_path=None,
                     paths={"checkpoint_dir": str(trained[2] / "checkpoints")})
    sample_script.sample(cfg, out)
    assert json.loads(out.getvalue())["ckpt_path"].endswith("test/last.ckpt")  # the one used, not null
    assert all(form_of(p) == "wujue" for p in poems)  # 25 tokens > block_size 16: the cache is re-filled
    out = io.StringIO()  # the keywords as cleaned, a list, whatever was typed
    poems = sample_script.sample(sample_cfg(trained, form="wujue", num_samples=2, format="jsonl",
                                            keywords="明月，明月"), out)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["keywords"] for r in records] == [["明月"], ["明月"]] and all("明月" in p for p in poems)
    assert [r["control"] for r in records] == ["both", "both"]  # in force (control=null): a plan model's default


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


def test_a_loaded_checkpoint_names_its_weights(trained):
    """`weights_sha`: what evaluate.py and attention_maps.py record, so that `benchmarks.report --check`
    knows which run's weights they measured; the same file, the same digest; other weights, another."""
    from model.loading import load_engine, read_checkpoint, weights_sha

    _, _, tmp_path = trained
    last, best = tmp_path / "checkpoints" / "test" / "last.ckpt", next((tmp_path / "checkpoints" / "test").glob("best*"))
    sha = load_engine(last).meta.weights_sha
    assert len(sha) == 64 and sha == weights_sha(read_checkpoint(last)["state_dict"])
    state = read_checkpoint(last)["state_dict"]
    state[next(iter(state))] = state[next(iter(state))] + 1e-3
    assert weights_sha(state) != sha
    assert load_engine(best).meta.weights_sha in (sha, weights_sha(read_checkpoint(best)["state_dict"]))


def test_tiktoken_tokenizer_trains_and_samples(train_cfg, tmp_path, caplog):
    from data.bpe import learn_ranks, write_ranks
    from tests.conftest import POEMS

    ranks = write_ranks(learn_ranks(POEMS, 256 + 64), tmp_path / "poems.tiktoken")
    cfg = train_cfg("tokenizer=tiktoken", f"tokenizer.encoding={ranks}", "trainer.max_steps=4",
                    "trainer.val_check_interval=4", "logger=none", "~callbacks.samples",
                    "callbacks.attention_maps.probe_lines=['床前明月光']")  # BPE: 12 characters pass block 16
    with caplog.at_level("INFO", logger="model.loading"):
        metrics = train_script.train(cfg)
    assert torch.isfinite(torch.tensor(metrics["val/bpc"]))
    assert cfg.model.head == "adaptive" and "model.head=tied: the vocabulary of" in caplog.text  # decided once, said
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


@pytest.mark.parametrize("precision", ["32-true", "auto"])
def test_training_starts_from_the_seeded_initialisation(train_cfg, monkeypatch, precision):
    """attention_maps.py's "at initialisation" baseline: GPT(cfg) right after torch.manual_seed(seed)
    (in `model.loading.build_gpt`, which then fills the tables)."""
    import model.loading
    from model.gpt import GPT

    built = {}

    class Recorded(GPT):
        def __init__(self, cfg):
            super().__init__(cfg)
            built.update(cfg=cfg, state={k: v.clone() for k, v in self.state_dict().items()})

    monkeypatch.setattr(model.loading, "GPT", Recorded)
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"amx_bf16": True}, raising=False)  # units or not
    train_script.train(train_cfg("seed=7", "trainer.max_steps=1", "trainer.val_check_interval=1", "logger=none",
                                 f"trainer.precision={precision}"))
    torch.manual_seed(7)
    fresh = GPT(built["cfg"]).state_dict()
    assert all(torch.equal(fresh[k], v) for k, v in built["state"].items())


def documented_metric_keys() -> list[str]:
    """The keys in the first column of the table under "## Metrics" in docs/training.md."""
    page = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    section = page.split("## Metrics", 1)[1].split("\n#", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return [key for cell in rows for key in re.findall(r"`([^`]+)`", cell)]


def key_pattern(key: str) -> str:
    """A documented key as a regular expression: <p>, <l>, <h> are numbers, <statistic> a statistic's name,
    <metric> one of the evaluation's figures."""
    pattern = re.escape(key).replace("<statistic>", "(" + "|".join(STATISTICS) + ")")
    pattern = pattern.replace("<metric>", "(" + "|".join(METRICS) + ")")
    return re.sub("<[a-z]>", r"\\d+", pattern)


def test_the_docs_list_exactly_the_logged_keys(trained):
    """Every key the Metrics table of docs/training.md names is logged, and every logged key is in it
    (the docs once named `lr-AdamW`; the logged keys carry the parameter group's name)."""
    _, _, tmp_path = trained
    (run,) = (tmp_path / "logs" / "test" / "wandb").glob("offline-run-*")
    logged = {k for row in history(run) for k in row} - {"epoch", "trainer/global_step", "_step", "_runtime",
                                                          "_timestamp"}
    listed = documented_metric_keys()
    assert "lr-MuonAdamW/muon" in listed and "lr-AdamW" not in listed
    assert [k for k in listed if not any(re.fullmatch(key_pattern(k), got) for got in logged)] == []
    assert sorted(k for k in logged if not any(re.fullmatch(key_pattern(r), k) for r in listed)) == []


def test_sample_table_of_the_run_keeps_the_poem_rules(trained):
    cfg, _, tmp_path = trained
    (run,) = (tmp_path / "logs" / "test" / "wandb").glob("offline-run-*")
    tables = sorted((run / "files" / "media" / "table").glob("samples_*.table.json"))
    rows = json.loads(tables[-1].read_text())["data"]
    assert len(rows) == 2 * cfg.callbacks.samples.num_samples  # two validations, the table grows
    for _, poem in rows:
        assert poem and poem[0] not in LINE_END and not re.search(f"[{LINE_END}]{{2}}", poem), poem
        planned = PLAN_SLOTS if cfg.data.plan_tokens else 0  # drawn plan tokens count in max_new_tokens
        assert poem[-1] in LINE_END[1:] or len(poem) == cfg.callbacks.samples.max_new_tokens - planned, poem


def run_sample_py(*args, cwd):
    return subprocess.run([sys.executable, str(ROOT / "sample.py"), *args], cwd=cwd, capture_output=True,
                          timeout=300, env={**os.environ, "PYTHONIOENCODING": "utf-8"})


def test_sample_sweep_runs_one_job_per_prompt_and_writes_only_under_logs(trained, tmp_path):
    ckpt = trained[2] / "checkpoints" / "test" / "last.ckpt"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    done = run_sample_py("-m", f"ckpt_path={ckpt}", "prompt=床前明月光,白日依山尽", "num_samples=1", "max_new_tokens=4",
                         "format=jsonl", f"paths.log_dir={tmp_path / 'logs'}", cwd=cwd)
    assert done.returncode == 0, done.stderr.decode()
    records = [json.loads(line) for line in done.stdout.decode().splitlines() if line.startswith("{")]
    assert [r["prompt"] for r in records] == ["床前明月光", "白日依山尽"]  # was one job: 床前明月光，白日依山尽
    assert all(r["poem"].startswith(r["prompt"]) for r in records)
    assert list(cwd.iterdir()) == []  # no multirun/ in the current folder
    assert list((tmp_path / "logs" / "sample" / "multirun").glob("*/multirun.yaml"))


def test_prompt_bytes_that_are_not_utf8_get_a_one_line_error(trained, tmp_path):
    ckpt = trained[2] / "checkpoints" / "test" / "last.ckpt"
    done = run_sample_py(f"ckpt_path={ckpt}".encode(), b"prompt=\xed\xa0\x80", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.decode().strip().splitlines() == [
        "error: prompt: 3 code point(s) are not characters (lone surrogates, which UTF-8 cannot encode): "
        "U+DCED, U+DCA0, U+DC80; they stand for the bytes ED A0 80, which are not UTF-8. Give the text as UTF-8."]


@pytest.mark.parametrize("option", ["prompt", "acrostic"])
def test_sampling_names_the_option_with_bad_code_points(trained, option):
    with pytest.raises(ValueError, match=f"^{option}: 1 code point.*U\\+D800"):
        sample_script.sample(sample_cfg(trained, **{option: "明\ud800"}))


def test_attention_map_text_with_bad_code_points_is_named(trained):
    from model.loading import load_engine

    engine = load_engine(trained[2] / "checkpoints" / "test" / "last.ckpt")
    with pytest.raises(ValueError, match="^text: 1 code point.*U\\+D800"):
        engine.encode_line("床\ud800", "text")


def test_the_end_of_training_logs_the_evaluation_table(trained):
    cfg, _, tmp_path = trained
    (run,) = (tmp_path / "logs" / "test" / "wandb").glob("offline-run-*")
    (table_file,) = (run / "files" / "media" / "table" / "eval").glob("poems_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"][:3] == ["set", "n", "regulated"]
    sets = [row[0] for row in table["data"]]
    assert sets == ["human (held-out)", "free", "wujue", "wujue+meter", "qilv", "qilv+meter"]  # conftest's sets
    rows = {row[0]: dict(zip(table["columns"], row)) for row in table["data"]}
    assert rows["free"]["n"] == cfg.callbacks.evaluation.num_samples == 4 and rows["qilv"]["qilv"] == 1
    assert rows["wujue+meter"]["meter"] == 1 and rows["qilv+meter"]["meter"] == rows["qilv+meter"]["rhyme"] == 1
    human = rows["human (held-out)"]
    assert human["n"] == 20 and human["regulated"] == 1 and human["wujue"] + human["qijue"] == 1  # 5 五绝, 1 七绝
    history_rows = history(run)
    seconds = [r["eval/seconds"] for r in history_rows if "eval/seconds" in r]
    assert len(seconds) == 1 and seconds[0] > 0
    assert any("eval/free/distinct_2" in r for r in history_rows)
    assert any("attn/L1H1/prev_line_rhyme" in r for r in history_rows)  # the new attention statistics follow
    (effects_file,) = (run / "files" / "media" / "table" / "heads").glob("effects_*.table.json")
    effects = json.loads(effects_file.read_text())
    assert effects["columns"] == ["head", "all", "rhyme_slot", "line_start", "mark", "eos"]
    assert [row[0] for row in effects["data"]] == ["L0H0", "L0H1", "L1H0", "L1H1", "L0 mean", "L1 mean"]
    assert all(row[1] != 0 for row in effects["data"])  # every head of a trained model moves the nats
    assert [r["heads/seconds"] for r in history_rows if "heads/seconds" in r][0] > 0


def test_evaluate_script_on_the_trained_checkpoint(trained, capsys):
    """evaluate.py: the table, the JSON, and val/bpc by the data module's validation: the
    training's last logged value, since last.ckpt holds the weights of the last validation."""
    from hydra import compose, initialize_config_dir

    import evaluate as evaluate_script
    from tests.conftest import ROOT

    cfg, metrics, tmp_path = trained
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        ecfg = compose("evaluate", overrides=[
            f"paths.checkpoint_dir={tmp_path / 'checkpoints'}", f"paths.log_dir={tmp_path / 'logs'}",
            f"data.corpus_path={cfg.data.corpus_path}", f"data.cache_dir={cfg.data.cache_dir}",
            "num_samples=4", "sets=[free,rhyme,meter]", "forms=[wulv]", "reference=12", "max_new_tokens=60"])
    report = evaluate_script.evaluate(ecfg)
    assert report["checkpoint"].endswith("test/last.ckpt")  # the newest by default
    assert list(report["rows"]) == ["human (held-out)", "free", "wulv+rhyme", "wulv+meter"]
    assert report["rows"]["wulv+meter"]["meter"] == 1 and report["rows"]["wulv+rhyme"]["rhyme_regulated"] == 1
    assert report["val"]["val/bpc"] == pytest.approx(metrics["val/bpc"], rel=1e-5)
    saved = json.loads((tmp_path / "logs" / "evaluate" / "test" / "evaluate.json").read_text())
    assert saved["rows"] == report["rows"] and len(saved["poems"]["wulv+meter"]) == 4
    assert saved["settings"]["sample_sets"]["wulv+meter"] == {"form": "wulv", "meter": True}
    evaluate_script.main.__wrapped__(ecfg)  # the printed table
    out = capsys.readouterr().out
    assert "human (held-out)" in out and "wulv+meter" in out and f"val/bpc {metrics['val/bpc']:.4f}" in out
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        kcfg = compose("evaluate", overrides=[*ecfg_overrides(cfg, tmp_path), "sets=[keywords]", "forms=[]",
                                              "val_bpc=false"])
    evaluate_script.main.__wrapped__(kcfg)  # keywords of held-out poems, forced; where they stand
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "logs" / "evaluate" / "test" / "evaluate.json").read_text())
    words = saved["keywords"]["keywords"]["keywords"]
    assert saved["rows"]["keywords"]["keywords"] == 1 and len(words) == 4
    assert all(w in poem for poem, ws in zip(saved["poems"]["keywords"], words) for w in ws)
    assert "where the keywords stand" in out and "keywords (held-out)" in out


def ecfg_overrides(cfg, tmp_path) -> list[str]:
    return [f"paths.checkpoint_dir={tmp_path / 'checkpoints'}", f"paths.log_dir={tmp_path / 'logs'}",
            f"data.corpus_path={cfg.data.corpus_path}", f"data.cache_dir={cfg.data.cache_dir}",
            "num_samples=4", "reference=12", "max_new_tokens=60"]


class BudgetProbe(L.Callback):
    """A callback (added through Hydra) that keeps, at the end of training, the Timer's
    training time and each parameter group's learning rate and peak."""
    seen: dict = {}

    def on_train_end(self, trainer, pl_module):
        (timer,) = [c for c in trainer.callbacks if isinstance(c, Timer)]
        self.seen.update(elapsed=timer.time_elapsed("train"), steps=trainer.global_step,
                         lrs=[(g["lr"], g["initial_lr"]) for g in trainer.optimizers[0].param_groups])


def test_budget_mode_ends_within_5_percent_of_its_budget_at_the_schedule_floor(train_cfg):
    cfg = train_cfg("trainer.max_time=00:00:00:08", "trainer.max_steps=-1", "trainer.limit_val_batches=0",
                    "logger=csv", "~callbacks.attention_maps", "~callbacks.samples", "~callbacks.evaluation",
                    "~callbacks.model_checkpoint",  # the tiny corpus's epochs last a few steps: no save at each
                    "+callbacks.budget_probe._target_=tests.test_train.BudgetProbe")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model's step stays a few ms also on a busy machine (no thread barriers)
    try:
        train_script.train(cfg)
    finally:
        torch.set_num_threads(threads)
    seen = BudgetProbe.seen
    assert seen["steps"] > 20, seen  # it trained by time, not by a step count
    assert 8.0 <= seen["elapsed"] <= 8.0 * 1.05
    ratio = cfg.model.optim.min_lr_ratio
    assert all(lr == pytest.approx(peak * ratio, rel=1e-6) for lr, peak in seen["lrs"])  # annealed at the end
