import pytest

from data.tokenizer import BOS, EOS, CharTokenizer, UnknownCharactersError


def test_round_trip_and_deterministic_ids():
    tok = CharTokenizer.from_texts(["床前明月光，", "疑是地上霜。"])
    assert tok.itos[:2] == [BOS, EOS] and tok.itos[2:] == sorted(set("床前明月光，疑是地上霜。"))
    assert CharTokenizer.from_texts(["疑是地上霜。", "床前明月光，"]).itos == tok.itos
    ids = tok.encode("明月光，", bos=True, eos=True)
    assert ids[0] == tok.bos_id == 0 and ids[-1] == tok.eos_id == 1 and len(ids) == 6
    assert tok.decode(ids) == "明月光，"
    assert tok.decode(ids, skip_specials=False) == "<bos>明月光，<eos>"


def test_unknown_characters_are_listed():
    tok = CharTokenizer.from_texts(["床前明月光"])
    with pytest.raises(UnknownCharactersError) as err:
        tok.encode("床前A月B光A")
    assert err.value.unknown == ["A", "B"]
    assert "AB" in str(err.value) and "U+0041" in str(err.value)
    assert isinstance(err.value, ValueError)


def test_state_round_trip_and_bad_state(tmp_path):
    tok = CharTokenizer.from_texts(["床前明月光"])
    assert CharTokenizer.from_state_dict(tok.state_dict()).itos == tok.itos
    tok.save(tmp_path / "t.json")
    assert CharTokenizer.load(tmp_path / "t.json").stoi == tok.stoi
    with pytest.raises(ValueError, match="kind"):
        CharTokenizer.from_state_dict({"kind": "tiktoken", "itos": tok.itos})
    with pytest.raises(ValueError, match="sorted"):
        CharTokenizer.from_state_dict({"kind": "char", "itos": [BOS, EOS, "月", "明"]})
