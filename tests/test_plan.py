"""Plan tokens (data.plan_tokens=true): framing, tokenizers, val/bpc, the grammar, soft/hard/both control."""
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from data.bpe import learn_ranks, write_ranks
from data.datamodule import PoetryDataModule
from data.tokenizer import CharTokenizer, TiktokenTokenizer, load_encoding, tokenizer_from_state
from data.verse.meter import OBLIQUE, matching_patterns, poem_lines, tones
from data.verse.plan import FORM_LABELS, NO_RHYME, PLAN_SLOTS, plan_ids, plan_labels, poem_plan, poem_rhyme_groups
from data.verse.poetry import FORMS, form_of
from data.verse.rhyme import level_tone_table, rhyme_groups
from data.verse.script import corpus_to_script
from data.windows import IGNORE, PoemWindows
from model.decoding import sampler
from model.gpt import GPT, GPTConfig
from model.inspection.evaluation import sample_requests
from model.inspection.head_effects import KINDS, HeadScorer
from model.inspection.poem_metrics import plan_match
from model.kv_cache import Cache
from model.loading import load_engine
from model.sampling.grammar import PlanGrammar, plan_grammar, poem_boundaries
from model.sampling.poems import SamplingOptions, read_plans, sample_ids, sample_poems
from model.training.lit import LitGPT
from model.training.validation import validation_metrics
from tests.conftest import POEMS

SIMPLIFIED = corpus_to_script(POEMS, "simplified")
JINGYESI, DENG_GUANQUE_LOU, CHUNXIAO, JIANGXUE = SIMPLIFIED[:4]


def plan_lit(block_size=80, plan=True, seed=0):
    """An untrained model over the test poems' characters, with plan tokens unless plan=False."""
    tok = CharTokenizer.from_texts(SIMPLIFIED, plan_labels() if plan else ())
    torch.manual_seed(seed)
    return LitGPT(dict(block_size=block_size, n_layer=1, n_head=2, n_embd=16), {}, tok.state_dict()).eval()


@pytest.fixture(scope="module")
def lit():
    return plan_lit()


def test_plans_of_hand_made_and_famous_poems():
    assert len(plan_labels()) == 5 + 30 + 1 and plan_labels()[:5] == tuple(FORM_LABELS.values())
    assert poem_plan(JINGYESI, "wujue", "simplified") == ("<五绝>", "<下平聲七陽>")  # 霜, 乡
    assert poem_plan(DENG_GUANQUE_LOU, "wujue", "simplified") == ("<五绝>", "<下平聲十一尤>")  # 流, 楼
    assert poem_plan(CHUNXIAO, "wujue", "simplified") == ("<五绝>", NO_RHYME)  # 鸟, 少: oblique rhymes
    assert poem_plan(JIANGXUE, "wujue", "simplified") == ("<五绝>", NO_RHYME)  # 灭, 雪: 入声
    assert poem_plan(SIMPLIFIED[5], "qijue", "simplified") == ("<七绝>", "<上平聲十五刪>")  # 间, 还, 山
    assert poem_plan("床前明月光，疑是地上霜。", "other", "simplified") == ("<其他>", NO_RHYME)  # one even line
    assert poem_plan("白日依山尽，黄河入海流。欲穷千里目，更上一层天。", "wujue", "simplified")[1] == NO_RHYME
    # 行 reads in 下平聲七陽 and 下平聲八庚: of several shared groups, the first in table order
    assert poem_rhyme_groups("春来独自行，山中独自行。夜来独自行，花落独自行。", "simplified") == {
        "下平聲七陽", "下平聲八庚"}
    assert poem_plan("春来独自行，山中独自行。夜来独自行，花落独自行。", "other", "simplified")[1] == "<下平聲七陽>"
    assert poem_plan(POEMS[1], "wujue", "traditional")[1] == "<下平聲十一尤>"  # 流, 樓
    with pytest.raises(ValueError, match="sonnet"):
        poem_plan(JINGYESI, "sonnet", "simplified")


@pytest.fixture(scope="module")
def ranks_file(tmp_path_factory):
    return write_ranks(learn_ranks(POEMS, 256 + 64), tmp_path_factory.mktemp("bpe") / "poems.tiktoken")


def both_tokenizers(ranks_file, plan=plan_labels()):
    return [CharTokenizer.from_texts([*SIMPLIFIED, "<>七律无韵"], plan),
            TiktokenTokenizer.from_texts(load_encoding(str(ranks_file)), SIMPLIFIED, str(ranks_file), plan)]


