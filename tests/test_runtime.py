import torch

from model.cli import quote_non_ascii_overrides
from model.training.runtime import compute_dtype, resolve_precision, wandb_logged_in
from sample import as_lines, latest_checkpoint

import pytest


def test_chinese_overrides_are_quoted_for_hydra():
    argv = ["sample.py", "prompt=床前明月光", "top_k=5", "x='已引'", "q=it's月", "--multirun", "model=tiny"]
    assert quote_non_ascii_overrides(argv) == [
        "sample.py", "prompt='床前明月光'", "top_k=5", "x='已引'", "q='it\\'s月'", "--multirun", "model=tiny"]


def test_precision_resolution(caplog):
    assert resolve_precision("16-mixed", "gpu") == "16-mixed"
    assert resolve_precision("bf16-mixed", "cpu") == "bf16-mixed"
    # issue 12: half precision the device cannot train in is converted, with a log line
    assert resolve_precision("16-true", "gpu") == "16-mixed"
    assert resolve_precision("16-true", "cpu") == resolve_precision("16-mixed", "cpu") == "bf16-mixed"
    assert caplog.text.count("cannot train on") == 3
    assert resolve_precision("auto", "cpu") == "32-true"
    expected = "bf16-mixed" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "32-true"
    assert resolve_precision("auto", "auto") == expected
    assert compute_dtype("bf16-mixed") == torch.bfloat16
    assert compute_dtype("16-mixed") == torch.float16
    assert compute_dtype("32-true") == torch.float32


def test_wandb_login_is_read_from_env_and_netrc_only(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert not wandb_logged_in()
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password secret\n")
    (tmp_path / "netrc").chmod(0o600)
    assert wandb_logged_in()
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    assert not wandb_logged_in()
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_logged_in()


def test_sample_helpers(tmp_path):
    assert as_lines("床前明月光，疑是地上霜。举头望明月，低头思故乡。") == "床前明月光，疑是地上霜。\n举头望明月，低头思故乡。"
    with pytest.raises(FileNotFoundError, match="python train.py"):
        latest_checkpoint(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "last.ckpt").write_text("")
    assert latest_checkpoint(tmp_path) == tmp_path / "a" / "last.ckpt"


def test_user_errors_end_in_one_line_without_traceback():
    from model.attention import BackendUnavailableError
    from model.cli import exit_on_user_error

    @exit_on_user_error
    def entry(err):
        raise err

    for err in (ValueError("bad prompt"), FileNotFoundError("no corpus"), BackendUnavailableError("no flash")):
        with pytest.raises(SystemExit) as stop:
            entry(err)
        assert stop.value.code == f"error: {err}"
    with pytest.raises(KeyError):  # a bug is still a traceback
        entry(KeyError("bug"))
