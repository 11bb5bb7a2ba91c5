import math
from types import SimpleNamespace

import pytest
import torch

from data.tokenizer import CharTokenizer
from model.training.lit import LitGPT, load_for_inference

MODEL = dict(block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=False, attention="sdpa")
OPTIM = dict(lr=1e-3, weight_decay=0.1, betas=[0.9, 0.95], warmup_steps=10, min_lr_ratio=0.1)


def lit(**model):
    torch.manual_seed(0)
    tok = CharTokenizer.from_texts(["床前明月光，疑是地上霜。"])
    return LitGPT({**MODEL, **model}, OPTIM, tok.state_dict())


def test_schedule_warms_up_then_decays_to_the_floor():
    m = lit()
    m._trainer = SimpleNamespace(estimated_stepping_batches=110)
    conf = m.configure_optimizers()
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    assert conf["lr_scheduler"]["interval"] == "step"
    lrs = []
    for _ in range(110):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert lrs[60] == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lrs[-1] == pytest.approx(1e-4, rel=0.01) and all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and all(p.dim() >= 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() < 2 for p in no_decay["params"])


def test_validation_loss_does_not_depend_on_dropout():
    idx = torch.randint(0, 14, (4, 16))
    losses = []
    for p in (0.0, 0.3):
        m = lit(dropout=p)
        m.gpt.load_state_dict(lit().gpt.state_dict())
        losses.append(m.eval()(idx, idx)[1])
    torch.testing.assert_close(losses[0], losses[1], rtol=0, atol=0)


def test_load_for_inference_reports_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="python train.py"):
        load_for_inference(tmp_path / "nope.ckpt")
