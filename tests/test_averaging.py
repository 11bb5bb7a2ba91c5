"""The weight average a run keeps (`callbacks.ema`, model/training/averaging.py)."""
import pytest
import torch

from model.training.averaging import EMA, ema_update


def test_the_decay_warms_up_then_holds():
    """d = min(decay, (1 + n) / (10 + n)): 0.1 after no update, 0.995 from n = 1,790 on."""
    for n, d in ((0, 0.1), (90, 0.91), (1790, 0.995), (10_000, 0.995)):
        averaged, current = [torch.tensor([1.0, 2.0])], [torch.tensor([3.0, 6.0])]
        ema_update(0.995, averaged, current, torch.tensor(n))
        assert torch.allclose(averaged[0], d * torch.tensor([1.0, 2.0]) + (1 - d) * torch.tensor([3.0, 6.0]),
                              atol=1e-6), n


def test_a_buffer_that_is_not_floating_point_takes_the_models_own():
    averaged, current = [torch.tensor([True, False])], [torch.tensor([False, True])]
    ema_update(0.995, averaged, current, torch.tensor(5))
    assert averaged[0].tolist() == [False, True]


@pytest.mark.parametrize("decay", [0.0, 1.0, 1.5])
def test_a_decay_outside_zero_to_one_is_refused(decay):
    with pytest.raises(ValueError, match=r"callbacks.ema.decay must be in \(0, 1\)"):
        EMA(decay)


@pytest.mark.parametrize("ema", [True, False])
def test_the_checkpoint_holds_the_average_and_the_trained_weights_to_resume_from(train_cfg, ema):
    """With the average (the default), last.ckpt's state_dict is the average, which the engine
    loads, and current_model_state the trained weights; `callbacks.ema=null` keeps the trained ones only."""
    import train as train_script
    from model.loading import load_engine

    cfg = train_cfg(*([] if ema else ["callbacks.ema=null"]), "logger=none", "~callbacks.evaluation",
                    "~callbacks.head_effects")
    train_script.train(cfg)
    path = f"{cfg.paths.checkpoint_dir}/test/last.ckpt"
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    assert ("current_model_state" in ckpt) == ema
    loaded = load_engine(path).model.state_dict()
    assert all(torch.equal(loaded[k.removeprefix("gpt.")], v) for k, v in ckpt["state_dict"].items()
               if k.startswith("gpt."))
    if ema:
        gaps = [float((ckpt["state_dict"][k] - v).abs().max()) for k, v in ckpt["current_model_state"].items()
                if v.is_floating_point()]
        assert max(gaps) > 1e-4  # the average is not the trained weights