def test_framing_round_trip_in_both_tokenizers(ranks_file):
    for tok, plain in zip(both_tokenizers(ranks_file), both_tokenizers(ranks_file, ())):
        assert tok.plan_start == plain.vocab_size and tok.vocab_size == plain.vocab_size + 36
        ids = plan_ids(tok)
        framed = [tok.bos_id, ids.forms["wujue"], ids.rhymes["下平聲十一尤"], *tok.encode(DENG_GUANQUE_LOU), tok.eos_id]
        assert tok.decode(framed) == DENG_GUANQUE_LOU
        assert tok.decode(framed, skip_specials=False) == f"<bos><五绝><下平聲十一尤>{DENG_GUANQUE_LOU}<eos>"
        assert [tok.label(i) for i in framed[:3]] == ["<bos>", "<五绝>", "<下平聲十一尤>"]
        assert tok.encode(DENG_GUANQUE_LOU) == plain.encode(DENG_GUANQUE_LOU)  # text ids unchanged
        assert all(tok.token_bytes(i) == b"" for i in ids.all)
        assert tok.char_counts[tok.plan_start:] == [0] * 36 and tok.char_counts[:tok.plan_start] == plain.char_counts
        assert sum(tok.char_counts[i] for i in framed) == len(DENG_GUANQUE_LOU)
        assert ids.read(framed) == {"form": "wujue", "rhyme": "下平聲十一尤"}
        again = tokenizer_from_state(json.loads(json.dumps(tok.state_dict(), ensure_ascii=False)))
        assert again.plan == tok.plan and again.decode(framed, skip_specials=False) == tok.decode(framed, False)
        assert "plan" not in plain.state_dict() and tokenizer_from_state(plain.state_dict()).plan == ()
    char = both_tokenizers(ranks_file)[0]
    assert not set(char.encode("<七律><无韵>")) & set(plan_ids(char).all)  # user text never yields a plan id
    assert "<七律>" not in char.known_characters and char.stoi.get("<七律>") is None


def test_a_tokenizer_state_without_plan_loads_as_before():
    old = {"itos": ["<bos>", "<eos>", *sorted(set("".join(SIMPLIFIED)))]}  # a checkpoint older than "kind"
    tok = tokenizer_from_state(old)
    assert tok.plan == () and tok.vocab_size == len(old["itos"]) and plan_ids(tok) is None
    assert tok.state_dict() == {"kind": "char", "itos": old["itos"]}


def make_dm(corpus, tmp_path, **kw):
    return PoetryDataModule(str(corpus), str(tmp_path / "cache"), **{"block_size": 16, "batch_size": 4, **kw})


def test_data_module_frames_every_poem_with_its_plan(tiny_corpus, tmp_path):
    plain, planned = make_dm(tiny_corpus, tmp_path), make_dm(tiny_corpus, tmp_path, plan_tokens=True)
    assert plain.cache_dir != planned.cache_dir and planned.meta["plan_tokens"] and "plan_tokens" not in plain.meta
    tok = planned.tokenizer
    assert tok.plan == plan_labels() and tok.state_dict()["itos"] == plain.tokenizer.state_dict()["itos"]
    train = planned.tokens("train")
    first = tok.decode(train[: len(POEMS[0]) + 4].tolist(), skip_specials=False)
    assert first == f"<bos><五绝><下平聲七陽>{JINGYESI}<eos>"
    for split in ("train", "val"):
        assert planned.meta[split]["characters"] == plain.meta[split]["characters"]
        assert planned.meta[split]["tokens"] == plain.meta[split]["tokens"] + PLAN_SLOTS * plain.meta[split]["poems"]
    ids = plan_ids(tok)
    starts = np.flatnonzero(train == tok.bos_id)
    assert [tok.label(i) for i in train[starts[:6] + 1]] == ["<五绝>"] * 5 + ["<七绝>"]
    assert [tok.label(i) for i in train[starts[:6] + 2]] == [
        "<下平聲七陽>", "<下平聲十一尤>", NO_RHYME, NO_RHYME, "<上平聲四支>", "<上平聲十五刪>"]
    x, y = PoemWindows(planned.tokens("val"), 16)[0]  # windows start at <bos>: the plan is at positions 1–2
    assert x[0] == tok.bos_id and y[0] == ids.forms["wujue"] and y[1] == ids.rhymes["下平聲七陽"]


