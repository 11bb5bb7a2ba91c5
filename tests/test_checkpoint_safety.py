"""Issue 17, item 1: a checkpoint is data. A planted payload never runs; its file is refused in one line."""
import os
import subprocess
import sys

import pytest
import torch

import train as train_script
from model.loading import UnsafeCheckpointError, load_engine, read_checkpoint
from model.training.checkpoints import AtomicCheckpointIO, load_checkpoint
from tests.conftest import ROOT
from tests.test_attention_maps import write_checkpoint


class Payload:
    """Unpickling it runs `touch <marker>`, as a shared checkpoint could."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def planted(tmp_path):
    """A real checkpoint of a tiny model with one extra entry whose unpickling would create `marker`."""
    path = write_checkpoint(tmp_path / "shared" / "last.ckpt")
    ckpt = torch.load(path, weights_only=True)
    marker = tmp_path / "ran"
    torch.save({**ckpt, "extra": Payload(marker)}, path)
    return path, marker


LOADERS = {"read_checkpoint": read_checkpoint, "load_engine": load_engine,
           "train.py's resume check": load_checkpoint, "Lightning's resume": AtomicCheckpointIO().load_checkpoint}


@pytest.mark.parametrize("name", LOADERS)
def test_every_loader_refuses_a_payload_without_running_it(planted, name):
    path, marker = planted
    with pytest.raises(UnsafeCheckpointError) as err:
        LOADERS[name](path)
    assert not marker.exists()
    assert str(path) in str(err.value) and "posix.system" in str(err.value) and "\n" not in str(err.value)


def test_resuming_from_a_payload_stops_before_training(planted, train_cfg, tmp_path):
    path, marker = planted
    with pytest.raises(UnsafeCheckpointError, match="posix.system"):
        train_script.train(train_cfg(f"ckpt_path={path}", "logger=none"))
    assert not marker.exists() and not (tmp_path / "checkpoints" / "test").exists()


def test_sample_py_reports_the_refusal_in_one_line(planted):
    path, marker = planted
    proc = subprocess.run([sys.executable, str(ROOT / "sample.py"), f"ckpt_path={path}", "num_samples=1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and not marker.exists()
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {path} holds posix.system, not only tensors, numbers, strings, lists and dicts; refused unread, "
        "since loading it could run code. Use a checkpoint written by train.py")


def test_files_that_are_no_checkpoint_get_a_one_line_error(tmp_path):
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"junk.ckpt is not a checkpoint torch can read \(Unsupported operand"):
        read_checkpoint(tmp_path / "junk.ckpt")
    torch.save([1, 2], tmp_path / "list.ckpt")
    with pytest.raises(ValueError, match="holds a list, not a checkpoint dict"):
        read_checkpoint(tmp_path / "list.ckpt")


def test_the_checkpoints_the_project_writes_are_plain_data(tmp_path):
    path = write_checkpoint(tmp_path / "last.ckpt")
    assert torch.serialization.get_unsafe_globals_in_checkpoint(path) == []
    assert load_engine(path).model.cfg.n_layer == 2


def test_a_run_folder_means_its_last_ckpt_for_every_inference_loader(tmp_path):
    path = write_checkpoint(tmp_path / "run" / "last.ckpt")
    assert load_engine(path.parent).model.cfg.n_layer == 2
    with pytest.raises(FileNotFoundError, match=r"checkpoint .*empty/last.ckpt not found"):
        load_engine((tmp_path / "empty").mkdir() or tmp_path / "empty")
