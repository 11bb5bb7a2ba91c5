import socket
import time

import pytest
import tiktoken
from tiktoken.load import load_tiktoken_bpe

from data.bpe import learn_ranks, write_ranks
from data.tokenizer import (
    BOS,
    EOS,
    CharTokenizer,
    EncodingUnavailableError,
    InvalidCodePointsError,
    StreamDecoder,
    TiktokenTokenizer,
    UnknownCharactersError,
    check_code_points,
    load_encoding,
    load_tokenizer,
    ranks_file_pattern,
    tokenizer_from_state,
)
from tests.conftest import POEMS


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
    assert load_tokenizer(tmp_path / "t.json").stoi == tok.stoi
    assert tokenizer_from_state({"itos": tok.itos}).itos == tok.itos  # older checkpoints: no "kind"
    with pytest.raises(ValueError, match="kind"):
        CharTokenizer.from_state_dict({"kind": "tiktoken", "itos": tok.itos})
    with pytest.raises(ValueError, match="sorted"):
        CharTokenizer.from_state_dict({"kind": "char", "itos": [BOS, EOS, "月", "明"]})


@pytest.fixture
def ranks_file(tmp_path):
    """A real .tiktoken file: byte-level BPE ranks with 64 merges learned from the test poems."""
    return write_ranks(learn_ranks(POEMS, 256 + 64), tmp_path / "poems.tiktoken")


def bytes_only(encoding):
    """A tokenizer that keeps only the 256 single-byte tokens: every Chinese character is 3 tokens."""
    return TiktokenTokenizer(encoding, [encoding.encode_single_token(bytes([b])) for b in range(256)], "x")


def test_tiktoken_ids_are_remapped_to_a_compact_vocabulary_and_back(ranks_file):
    enc = load_encoding(str(ranks_file))
    assert enc.name.startswith("poems.tiktoken@") and enc.n_vocab == 320
    tok = TiktokenTokenizer.from_texts(enc, POEMS, str(ranks_file))
    used = {t for p in POEMS for t in enc.encode_ordinary(p)}
    assert set(tok.token_ids) >= used and tok.vocab_size < len(used) + 2 + 256
    assert tok.vocab_size == len(tok.token_ids) + 2
    for poem in POEMS:
        ids = tok.encode(poem, bos=True, eos=True)
        assert ids[0] == tok.bos_id == 0 and ids[-1] == tok.eos_id == 1 and max(ids) < tok.vocab_size
        assert [tok.token_ids[i - 2] for i in ids[1:-1]] == enc.encode_ordinary(poem)
        assert tok.decode(ids) == poem and sum(tok.char_counts[i] for i in ids) == len(poem)
    again = tokenizer_from_state(tok.state_dict())
    assert isinstance(again, TiktokenTokenizer) and again.token_ids == tok.token_ids
    assert again.encode(POEMS[2]) == tok.encode(POEMS[2])


def test_tokens_outside_the_vocabulary_fall_back_to_bytes_and_unknown_characters_are_listed(ranks_file):
    enc = load_encoding(str(ranks_file))
    tok = bytes_only(enc)
    assert len(enc.encode_ordinary("明月")) < 6  # the encoding merges these bytes; the vocabulary lacks the merges
    assert len(tok.encode("明月")) == 6 and tok.decode(tok.encode("明月")) == "明月"
    poems = TiktokenTokenizer.from_texts(enc, POEMS[:1], "x")
    with pytest.raises(UnknownCharactersError) as err:
        poems.encode("床前白日光")
    assert err.value.unknown == ["白", "日"]  # bytes the first poem lacks; 光 and 床前 are known