def test_inspection_reads_a_poem_as_the_model_was_trained_on_it(lit, tiny_corpus, tmp_path):
    engine, tok = lit.engine, lit.engine.tokenizer
    ids = plan_ids(tok)
    framed = [tok.bos_id, ids.forms["wujue"], ids.rhymes["下平聲七陽"], *tok.encode(JINGYESI), tok.eos_id]
    assert engine.poem_ids(JINGYESI) == framed and engine.poem_ids(corpus_to_script([JINGYESI], "traditional")[0]) == framed
    dm = make_dm(tiny_corpus, tmp_path, plan_tokens=True)
    assert dm.tokens("train")[: len(framed)].tolist() == framed  # the data module frames it the same way
    idx, labels = engine.encode_line("床前明月光，疑是地上霜。")
    assert labels == ["<bos>", "<其他>", NO_RHYME, *"床前明月光，疑是地上霜。"] and idx[0].tolist() == engine.poem_ids(
        "床前明月光，疑是地上霜。", eos=False)
    scorer = HeadScorer(engine, [JINGYESI])
    batch, _, kinds = scorer.batches[0]
    assert batch[0].tolist() == framed
    assert dict(zip(KINDS, scorer.counts.tolist())) == {"all": len(framed) - 1, "rhyme_slot": 2, "line_start": 4,
                                                        "mark": 4, "eos": 1}
    plain = plan_lit(plan=False).engine
    assert plain.poem_ids(JINGYESI) == plain.tokenizer.encode(JINGYESI, bos=True, eos=True)


@pytest.mark.parametrize("head", ["tied", "adaptive"])
def test_per_position_nats_sum_to_the_mean_loss(head):
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=60, block_size=8, n_layer=1, n_head=2, n_embd=16, head=head, head_cutoffs=(20,)))
    x, y = torch.randint(0, 60, (3, 8)), torch.randint(0, 60, (3, 8))
    y[0, :3] = IGNORE
    mean, nats = m.loss(x, y), m.nats(x, y)
    assert nats.shape == (3, 8) and (nats[0, :3] == 0).all() and (nats[y != IGNORE] > 0).all()
    torch.testing.assert_close(nats.sum() / (y != IGNORE).sum(), mean)


def test_val_bpc_counts_the_plan_nats_over_the_same_characters(tiny_corpus, tmp_path):
    dm = make_dm(tiny_corpus, tmp_path, plan_tokens=True)
    tok = dm.tokenizer
    torch.manual_seed(0)
    lit = LitGPT(dict(block_size=16, n_layer=1, n_head=2, n_embd=16), {}, tok.state_dict())
    got = validation_metrics(lit.engine, dm)
    dm.setup("validate")
    total = text = 0.0
    with torch.no_grad():
        for x, y in dm.val_dataloader():
            logits = lit.gpt(x)
            nats = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction="none")
            total += nats.sum().item()
            text += nats[(y.flatten() != IGNORE) & (y.flatten() < tok.plan_start)].sum().item()
    chars = make_dm(tiny_corpus, tmp_path).meta["val"]["characters"]  # the same characters as without plan tokens
    assert got["val/bpc"] == pytest.approx(total / chars / math.log(2), rel=1e-4)
    assert got["val/bpc_text"] == pytest.approx(text / chars / math.log(2), rel=1e-4)
    assert got["val/bpc"] > got["val/bpc_text"] + 0.1  # the plan's nats are in val/bpc only


def test_the_grammar_puts_a_form_then_a_rhyme_after_bos_and_plan_tokens_nowhere_else():
    # ids: 0 <bos>, 1 <eos>, 2 月, 3 。, 4–5 forms, 6 a rhyme group, 7 <无韵>
    forms = torch.tensor([0, 0, 0, 0, 1, 1, 0, 0], dtype=torch.bool)
    plan = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1], dtype=torch.bool)
    rhymes = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1], dtype=torch.bool)
    # after <bos>, a form, a form, a rhyme, a character; and after a given condition segment (characters, no form yet)
    idx = torch.tensor([[2, 2, 0], [2, 0, 5], [2, 0, 4], [0, 5, 6], [5, 6, 2], [0, 2, 2]])
    out = PlanGrammar(forms, rhymes, plan, bos_id=0)(idx, torch.zeros(6, 8))
    allowed = [torch.isfinite(row).nonzero().flatten().tolist() for row in out]
    assert allowed == [[4, 5], [6, 7], [6, 7], [0, 1, 2, 3], [0, 1, 2, 3], [4, 5]]
    real = PlanGrammar(forms, rhymes & ~torch.tensor([0, 0, 0, 0, 0, 0, 0, 1], dtype=torch.bool), plan, 0)
    assert torch.isfinite(real(idx[1:2], torch.zeros(1, 8))[0]).nonzero().flatten().tolist() == [6]


