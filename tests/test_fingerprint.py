"""The behaviour fingerprint that decides whether the default run's figures are current (issue 37):
what a run does changes it, how the config is written does not."""
import pytest

from model.training.fingerprint import differences, fingerprint


@pytest.fixture
def base(train_cfg):
    return fingerprint(train_cfg())


def test_settings_that_do_not_change_what_is_trained_keep_the_fingerprint(train_cfg, base):
    """Callbacks (but the weight average), logger, paths, the run's name, the attention backend, a spelling of the same
    value: no part differs (the backends compute the same function). A setting left null is left
    out, as a config written before it existed left it (model.optim.embed_lr=null)."""
    same = fingerprint(train_cfg("logger=none", "~callbacks.samples", "run_name=other", "paths.log_dir=/elsewhere",
                                 "attention=naive", "model.optim.lr=0.0040"))
    assert differences(base, same) == []
    assert base["schedule"]["optim"]["embed_lr"] == 0.012 and "muon_lr" in base["schedule"]["optim"]
    assert "embed_lr" not in fingerprint(train_cfg("model.optim.embed_lr=null"))["schedule"]["optim"]


@pytest.mark.parametrize("override, part", [
    ("model.optim.muon_lr=0.03", "schedule"), ("model.optim.weight_decay=0.2", "schedule"),
    ("model.optim.embed_lr=null", "schedule"),
    ("data.mid_poem_fraction=0.5", "data"), ("data.anneal_fraction=0.2", "data"), ("seed=7", "data"),
    ("model.mlp_act=gelu", "model"), ("model.zero_init_proj=false", "model"), ("trainer.max_steps=30", "trainer"),
    ("callbacks.ema=null", "trainer"), ("callbacks.ema.decay=0.99", "trainer"),
])
def test_a_change_of_recipe_changes_the_part_it_acts_on(train_cfg, base, override, part):
    assert part in differences(base, fingerprint(train_cfg(override)))


def test_float_parts_compare_within_the_tolerance_cpus_differ_by(base):
    near = {**base, "model": {**base["model"], "loss": [v * (1 + 2e-6) for v in base["model"]["loss"]]}}
    far = {**base, "model": {**base["model"], "loss": [v * (1 + 1e-3) for v in base["model"]["loss"]]}}
    assert differences(base, near) == [] and differences(base, far) == ["model"]
    assert differences(None, base) == ["trainer", "data", "schedule", "model"]