def test_special_token_text_is_encoded_as_plain_text(ranks_file):
    ranks = load_tiktoken_bpe(str(ranks_file))
    enc = tiktoken.Encoding("with-specials", pat_str=ranks_file_pattern(), mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": len(ranks)})
    text = "明月<|endoftext|>光"
    with pytest.raises(ValueError):
        enc.encode(text)  # tiktoken's default refuses it
    tok = TiktokenTokenizer.from_texts(enc, [*POEMS, text], "x")
    ids = tok.encode(text)
    assert len(ids) > 3 and len(ranks) not in tok.token_ids and tok.decode(ids) == text


def test_stream_decoder_never_emits_part_of_a_character(ranks_file):
    enc = load_encoding(str(ranks_file))
    poem = POEMS[0]
    for tok in (bytes_only(enc), TiktokenTokenizer.from_texts(enc, POEMS, "x"), CharTokenizer.from_texts(POEMS)):
        stream = StreamDecoder(tok)
        pieces = [stream.feed([i]) for i in tok.encode(poem, bos=True, eos=True)]
        assert "".join(pieces) == poem and not any("\ufffd" in p for p in pieces)
        assert stream.flush() == ""
    tok = bytes_only(enc)
    stream = StreamDecoder(tok)
    ids = tok.encode("月")
    assert [stream.feed([i]) for i in ids] == ["", "", "月"]
    assert stream.feed(ids[:1]) == "" and stream.flush() == "\ufffd"  # a stream cut inside a character


def test_unreachable_encoding_stops_at_once_with_how_to_provide_it(tmp_path, monkeypatch, ranks_file):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))

    def no_network(*args, **kwargs):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", no_network)
    start = time.perf_counter()
    with pytest.raises(EncodingUnavailableError, match="TIKTOKEN_CACHE_DIR.*tokenizer.encoding=") as err:
        load_encoding("cl100k_base")
    assert time.perf_counter() - start < 5 and isinstance(err.value, FileNotFoundError)
    with pytest.raises(ValueError, match="cl100k_base"):
        load_encoding("cl99k")
    with pytest.raises(FileNotFoundError, match="python -m data.bpe"):
        load_encoding(str(tmp_path / "missing.tiktoken"))
    state = TiktokenTokenizer.from_texts(load_encoding(str(ranks_file)), POEMS, str(ranks_file)).state_dict()
    write_ranks(learn_ranks(POEMS, 256 + 8), ranks_file)
    with pytest.raises(ValueError, match="trained with poems.tiktoken@"):
        tokenizer_from_state(state)
    partial = tmp_path / "partial.tiktoken"
    partial.write_text("YQ== 0\n")
    with pytest.raises(ValueError, match="255 of the 256"):
        load_encoding(str(partial))


def test_labels_of_tokens_that_hold_part_of_a_character():
    tok = CharTokenizer("床前")
    assert [tok.label(i) for i in tok.encode("床前", bos=True, eos=True)] == ["<bos>", "床", "前", "<eos>"]
    enc = tiktoken.Encoding("bytes", pat_str=r".", mergeable_ranks={bytes([b]): b for b in range(256)}, special_tokens={})
    bpe = TiktokenTokenizer.from_texts(enc, ["床"], "bytes")
    assert [bpe.label(i) for i in bpe.encode("床")] == ["<e5>", "<ba>", "<8a>"]


def both_tokenizers(ranks_file):
    """A character and a BPE tokenizer over the test poems."""
    return [CharTokenizer.from_texts(POEMS), TiktokenTokenizer.from_texts(load_encoding(str(ranks_file)), POEMS, "x")]


def test_lone_surrogates_are_refused_by_encode_with_their_code_points(ranks_file):
    for tok in both_tokenizers(ranks_file):
        with pytest.raises(UnknownCharactersError, match="text: 1 code point.*U\\+D800") as err:  # tiktoken raised
            tok.encode("床\ud800")  # UnicodeEncodeError although its docstring promised this error
        assert isinstance(err.value, InvalidCodePointsError) and err.value.unknown == ["\ud800"]


def test_bytes_that_are_not_utf8_are_named_as_bytes():
    """`prompt=$'\\xed\\xa0\\x80'`: Python hands the three bytes over as U+DCED U+DCA0 U+DC80."""
    arg = b"\xed\xa0\x80".decode("utf-8", errors="surrogateescape")
    with pytest.raises(InvalidCodePointsError) as err:
        check_code_points(arg, "prompt")
    message = str(err.value)
    assert message.startswith("prompt: 3 code point(s) are not characters") and "\n" not in message
    assert "U+DCED, U+DCA0, U+DC80" in message and "bytes ED A0 80" in message
    assert check_code_points("床前明月光", "prompt") == "床前明月光"


@pytest.mark.parametrize("bad", [[-1], "vocab_size", [2, -3, 10**6]])
def test_every_decode_path_refuses_ids_outside_the_vocabulary(ranks_file, bad):
    for tok in both_tokenizers(ranks_file):
        ids = [tok.vocab_size] if bad == "vocab_size" else bad
        wrong = [i for i in ids if not 0 <= i < tok.vocab_size]
        expected = f"token id\\(s\\) {', '.join(map(str, wrong))} outside the vocabulary's range \\[0, {tok.vocab_size}\\)"
        for decode in (tok.decode, StreamDecoder(tok).feed, lambda ids: tok.label(ids[-1]),
                       lambda ids: tok.token_bytes(ids[-1])):
            with pytest.raises(IndexError, match=expected if decode in (tok.decode,) else "outside the vocabulary"):
                decode(ids)  # decode([-1]) gave '' (char) and '�' (tiktoken); [vocab_size] a bare IndexError