def test_free_sampling_draws_the_plan_first_and_never_shows_it(lit):
    tok, ids = lit.tokenizer, plan_ids(lit.tokenizer)
    rows = sample_ids(lit.engine, SamplingOptions(num_samples=40, max_new_tokens=30, temperature=1.0, top_k=None))
    assert set(rows[:, 1].tolist()) <= set(ids.forms.values()) and len(set(rows[:, 1].tolist())) > 2
    assert set(rows[:, 2].tolist()) <= {*ids.rhymes.values(), ids.none}
    assert not (rows[:, 3:] >= tok.plan_start).any()  # no plan token after the plan
    poems = sample_poems(lit.engine, SamplingOptions(num_samples=40, max_new_tokens=30, temperature=1.0, top_k=None))
    assert poems == [tok.decode(row[3:].tolist()) for row in rows] and not any("<" in p for p in poems)
    assert read_plans(tok, rows)[0] == ids.read(rows[0].tolist()) and read_plans(plan_lit(plan=False).tokenizer,
                                                                                  rows[:, :1]) is None


def test_a_prompt_follows_the_drawn_plan(lit):
    tok = lit.tokenizer
    rows = sample_ids(lit.engine, SamplingOptions(prompt="床前明月光", num_samples=6, max_new_tokens=20))
    assert (rows[:, 3:8] == torch.tensor(tok.encode("床前明月光"))).all()
    assert all(tok.is_plan(i) for i in rows[:, 1:3].flatten().tolist())


def test_soft_control_gives_the_plan_as_the_prompt_and_masks_nothing_in_the_poem(lit):
    tok, ids = lit.tokenizer, plan_ids(lit.tokenizer)
    opts = SamplingOptions(num_samples=20, max_new_tokens=30, seed=3, form="wujue", rhyme=True, control="soft")
    rows = sample_ids(lit.engine, opts)
    assert (rows[:, 1] == ids.forms["wujue"]).all() and set(rows[:, 2].tolist()) <= set(ids.rhymes.values())
    start = torch.tensor([[tok.bos_id, ids.forms["wujue"]]] * 20)
    gen = torch.Generator().manual_seed(3)
    grammar = plan_grammar(tok, tuple(ids.rhymes.values()))
    draw = sampler(opts.temperature, opts.top_k, opts.top_p, gen, unfiltered=grammar.plan)  # the plan unfiltered
    steps = lit.engine.stream(start, 30, draw, tok.eos_id, True, [poem_boundaries(tok), grammar])
    assert torch.equal(rows, torch.cat([start, *steps], dim=1))  # only the poem rules and the plan grammar
    assert sum(form_of(p) == "wujue" for p in sample_poems(lit.engine, opts)) < 5  # untrained: the plan alone is no form
    with pytest.raises(ValueError, match="form=wupai has no plan token .* use control=hard or both"):
        sample_poems(lit.engine, SamplingOptions(form="wupai", control="soft", max_new_tokens=100))  # the 排律: masks only


@pytest.mark.parametrize("control", ["hard", "both"])
def test_hard_control_keeps_the_form_and_rhymes_in_the_plan_group(lit, control):
    tok = lit.tokenizer
    opts = SamplingOptions(num_samples=60, max_new_tokens=40, temperature=1.0, top_k=None, form="wujue",
                           rhyme=True, control=control)
    rows = sample_ids(lit.engine, opts)
    poems, plans = [tok.decode(r.tolist()) for r in rows], read_plans(tok, rows)
    assert [form_of(p) for p in poems] == ["wujue"] * 60 and all(poem_rhyme_groups(p, "simplified") for p in poems)
    drawn = [p for p in plans if p["rhyme"]]
    assert len(drawn) > 10 and all(p["rhyme"] in poem_rhyme_groups(q, "simplified") for p, q in zip(plans, poems)
                                   if p["rhyme"])
    if control == "both":  # the form token given, the rhyme slot a real group
        assert {p["form"] for p in plans} == {"wujue"} and len(drawn) == 60
        assert plan_match(poems, plans, "simplified") == {"plan_form": 1.0, "plan_rhyme": 1.0}
    else:  # the plan is the model's: drawn freely
        assert len({p["form"] for p in plans}) > 1


