"""Chinese in Hydra overrides: single values, lists and sweeps, each element quoted."""
import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from model.cli import quote_non_ascii_overrides
from tests.conftest import make_train_cfg


def parsed(arg: str):
    (quoted,) = quote_non_ascii_overrides([arg])
    return OverridesParser.create().parse_override(quoted)


@pytest.mark.parametrize("arg, value", [
    ("prompt=床前明月光", "床前明月光"),
    ("prompt=床前明月光，疑是地上霜。", "床前明月光，疑是地上霜。"),  # a full-width comma is text
    ("callbacks.attention_maps.probe_lines=[床前明月光，疑是地上霜。,白日依山尽，黄河入海流。]",
     ["床前明月光，疑是地上霜。", "白日依山尽，黄河入海流。"]),  # the list: LexerNoViableAltException
    ("x=[ 床 , 'a,b' , 3]", ["床", "a,b", 3]),
    ("x={a:床前, b: 白日}", {"a": "床前", "b": "白日"}),
    ("prompt='床前,明月'", "床前,明月"),  # quoted by the user: unchanged
    ("prompt=it's 月", "it's 月"),
    ("prompt=月\\", "月\\"),
])
def test_values_and_lists(arg, value):
    override = parsed(arg)
    assert not override.is_sweep_override() and override.value() == value


@pytest.mark.parametrize("arg, values", [
    ("prompt=床前明月光,白日依山尽", ["床前明月光", "白日依山尽"]),  # was one job, prompt 床前明月光，白日依山尽
    ("prompt=choice(床前,白日)", ["床前", "白日"]),
])
def test_sweeps_have_one_value_per_element(arg, values):
    override = parsed(arg)
    assert override.is_sweep_override()
    assert [v.strip("'") for v in override.sweep_string_iterator()] == values


def test_ascii_arguments_are_unchanged():
    argv = ["train.py", "-m", "model=tiny,small", "trainer.max_steps=10", "x=[1,2]"]
    assert quote_non_ascii_overrides(argv) == argv


def test_train_config_takes_a_chinese_list(tmp_path, tiny_corpus, monkeypatch):
    (override,) = quote_non_ascii_overrides(["callbacks.attention_maps.probe_lines=[床前明月光，疑是地上霜。,白日依山尽。]"])
    cfg = make_train_cfg(tmp_path, tiny_corpus, monkeypatch)(override)
    assert list(cfg.callbacks.attention_maps.probe_lines) == ["床前明月光，疑是地上霜。", "白日依山尽。"]


def test_output_piped_into_a_reader_that_stops_early_ends_quietly(monkeypatch):
    """`python sample.py tunes=list | head -1`: the closed pipe ends the program with status 1 and
    no traceback, stdout pointed at the null device so that the exit's flush cannot fail again."""
    import os
    import sys

    from model.cli import exit_on_user_error

    calls = []
    monkeypatch.setattr(os, "dup2", lambda fd, to: calls.append(to))
    monkeypatch.setattr(sys, "stdout", type("Out", (), {"fileno": lambda self: 97})())

    @exit_on_user_error
    def entry():
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(SystemExit) as end:
        entry()
    assert end.value.code == 1 and calls == [97] and end.value.__cause__ is None


def test_sample_py_refuses_an_unknown_format_in_one_line_before_reading_a_checkpoint(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "sample.py"), "format=xml", f"ckpt_path={tmp_path / 'none.ckpt'}"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1] == "error: format='xml' is not one of text, jsonl"
