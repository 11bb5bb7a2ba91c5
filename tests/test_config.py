"""The real Hydra configs compose, and their paths do not depend on the working directory."""
import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from tests.conftest import ROOT


def compose_train(*overrides):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=list(overrides))


def test_paths_hang_off_the_project_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = compose_train()
    assert cfg.data.corpus_path == f"{ROOT}/data/corpus/tang.jsonl.xz"
    assert cfg.callbacks.model_checkpoint.dirpath.startswith(f"{ROOT}/checkpoints/")
    assert cfg.data.cache_dir == f"{ROOT}/data/cache"


@pytest.mark.parametrize("overrides, expected", [
    ([], {"model.name": "tiny", "attention.backend": "sdpa", "trainer.precision": "auto", "data.block_size": 72,
          "model.head": "adaptive", "model.pos_emb": "rope", "model.optim.name": "muon"}),
    (["model=small", "attention=flash", "trainer=gpu"],
     {"model.n_layer": 6, "model.n_embd": 384, "attention.backend": "flash", "trainer.precision": "bf16-mixed",
      "data.block_size": 128}),
    (["experiment=small_gpu"], {"model.name": "small", "data.batch_size": 128, "trainer.accelerator": "gpu",
                                "model.dropout": 0.1, "data.also_validate.song": f"{ROOT}/data/corpus/song.jsonl.xz",
                                "model.optim.name": "muon", "model.pos_emb": "rope", "model.optim.lr": 1e-3,
                                "model.phonology": True, "model.phon_output": True, "model.structure": True,
                                "model.struct_recover": True, "model.rhyme_loss_at": "rhyme_slots",
                                "data.mid_poem_fraction": 0.25}),
    ([], {"model.phonology": True, "model.phon_output": True, "model.structure": True, "model.rhyme_loss_weight": 0.1,
          "model.rhyme_loss_at": "rhyme_slots", "model.struct_recover": True, "data.mid_poem_fraction": 0.25}),
    (["trainer=ddp"], {"trainer.strategy": "ddp", "trainer.precision": "auto"}),
    ([], {"tokenizer.kind": "char", "data.tokenizer.kind": "char"}),
    (["tokenizer=tiktoken"], {"data.tokenizer.kind": "tiktoken", "data.tokenizer.encoding": "cl100k_base"}),
    (["logger=none"], {"logger": None, "callbacks.lr_monitor": None}),
])
def test_config_groups(overrides, expected):
    from omegaconf import OmegaConf

    cfg = compose_train(*overrides)
    for key, value in expected.items():
        assert OmegaConf.select(cfg, key) == value, key


@pytest.mark.parametrize("override", ["data.train_windows=random", "data.anneal_mix=rhymed", "data=song"])
def test_a_removed_option_fails_as_an_unknown_one_does(override):
    with pytest.raises(ConfigCompositionException):
        compose_train(override)


def test_every_entry_point_samples_with_the_same_defaults():
    """sample.py, evaluate.py and the end-of-run evaluation draw poems as SamplingOptions does by default."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from model.sampling.poems import SamplingOptions

    defaults = SamplingOptions()
    want = {k: getattr(defaults, k) for k in ("temperature", "top_k", "top_p", "max_new_tokens", "seed")}
    assert want["temperature"] == 1.05 and want["top_p"] == 0.9 and want["top_k"] == 200
    for cfg in (OmegaConf.load(ROOT / "conf" / "sample.yaml"), OmegaConf.load(ROOT / "conf" / "evaluate.yaml")):
        assert {k: cfg[k] for k in want} == want
    logger = instantiate(compose_train().callbacks.evaluation)  # PoemEvaluationLogger
    assert {k: getattr(logger.options, k) for k in want} == want