def test_meter_keeps_the_plan_group_on_a_rhymed_first_line(lit):
    """meter=true (both): the tone patterns hold, the even lines rhyme in the plan's group, and a
    first line ending in a level tone outside that group does so only with a character that is
    also oblique (read as 仄: the first line unrhymed)."""
    rows = sample_ids(lit.engine, SamplingOptions(num_samples=30, max_new_tokens=40, temperature=1.0, top_k=None,
                                           form="wujue", meter=True))
    poems, plans = [lit.tokenizer.decode(r.tolist()) for r in rows], read_plans(lit.tokenizer, rows)
    for poem, plan in zip(poems, plans):
        lines = poem_lines(poem)
        assert matching_patterns(lines, "wujue", "simplified") and plan["rhyme"] in poem_rhyme_groups(poem, "simplified")
        first = lines[0][-1]
        assert (plan["rhyme"] in rhyme_groups(first, "simplified").get(first, ())
                or OBLIQUE in tones(first, "simplified")[first])


def test_control_errors_are_one_line_and_early(lit):
    plain = plan_lit(plan=False)
    with pytest.raises(ValueError, match="control=soft needs a model trained with plan tokens"):
        sample_poems(plain.engine, SamplingOptions(form="wujue", control="soft"))
    with pytest.raises(ValueError, match="control=both needs"):
        sample_poems(plain.engine, SamplingOptions(control="both"))
    with pytest.raises(ValueError, match="control='firm' is not one of hard, soft, both"):
        sample_poems(lit.engine, SamplingOptions(control="firm"))
    with pytest.raises(ValueError, match="^meter is a mask, not a plan token: use control=hard"):  # names what was given
        sample_poems(lit.engine, SamplingOptions(form="wujue", meter=True, control="soft"))
    with pytest.raises(ValueError, match="^acrostic and meter are masks"):
        sample_poems(lit.engine, SamplingOptions(form="wujue", acrostic="春夏秋冬", meter=True, control="soft"))
    with pytest.raises(ValueError, match="unknown form 'sonnet'"):
        sample_poems(lit.engine, SamplingOptions(form="sonnet", control="soft"))
    with pytest.raises(ValueError, match="needs up to 67"):  # 七律: 64 tokens, <eos>, two plan tokens to draw
        sample_poems(lit.engine, SamplingOptions(form="qilv", control="hard", max_new_tokens=66))
    assert len(sample_poems(lit.engine, SamplingOptions(form="qilv", max_new_tokens=66))) == 1  # both: the form is given


@pytest.mark.parametrize("block_size, refilled", [(72, False), (64, True)])
def test_a_qilv_with_its_plan_fits_block_72_without_cropping(block_size, refilled, monkeypatch):
    """<bos>, two plan tokens, 56 characters, 8 marks, <eos>: 68 tokens. At block_size 72 the
    whole poem stays in one KV cache (never re-filled from its recent half); at 64 it would not."""
    lit = plan_lit(block_size=block_size)
    made = []
    monkeypatch.setattr("model.engine.Cache", lambda *a: made.append(Cache(*a)) or made[-1])
    rows = sample_ids(lit.engine, SamplingOptions(num_samples=2, max_new_tokens=70, form="qilv", rhyme=True))
    assert rows.shape[1] == 68 and (rows[:, -1] == lit.tokenizer.eos_id).all()
    assert [form_of(lit.tokenizer.decode(r.tolist())) for r in rows] == ["qilv"] * 2 and len(made) == 1
    assert (made[0].length < made[0].ids.size(1)) == refilled  # a refill keeps only the recent half in the layers


def test_an_old_checkpoint_without_plan_tokens_loads_and_samples(tmp_path):
    plain = plan_lit(plan=False)
    path = tmp_path / "old.ckpt"
    torch.save({"hyper_parameters": dict(plain.hparams), "state_dict": plain.state_dict()}, path)
    engine = load_engine(path)
    assert engine.tokenizer.plan == () and "plan" not in engine.tokenizer.state_dict()
    assert [form_of(p) for p in sample_poems(engine, SamplingOptions(num_samples=2, form="wujue"))] == ["wujue"] * 2


