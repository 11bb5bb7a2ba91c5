"""Text a user gives a model is converted only where it is not already in the model's script."""
import pytest
import torch

from data.bpe import learn_ranks, write_ranks
from data.tokenizer import CharTokenizer, TiktokenTokenizer, load_encoding, tokenizer_from_state
from data.verse.poetry import split_lines
from data.verse.script import corpus_to_script, not_in_script, prompt_to_script
from model.training.lit import LitGPT
from tests.conftest import POEMS

MODEL = {"block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 16}
LINES = ["萬里長征人未還。", "余亦能高詠，"]  # the corpus's own lines (traditional)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return write_ranks(learn_ranks(POEMS, 256 + 32), tmp_path_factory.mktemp("bpe") / "poems.tiktoken")


def lit(script, kind, ranks):
    texts = corpus_to_script(POEMS + LINES, script)
    tok = (CharTokenizer.from_texts(texts) if kind == "char" else
           TiktokenTokenizer.from_texts(load_encoding(str(ranks)), texts, str(ranks)))
    torch.manual_seed(0)
    return LitGPT(MODEL, {}, tok.state_dict(), script=script)


@pytest.mark.parametrize("kind", ["char", "tiktoken"])
def test_text_already_in_the_model_script_is_not_altered(kind, ranks):
    traditional = lit("traditional", kind, ranks)
    for line in LINES:  # s2t gave 萬裏長徵人未還 and 餘亦能高詠
        assert traditional.engine.to_model_text(line) == line
    assert traditional.engine.to_model_text("万里长征人未还.") == "萬里長征人未還。"  # simplified in: converted
    simplified = lit("simplified", kind, ranks)
    assert simplified.engine.to_model_text("万里长征人未还。") == "万里长征人未还。"
    assert simplified.engine.to_model_text("萬里長征人未還。") == "万里长征人未还。"
    assert simplified.engine.to_model_text("余亦能高咏，") == "余亦能高咏，"


def test_without_the_model_characters_only_characters_foreign_to_the_script_change():
    """The rule for BPE checkpoints saved before tokenizers recorded their characters."""
    for line in LINES:
        assert prompt_to_script(line, "traditional") == line
    assert prompt_to_script("万里长征人未还", "traditional") == "万里長征人未還"  # 万 is traditional too (万俟)
    assert prompt_to_script("头发理发", "traditional") == "頭髮理髮"  # OpenCC's phrases choose in context
    outside = not_in_script("traditional")
    assert {"长", "还", "咏"} <= outside and not {"万", "里", "余", "峰", "征"} & outside
    assert {"萬", "後", "長"} <= not_in_script("simplified") and not {"乾", "余", "万"} & not_in_script("simplified")


def test_bpe_tokenizer_records_the_characters_it_was_built_from(ranks):
    enc = load_encoding(str(ranks))
    tok = TiktokenTokenizer.from_texts(enc, POEMS, str(ranks))
    assert tok.known_characters == CharTokenizer.from_texts(POEMS).known_characters
    assert tokenizer_from_state(tok.state_dict()).known_characters == tok.known_characters
    old = {k: v for k, v in tok.state_dict().items() if k != "chars"}  # saved by an older version
    assert tokenizer_from_state(old).known_characters is None


def unchanged_share(lines, script, known):
    changed = [line for line in lines if prompt_to_script(line, script, known) != line]
    return 1 - len(changed) / len(lines), changed


@pytest.mark.parametrize("script", ["traditional", "simplified"])
def test_corpus_lines_normalised_in_their_own_script_come_back_unchanged(corpus_texts, script):
    """docs/sampling.md's claims: with the model's characters (both tokenizers record them) every line
    of the corpus comes back unchanged; OpenCC's dictionaries alone (older BPE checkpoints) keep
    all simplified lines and 98.9 % of the traditional ones (its variants 却, 荆, 迹, ... count
    as simplified)."""
    texts = corpus_to_script(corpus_texts, script)
    lines = [line for text in texts for line in split_lines(text)]
    assert len(lines) == 441_467
    share, changed = unchanged_share(lines, script, CharTokenizer.from_texts(texts).known_characters)
    assert share == 1.0 and changed == []
    share, changed = unchanged_share(lines, script, None)
    assert share >= (0.989 if script == "traditional" else 1.0), (share, changed[:5])
