"""The inference engine: the step API a viewer reads (attention rows, probabilities, allowed
tokens), loading a checkpoint without Lightning."""
import pytest
import torch

from data.tokenizer import CharTokenizer
from model.attention import BACKENDS
from model.engine import Engine
from model.gpt import GPT, GPTConfig
from model.loading import load_engine
from model.training.lit import LitGPT
from tests.conftest import POEMS, engine_of


def tiny(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(**{"vocab_size": 50, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32,
                            "pos_emb": "rope", **kw})).eval()


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("backend", BACKENDS)
def test_step_attention_rows_are_the_naive_weights_of_the_position_that_predicted_the_token(backend, use_cache):
    gpt, naive = tiny(backend=backend), tiny(backend="naive")
    start = torch.randint(0, 50, (2, 3), generator=torch.Generator().manual_seed(1))
    steps = list(engine_of(gpt).steps(start, 10, use_cache=use_cache, attention_rows=True))
    seq = torch.cat([start, *(s.ids for s in steps)], dim=1)  # (2, 13)
    maps = naive.attention_maps(seq)  # n_layer × (2, n_head, 13, 13): a full naive forward
    assert len(steps) == 10
    for t, step in enumerate(steps):
        pos = start.size(1) - 1 + t  # the last position fed before token t was drawn
        assert len(step.attention_rows) == 2
        for layer, rows in enumerate(step.attention_rows):
            assert rows.shape == (2, 2, pos + 1)
            torch.testing.assert_close(rows, maps[layer][:, :, pos, :pos + 1], rtol=0, atol=1e-5)


def test_a_step_says_the_token_its_probability_and_what_the_processors_allowed():
    gpt = tiny()
    engine = engine_of(gpt)
    allowed = torch.zeros(50, dtype=torch.bool)
    allowed[[5, 9, 20]] = True

    def only(idx, logits):  # a constraint: three tokens
        return logits.masked_fill(~allowed, float("-inf"))

    start = torch.zeros(1, 1, dtype=torch.long)
    steps = list(engine.steps(start, 4, processors=[only]))
    seq = torch.cat([start, *(s.ids for s in steps)], dim=1)
    logits = gpt(seq[:, :-1])  # (1, 4, 50)
    for t, step in enumerate(steps):
        i = int(step.ids[0, 0])
        assert i in (5, 9, 20) and step.tokens == [engine.tokenizer.label(i)] and step.attention_rows is None
        assert torch.equal(step.allowed[0], allowed)
        torch.testing.assert_close(step.prob, logits[:, t].softmax(-1)[:, i])  # the model's own probability
    assert next(engine.steps(start, 1)).allowed is None  # no processors: nothing to say


def test_an_engine_refuses_a_tokenizer_of_another_vocabulary():
    with pytest.raises(ValueError, match="50 ids, the tokenizer 4"):
        Engine(tiny(), CharTokenizer("床前"))


@pytest.mark.parametrize("asked", [{"head": "tied"}, {"head": "adaptive", "head_cutoffs": [2000, 4000]}])
def test_a_checkpoint_loads_into_an_engine_without_lightning(tmp_path, asked):
    """The adaptive request is a checkpoint of a small vocabulary saved before the head was decided
    at config time: it loads with the tied head it was trained with."""
    tok = CharTokenizer.from_texts(POEMS)
    torch.manual_seed(0)
    lit = LitGPT({"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16, "pos_emb": "rope", **asked}, {},
                 tok.state_dict(), script="traditional")
    path = tmp_path / "last.ckpt"
    torch.save({"hyper_parameters": dict(lit.hparams), "state_dict": lit.state_dict()}, path)
    engine = load_engine(path, backend="naive")
    assert engine.script == "traditional" and engine.tokenizer.state_dict() == tok.state_dict()
    assert engine.model.cfg.backend == "naive" and not engine.model.training and engine.model.cfg.head == "tied"
    idx, tokens = engine.encode_line("床前明月光", "prompt")
    assert tokens == ["<bos>", *"床前明月光"]
    torch.testing.assert_close(engine.model(idx), lit.eval().gpt(idx))
    with pytest.raises(FileNotFoundError, match="not found; train one with `python train.py`"):
        load_engine(tmp_path / "missing.ckpt")