def test_soft_sets_only_for_plan_models():
    assert sample_requests(["free", "soft"], ["wujue"], plan_model=True) == {
        "free": {}, "wujue+soft": {"form": "wujue", "rhyme": True, "control": "soft"}}
    assert sample_requests(["free", "soft"], ["wujue"]) == {"free": {}}
    assert list(sample_requests(["soft", "form"], ["qilv"], char_model=False, plan_model=True)) == ["qilv+soft"]


def test_plan_match_counts_the_poems_that_keep_their_plan():
    poems = [DENG_GUANQUE_LOU, CHUNXIAO, JINGYESI, "床前明月光，疑是地上霜。"]
    plans = [{"form": "wujue", "rhyme": "下平聲十一尤"}, {"form": "wujue", "rhyme": None},
             {"form": "qilv", "rhyme": "下平聲十一尤"}, None]
    assert plan_match(poems, plans, "simplified") == {"plan_form": 2 / 3, "plan_rhyme": 2 / 3}
    assert plan_match(poems, [None] * 4, "simplified") == {"plan_form": None, "plan_rhyme": None}
    assert set(FORM_LABELS) == {*FORMS, "other"} and len(level_tone_table()) == 30


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny training run with plan tokens (no logger: the callbacks that need one are off)."""
    import train as train_script
    from tests.conftest import make_train_cfg, write_corpus

    tmp_path = tmp_path_factory.mktemp("plan_run")
    with pytest.MonkeyPatch.context() as mp:
        cfg = make_train_cfg(tmp_path, write_corpus(tmp_path / "corpus" / "tang.jsonl.xz"), mp)(
            "data.plan_tokens=true", "logger=none", "trainer.max_steps=10", "trainer.val_check_interval=5")
        metrics = train_script.train(cfg)
    return cfg, metrics, tmp_path


def test_a_plan_model_trains_logs_bpc_text_samples_and_evaluates(trained, capsys):
    import io

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import evaluate as evaluate_script
    import sample as sample_script
    from tests.conftest import ROOT, compose_sample

    cfg, metrics, tmp_path = trained
    assert metrics["val/bpc"] > metrics["val/bpc_text"] > 0
    ckpt = tmp_path / "checkpoints" / "test" / "last.ckpt"
    out = io.StringIO()
    poems = sample_script.sample(OmegaConf.merge(compose_sample(), {
        "ckpt_path": str(ckpt), "num_samples": 3, "format": "jsonl", "form": "wujue", "rhyme": True,
        "paths": {"checkpoint_dir": str(ckpt.parent.parent)}}), out)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["poem"] for r in records] == poems and all(form_of(p) == "wujue" and "<" not in p for p in poems)
    assert all(r["plan"]["form"] == "wujue" and r["plan"]["rhyme"] in level_tone_table() for r in records)
    assert all(r["plan"]["rhyme"] in poem_rhyme_groups(p, "simplified") for r, p in zip(records, poems))
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        ecfg = compose("evaluate", overrides=[
            f"ckpt_path={ckpt}", f"paths.log_dir={tmp_path / 'logs'}", f"data.corpus_path={cfg.data.corpus_path}",
            f"data.cache_dir={cfg.data.cache_dir}", "num_samples=4", "sets=[free,soft]", "forms=[wujue]",
            "reference=6", "max_new_tokens=40"])
    report = evaluate_script.evaluate(ecfg)
    assert list(report["rows"]) == ["human (held-out)", "free", "wujue+soft"]
    assert report["rows"]["free"]["plan_form"] is not None and report["rows"]["human (held-out)"]["plan_form"] is None
    assert len(report["plans"]["free"]) == 4 and report["plans"]["wujue+soft"][0]["form"] == "wujue"
    assert report["val"]["val/bpc_text"] == pytest.approx(metrics["val/bpc_text"], rel=1e-5)
    evaluate_script.main.__wrapped__(ecfg)
    printed = capsys.readouterr().out
    assert "pl-form" in printed and f"val/bpc_text {metrics['val/bpc_text']:.4f}" in printed


def test_the_plan_is_drawn_as_the_model_gives_it_whatever_top_k_and_top_p(lit):
    """top_k=1 and top_p=0.01 leave the text one token a step, but the form and rhyme tokens are
    drawn from the model's distribution: an untrained model draws many plans."""
    opts = SamplingOptions(num_samples=40, max_new_tokens=12, seed=0, temperature=1.0, top_k=1, top_p=0.01)
    plans = read_plans(lit.tokenizer, sample_ids(lit.engine, opts))
    assert len({p["form"] for p in plans}) >= 3 and len({p["rhyme"] for p in plans}) >= 5
