"""Issue 24, item 2: a file that is not this project's checkpoint is named in one line by every
loader (sample.py, evaluate.py, attention_maps.py and the studio through `load_engine`, and
train.py's resume), saying what the file is and what is expected; never a traceback."""
import subprocess
import sys

import pytest
import torch
from starlette.testclient import TestClient

import train as train_script
from model.loading import load_engine, load_weights
from model.studio.server import create_app
from model.training.lit import LitGPT
from tests.conftest import ROOT
from tests.test_attention_maps import write_checkpoint


def nanogpt(path):
    torch.save({"model": {"transformer.wte.weight": torch.zeros(65, 8)}, "optimizer": {},
                "model_args": {"n_layer": 6, "n_head": 6, "n_embd": 384, "block_size": 256, "vocab_size": 65},
                "iter_num": 5000, "best_val_loss": torch.tensor(1.47), "config": {"dataset": "shakespeare_char"}}, path)


def bare_state_dict(path):
    torch.save(torch.load(write_checkpoint(path), weights_only=True)["state_dict"], path)


def no_hyper_parameters(path):
    ckpt = torch.load(write_checkpoint(path), weights_only=True)
    torch.save({"state_dict": ckpt["state_dict"], "epoch": 0}, path)


def other_shape(path):
    ckpt = torch.load(write_checkpoint(path), weights_only=True)
    ckpt["state_dict"]["gpt.blocks.3.attn.c_attn.weight"] = torch.zeros(48, 16)
    torch.save(ckpt, path)


def text_file(path):
    path.write_text("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n")


KINDS = {"nanogpt": (nanogpt, "is a nanoGPT checkpoint (n_layer=6, n_head=6, n_embd=384, block_size=256, "
                             "iteration 5000)"),
         "state_dict": (bare_state_dict, "is a bare state_dict ("),
         "no hyper_parameters": (no_hyper_parameters, "is a checkpoint without hyper_parameters (its keys: state_dict, "
                                                      "epoch)"),
         "other shape": (other_shape, "is a checkpoint of another shape than its settings say (unexpected key "
                                      "blocks.3.attn.c_attn.weight"),
         "text": (text_file, "is not a checkpoint torch can read (IndexError")}


@pytest.fixture(params=list(KINDS))
def wrong(request, tmp_path):
    make, said = KINDS[request.param]
    path = tmp_path / "checkpoints" / "run" / "last.ckpt"
    path.parent.mkdir(parents=True)
    make(path)
    return path, said


def test_load_engine_says_what_the_file_is(wrong):
    path, said = wrong
    with pytest.raises(ValueError) as err:
        load_engine(path)
    message = str(err.value)
    assert message.startswith(f"{path} {said}") and "\n" not in message
    assert message.endswith("expected a checkpoint written by this project's train.py, e.g. checkpoints/<run>/last.ckpt")


def test_train_py_refuses_to_resume_from_it_in_one_line(wrong, train_cfg):
    path, said = wrong
    with pytest.raises(ValueError) as err:
        train_script.train(train_cfg(f"ckpt_path={path}", "logger=none"))
    assert str(path) in str(err.value) and "\n" not in str(err.value)  # what it is, or its settings against the config


def test_weights_that_do_not_fit_their_settings_are_named_before_fitting(tmp_path):
    """What train.py checks after building the model from the checkpoint's own settings."""
    path = tmp_path / "last.ckpt"
    other_shape(path)
    ckpt = torch.load(path, weights_only=True)
    lit = LitGPT(**ckpt["hyper_parameters"])
    with pytest.raises(ValueError, match=r"another shape than its settings say \(unexpected key "
                                         r"gpt\.blocks\.3\.attn\.c_attn\.weight, 0 missing, 1 unexpected\)"):
        load_weights(lit, ckpt["state_dict"], path)
    ckpt["state_dict"]["gpt.wte.weight"] = torch.zeros(3, 16)
    del ckpt["state_dict"]["gpt.blocks.3.attn.c_attn.weight"]
    with pytest.raises(ValueError, match=r"\(size mismatch for gpt\.wte\.weight"):
        load_weights(lit, ckpt["state_dict"], path)


def test_the_studio_answers_400_with_the_line(wrong):
    path, said = wrong
    client = TestClient(create_app(path.parents[1], device="cpu", allowed_hosts=("testserver",)))
    r = client.post("/generate", json={"ckpt_path": str(path)})
    assert r.status_code == 400 and r.json()["error"].startswith(f"error: {path} {said}")
    r = client.get("/options", params={"ckpt_path": str(path)})
    assert r.status_code == 200 and r.json()["error"].startswith(f"error: {path} {said}")


@pytest.mark.parametrize("script", ["sample.py", "evaluate.py", "attention_maps.py"])
def test_the_entry_points_exit_1_with_the_line(tmp_path, script):
    path = tmp_path / "ckpt.pt"
    nanogpt(path)
    proc = subprocess.run([sys.executable, str(ROOT / script), f"ckpt_path={path}"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {path} is a nanoGPT checkpoint")
