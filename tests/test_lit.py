import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from data.tokenizer import CharTokenizer
from model.gpt import GPT, GPTConfig
from model.training.lit import LitGPT, build_optimizer, lr_factor

MODEL = dict(block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0, backend="sdpa")
OPTIM = dict(lr=1e-3, weight_decay=0.1, betas=[0.9, 0.95], muon_lr=0.02, muon_momentum=0.95, muon_weight_decay=0.0,
             warmup_steps=10, min_lr_ratio=0.1)


def lit(**model):
    torch.manual_seed(0)
    tok = CharTokenizer.from_texts(["床前明月光，疑是地上霜。"])
    return LitGPT({**MODEL, **model}, OPTIM, tok.state_dict())


def test_schedule_warms_up_then_decays_to_the_floor():
    m = lit()
    m._trainer = SimpleNamespace(estimated_stepping_batches=110, callbacks=[])
    conf = m.configure_optimizers()
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    assert conf["lr_scheduler"]["interval"] == "step"
    lrs, muon_lrs = [], []
    for _ in range(110):
        lrs.append(opt.param_groups[1]["lr"])  # AdamW's decay group
        muon_lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert lrs[60] == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lrs[-1] == pytest.approx(1e-4, rel=0.01) and all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert muon_lrs == pytest.approx([lr * 20 for lr in lrs])  # Muon's 0.02 on the same schedule


def test_validation_loss_does_not_depend_on_dropout():
    idx = torch.randint(0, 14, (4, 16))
    losses = []
    for p in (0.0, 0.3):
        m = lit(dropout=p)
        m.gpt.load_state_dict(lit().gpt.state_dict())
        losses.append(m.eval().gpt.loss(idx, idx))
    torch.testing.assert_close(losses[0], losses[1], rtol=0, atol=0)


def test_lr_factor_warms_up_then_follows_progress_to_the_floor():
    assert lr_factor(0, 100, 0.05, 0.0) == pytest.approx(0.01) and lr_factor(99, 100, 0.05, 0.0) == 1.0
    assert lr_factor(500, 100, 0.05, 0.5) == pytest.approx(0.05 + 0.95 * 0.5)
    assert lr_factor(500, 100, 0.05, 1.0) == pytest.approx(0.05) and lr_factor(500, 100, 0.05, 7.0) == pytest.approx(0.05)


def test_budget_mode_anneals_by_elapsed_time():
    """With a Timer (trainer.max_time), progress is the elapsed fraction of the budget."""
    from lightning.pytorch.callbacks import Timer

    class Clock(Timer):
        elapsed = 0.0

        def time_elapsed(self, stage="train"):
            return self.elapsed

        def time_remaining(self, stage="train"):
            return 100.0 - self.elapsed

    clock = Clock(duration={"seconds": 100})
    m = lit()
    m._trainer = SimpleNamespace(estimated_stepping_batches=float("inf"), callbacks=[clock])
    conf = m.configure_optimizers()
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    for _ in range(20):  # past the 10 warm-up steps
        opt.step()
        sched.step()
    assert opt.param_groups[1]["lr"] == pytest.approx(1e-3)  # no time spent yet: the peak
    clock.elapsed = 50.0
    opt.step()
    sched.step()
    assert opt.param_groups[1]["lr"] == pytest.approx(1e-4 + 0.9e-3 * 0.5)
    clock.elapsed = 100.0
    opt.step()
    sched.step()
    assert opt.param_groups[1]["lr"] == pytest.approx(1e-4)  # the floor when the budget is spent


def test_muon_takes_the_block_matrices_and_adamw_the_rest():
    m = lit()
    opt = build_optimizer(m.gpt, OPTIM)
    muon, decay, no_decay = opt.param_groups
    assert [g["name"] for g in opt.param_groups] == ["muon", "decay", "no_decay"]
    names = {id(p): n for n, p in m.gpt.named_parameters()}
    assert muon["use_muon"] and muon["lr"] == 0.02 and muon["weight_decay"] == 0.0
    assert muon["momentum_warmup"] == 0  # an optim from before the warm-up (a checkpoint's): none, as it was trained
    assert build_optimizer(m.gpt, {**OPTIM, "muon_momentum_warmup": 300}).param_groups[0]["momentum_warmup"] == 300
    assert {names[id(p)] for p in muon["params"]} == {f"blocks.{i}.{w}.weight" for i in range(2)
                                                     for w in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}
    assert {names[id(p)] for p in decay["params"]} == {"wte.weight", "wpe.weight"}  # the tied head is wte
    assert decay["weight_decay"] == 0.1 and not decay["use_muon"]
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() < 2 for p in no_decay["params"])


def test_embed_lr_gives_the_embedding_tables_a_group_of_their_own():
    gpt = GPT(GPTConfig(vocab_size=60, block_size=16, n_layer=1, n_head=2, n_embd=16, head="adaptive",
                        head_cutoffs=(20,), poem_inputs=True, rhyme_loss_weight=0.1))
    opt = build_optimizer(gpt, {**OPTIM, "embed_lr": 0.05})
    assert [g["name"] for g in opt.param_groups] == ["muon", "decay", "no_decay", "embed"]
    names = {id(p): n for n, p in gpt.named_parameters()}
    decay, embed = opt.param_groups[1], opt.param_groups[3]
    assert embed["lr"] == 0.05 and decay["lr"] == OPTIM["lr"] and embed["weight_decay"] == OPTIM["weight_decay"]
    assert {names[id(p)] for p in embed["params"]} == {"wte.weight", "wpe.weight", *(
        f"poem.{t}.weight" for t in ("wge", "wtone", "wline", "wcount", "wslot"))}
    assert {names[id(p)] for p in decay["params"]} == {
        "lm_head.adaptive.head.weight", "poem.rhyme_head.weight",
        *(f"lm_head.adaptive.tail.0.{i}.weight" for i in (0, 1))}
    assert sorted(id(p) for g in opt.param_groups for p in g["params"]) == sorted(names)  # each parameter once
    tied = lit().gpt  # the tied output layer is wte: it keeps lr, so only the positions' table is an embedding's
    groups = build_optimizer(tied, {**OPTIM, "embed_lr": 0.05}).param_groups
    assert [p is tied.wpe.weight for p in groups[3]["params"]] == [True]
    assert [g["name"] for g in build_optimizer(tied, {**OPTIM, "embed_lr": None}).param_groups] == \
        ["muon", "decay", "no_decay"]
    assert [g["name"] for g in build_optimizer(tied, OPTIM).param_groups] == ["muon", "decay", "no_decay"]  # a
    # checkpoint's optim from before embed_lr existed: no group of its own, as it was trained


def test_a_script_does_not_show_lightnings_leafspec_deprecation():
    """Lightning's pytree helper builds torch's deprecated LeafSpec at every fit; a script importing the
    training module (as train.py does) shows no warning for it. In a fresh interpreter: pyproject's
    filter, which hides it from the tests, does not apply there."""
    import subprocess
    import sys

    code = ("import warnings; warnings.simplefilter('default'); import model.training.lit; "
            "from lightning.pytorch.utilities._pytree import _tree_flatten; _tree_flatten(1); "
            "import torch.utils._pytree as p; p.LeafSpec(); print('flattened')")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           cwd=Path(__file__).resolve().parents[1])
    assert shown.returncode == 0 and "flattened" in shown.stdout, shown.stderr
    assert "LeafSpec" not in shown.stderr
