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
          "model.head": "adaptive", "model.pos_emb": "rope", "model.optim.muon_lr": 0.007,
          "model.optim.embed_lr": 0.012}),
    (["model=small", "attention=flash", "trainer=gpu"],
     {"model.n_layer": 6, "model.n_embd": 384, "attention.backend": "flash", "trainer.precision": "bf16-mixed",
      "data.block_size": 128}),
    (["experiment=small_gpu"], {"model.name": "small", "data.batch_size": 128, "trainer.accelerator": "gpu",
                                "model.dropout": 0.1, "data.also_validate.song": f"{ROOT}/data/corpus/song.jsonl.xz",
                                "model.pos_emb": "rope", "model.optim.lr": 1e-3, "model.poem_inputs": True,
                                "data.mid_poem_fraction": 0.25}),
    ([], {"model.poem_inputs": True, "model.rhyme_loss_weight": 0.1, "data.mid_poem_fraction": 0.25}),
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


@pytest.mark.parametrize("override", ["data.train_windows=random", "data.anneal_mix=rhymed", "data=song",
                                      "model.qk_norm=true", "model.optim.name=adamw", "model.structure=false"])
def test_a_removed_option_fails_as_an_unknown_one_does(override):
    with pytest.raises(ConfigCompositionException):
        compose_train(override)


def test_small_is_the_default_recipe_at_6x6x384():
    """conf/model/small.yaml: tiny.yaml's recipe at another shape; experiment=small_gpu adds dropout and its schedule
    (the November learning rates: the embedding group's lr was measured on the CPU recipe only)."""
    from omegaconf import OmegaConf

    tiny, small, gpu = (OmegaConf.to_container(compose_train(*o).model) for o in ([], ["model=small"],
                                                                                  ["experiment=small_gpu"]))
    shape = {"name": "small", "block_size": 128, "n_layer": 6, "n_head": 6, "n_embd": 384}
    assert small == {**tiny, **shape}
    assert gpu == {**tiny, **shape, "dropout": 0.1,
                   "optim": {**tiny["optim"], "lr": 1e-3, "warmup_steps": 200, "min_lr_ratio": 0.1,
                                        "embed_lr": None, "muon_lr": 0.02, "muon_momentum_warmup": 0}}


RECIPE = {"max_new_tokens": 200, "temperature": 1.05, "top_k": 200, "top_p": 0.9, "repetition_penalty": 1.0,
          "topic_lean": 16.0, "seed": 1337}
RECIPE_FILE = ROOT / "model" / "sampling" / "recipe.yaml"
"""The sampling recipe, in the package that reads it (the wheel carries it: tests/test_wheel.py)."""


def sampling_of(*overrides, recipe_dir=None):
    """{entry: its sampling keys} of sample.py, evaluate.py and the two sampling callbacks, composed from conf/
    (with recipe_dir: the recipe.yaml there, as the only hydra.searchpath)."""
    searchpath = [f"hydra.searchpath=[file://{recipe_dir}]"] if recipe_dir else []
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        sample, evaluate = (compose(name, overrides=[*searchpath, *overrides]) for name in ("sample", "evaluate"))
        callbacks = compose("train", overrides=searchpath).callbacks
    return {name: {k: cfg[k] for k in RECIPE} for name, cfg in
            [("sample", sample), ("evaluate", evaluate), ("samples", callbacks.samples),
             ("evaluation", callbacks.evaluation)]}


def test_every_entry_point_samples_with_the_packages_recipe(tmp_path):
    """One copy: sample.py, evaluate.py and the callbacks compose model/sampling/recipe.yaml (from the package:
    hydra.searchpath pkg://model.sampling); SamplingOptions (the studio's defaults, attention_maps.py's free poems)
    reads it. No config holds the values again, and a recipe edited changes them all."""
    from hydra.utils import instantiate
    from omegaconf import DictConfig, OmegaConf

    from model.sampling.poems import SamplingOptions

    assert OmegaConf.to_container(OmegaConf.load(RECIPE_FILE)) == RECIPE
    assert {k: getattr(SamplingOptions(), k) for k in RECIPE} == RECIPE
    configs = {p: OmegaConf.load(p) for p in (ROOT / "conf").rglob("*.yaml")}
    assert [p for p, cfg in configs.items() if isinstance(cfg, DictConfig) and set(RECIPE) <= set(cfg)
            and not p.samefile(RECIPE_FILE)] == []  # no copy beside the entry configs
    short = {**RECIPE, "max_new_tokens": 100}  # the samples table during training: shorter poems
    assert sampling_of() == {"sample": RECIPE, "evaluate": RECIPE, "samples": short, "evaluation": RECIPE}
    assert sampling_of("temperature=0.8", "top_k=null")["sample"] == {**RECIPE, "temperature": 0.8, "top_k": None}
    callbacks = compose_train().callbacks
    assert vars(instantiate(callbacks.samples).options) == vars(SamplingOptions(num_samples=4, max_new_tokens=100))
    assert vars(instantiate(callbacks.evaluation).options) == vars(SamplingOptions(num_samples=16))
    callbacks = compose_train("sampling.temperature=0.5").callbacks  # one override for both callbacks
    assert callbacks.samples.temperature == callbacks.evaluation.temperature == 0.5
    assert list(callbacks) == ["ema", "model_checkpoint", "lr_monitor", "attention_maps", "samples", "evaluation",
                              "head_effects"]

    edited = {**RECIPE, "temperature": 0.7, "top_k": 40, "top_p": None, "repetition_penalty": 1.2, "seed": 7}
    OmegaConf.save(edited, tmp_path / "recipe.yaml")
    assert sampling_of(recipe_dir=tmp_path) == {"sample": edited, "evaluate": edited,
                                                "samples": {**edited, "max_new_tokens": 100}, "evaluation": edited}
