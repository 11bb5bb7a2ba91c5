import pytest
import torch

from model.cli import quote_non_ascii_overrides
from model.loading import find_checkpoint
from model.training.runtime import compute_dtype, resolve_precision, wandb_logged_in
from sample import as_lines


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
    poem = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"
    assert as_lines(poem) == "床前明月光，疑是地上霜。\n举头望明月，低头思故乡。"
    with pytest.raises(FileNotFoundError, match="python train.py"):
        find_checkpoint(None, tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "last.ckpt").write_text("")
    assert find_checkpoint(None, tmp_path) == tmp_path / "a" / "last.ckpt"


def test_user_errors_end_in_one_line_without_traceback():
    from model.cli import exit_on_user_error
    from model.device import BackendUnavailableError

    @exit_on_user_error
    def entry(err):
        raise err

    for err in (ValueError("bad prompt"), FileNotFoundError("no corpus"), BackendUnavailableError("no flash")):
        with pytest.raises(SystemExit) as stop:
            entry(err)
        assert stop.value.code == f"error: {err}"
    with pytest.raises(KeyError):  # a bug is still a traceback
        entry(KeyError("bug"))


RECIPE = dict(vocab_size=60, block_size=16, n_layer=2, n_head=2, n_embd=32, pos_emb="rope",
              mlp_act="relu2", head="adaptive", head_cutoffs=(20,))


def twenty_steps(model, autocast_dtype=None) -> list[float]:
    """Losses of 20 AdamW steps on fixed random batches, optionally under CPU autocast."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen, losses = torch.Generator().manual_seed(1), []
    for _ in range(20):
        x = torch.randint(0, 60, (4, 16), generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast_dtype is not None):
            loss = model.loss(x, x.roll(-1, 1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_bf16_autocast_trains_like_float32():
    from model.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    fp32 = twenty_steps(GPT(GPTConfig(**RECIPE)))
    torch.manual_seed(0)
    bf16 = twenty_steps(GPT(GPTConfig(**RECIPE)), torch.bfloat16)
    assert max(abs(a - b) / a for a, b in zip(fp32, bf16)) < 0.02
    assert bf16[-1] < bf16[0] - 0.5  # it does learn


def test_auto_precision_is_a_rule_said_once_that_draws_nothing(monkeypatch, caplog):
    """Issue 24, item 3: the same choice at every run and rank, even on a CPU with bfloat16 units."""
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"amx_bf16": True, "avx512_bf16": True}, raising=False)
    torch.manual_seed(3)
    before = torch.random.get_rng_state()
    with caplog.at_level("INFO", logger="model.training.runtime"):
        assert [resolve_precision("auto", "cpu") for _ in range(3)] == ["32-true"] * 3
    assert torch.equal(torch.random.get_rng_state(), before)
    assert caplog.text.count("trainer.precision=auto: 32-true (the CPU; set trainer.precision to choose)") == 3


def test_compiled_model_trains_like_the_eager_one_and_keeps_its_keys():
    from model.gpt import GPT, GPTConfig
    from model.training.runtime import compile_or_eager

    torch.manual_seed(0)
    eager_model = GPT(GPTConfig(**RECIPE))
    keys = list(eager_model.state_dict())
    eager = twenty_steps(eager_model)
    torch.manual_seed(0)
    compiled_model = GPT(GPTConfig(**RECIPE))
    said = []
    assert compile_or_eager(compiled_model, said.append) and "torch.compile" in said[0]
    compiled = twenty_steps(compiled_model)
    assert max(abs(a - b) for a, b in zip(eager, compiled)) < 1e-3
    assert list(compiled_model.state_dict()) == keys  # no _orig_mod. prefix: checkpoints interchangeable


def test_compile_falls_back_to_eager_with_a_line(monkeypatch):
    from model.training.runtime import compile_or_eager

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler found\nmore detail")

    monkeypatch.setattr(torch, "compile", broken)
    said, module = [], torch.nn.Linear(2, 2)
    assert not compile_or_eager(module, said.append)
    assert said == ["compile: unavailable here (RuntimeError: no C++ compiler found); running eagerly"]


def test_a_gpu_accelerator_without_a_gpu_is_one_line_before_any_work(monkeypatch):
    from model.training.runtime import check_accelerator
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="^trainer.accelerator=gpu but there is no CUDA GPU here; on the CPU add "
                                         "trainer.accelerator=cpu$"):
        check_accelerator("gpu")
    check_accelerator("cpu")  # no error
    check_accelerator("auto")


def test_a_finished_run_destroys_its_gloo_group_and_without_one_does_nothing(tmp_path):
    import torch.distributed as dist

    from model.training.runtime import end_process_group
    end_process_group()  # no group: nothing to do, no error
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        total = torch.ones(3)
        dist.all_reduce(total)
        assert total.tolist() == [1.0, 1.0, 1.0]
        end_process_group()
        assert not dist.is_initialized()
    finally:  # never leave a group to the tests after this one
        if dist.is_initialized():
            dist.destroy_process_group()
