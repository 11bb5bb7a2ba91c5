"""The poem inputs (`poem_inputs`): the per-vocabulary tables (data/features.py), the network's
phonology and structure embeddings and auxiliary rhyme loss, the KV cache and the backends
with them, checkpoints with them."""
import pytest
import torch
import torch.nn.functional as F

from data.features import PAD, READINGS, full_stops, group_ids, phonology_tables, token_kinds
from data.tokenizer import CharTokenizer
from model.attention import BACKENDS
from model.gpt import GPT, GPTConfig
from model.kv_cache import Cache
from tests.conftest import generate

V = 60


def test_group_ids_number_the_thirty_level_tone_groups_in_table_order():
    ids = group_ids()
    assert len(ids) == 30 and ids["上平聲一東"] == 1 and ids["下平聲七陽"] == 22 and ids["下平聲十五咸"] == 30


def test_tables_of_known_characters():
    tok = CharTokenizer("光霜乡看月，。1")
    t = phonology_tables(tok, "simplified")
    row = {c: (t.groups[tok.stoi[c]], t.tones[tok.stoi[c]]) for c in "光霜乡看月，。1"}
    yang = [22, PAD, PAD, PAD]
    assert row["光"] == (yang, 1) and row["霜"] == (yang, 1)
    assert row["乡"] == (yang, 3)  # also 去聲二十三漾: both tones
    assert row["看"] == ([group_ids()["上平聲十四寒"], PAD, PAD, PAD], 3)
    assert row["月"] == ([0, PAD, PAD, PAD], 2)  # 入聲六月 only: no level-tone group
    assert row["，"] == ([0, PAD, PAD, PAD], 0) and row["1"] == ([0, PAD, PAD, PAD], 0)
    kinds = token_kinds(tok)
    assert kinds[:2] == [1, 2] and [kinds[tok.stoi[c]] for c in "光，。1"] == [0, 3, 3, 0]
    assert t.groups[0] == [0, PAD, PAD, PAD] and t.tones[0] == 0  # <bos>
    assert len(t.groups) == tok.vocab_size and all(len(g) == READINGS for g in t.groups)


def test_a_tokenizer_with_tune_tokens_also_gets_the_oblique_cilin_classes():
    from data.features import GROUPS, OBLIQUE_CLASSES, group_count
    from data.verse.plan import plan_labels
    from model.loading import build_gpt

    plain, tuned = CharTokenizer("乡月雪光"), CharTokenizer.from_texts(["乡月雪光"], plan=plan_labels(tunes=True))
    assert group_count(plain) == GROUPS == 31 and group_count(tuned) == GROUPS + OBLIQUE_CLASSES == 50
    t = phonology_tables(tuned, "simplified")
    row = {c: t.groups[tuned.stoi[c]] for c in "乡月雪光"}
    assert row["月"] == [GROUPS + 18 - 1, PAD, PAD, PAD] == row["雪"]  # 入聲 月 and 屑: 18部仄
    assert row["乡"] == [22, GROUPS + 2 - 1, PAD, PAD]  # 下平聲七陽, and 漾 in 2部仄
    assert row["光"] == [22, PAD, PAD, PAD]
    assert phonology_tables(plain, "simplified").groups[plain.stoi["月"]] == [0, PAD, PAD, PAD]
    model = {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "poem_inputs": True, "rhyme_loss_weight": 0.1}
    gpt = build_gpt(model, tuned)
    assert gpt.cfg.rhyme_groups == 50 and gpt.poem.wge.num_embeddings == 50 and gpt.poem.rhyme_head.out_features == 50
    assert build_gpt(model, plain).poem.wge.num_embeddings == 31


KINDS = torch.tensor([1, 2, *[3 if i % 7 == 0 else 0 for i in range(2, V)]])  # <bos> 0, <eos> 1, marks 7, 14, …


def tiny(backend="naive", block_size=80, **kw):
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=V, block_size=block_size, n_layer=2, n_head=2, n_embd=32, backend=backend,
                      poem_inputs=True, **kw)).eval()
    g = torch.Generator().manual_seed(3)
    groups = torch.randint(0, 31, (V, 4), generator=g)
    groups[:, 1:][torch.rand(V, 3, generator=g) < 0.7] = -1  # most tokens one reading, some several
    m.poem.set_phonology(groups, torch.randint(0, 4, (V,), generator=g))
    m.poem.set_token_kinds(KINDS)
    m.poem.set_full_stops(torch.arange(V) % 14 == 0)  # marks 14, 28, …: full stops; 7, 21, …: commas
    return m


def test_the_features_change_the_logits_and_a_polyphonic_token_gets_the_mean_of_its_readings():
    m = tiny()
    idx = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = m(idx)
        m.poem.wge.weight.zero_(), m.poem.wtone.weight.zero_()
        assert not torch.allclose(plain, m(idx))
        m.poem.wge.weight.copy_(torch.arange(31.0)[:, None].expand(31, 32))  # group i's embedding: all i
        m.poem.phon_group_ids[5] = torch.tensor([2, 6, -1, -1])
        assert torch.equal(m.poem.output_rows(torch.tensor([[5]]))[0, 0], torch.full((32,), 4.0))  # (2 + 6) / 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_kv_cache_and_every_backend_give_the_logits_of_a_naive_full_forward_with_the_poem_inputs(backend):
    m = tiny(backend)
    start = torch.randint(2, V, (3, 5), generator=torch.Generator().manual_seed(1))
    start[:, 0] = 0  # <bos>: the structure is known
    cached = generate(m, start, 64, temperature=0, use_cache=True)
    assert torch.equal(cached, generate(m, start, 64, temperature=0, use_cache=False))
    full = m(cached[:, :-1])  # (3, 68, V)
    torch.testing.assert_close(full, tiny("naive")(cached[:, :-1]), rtol=1e-5, atol=1e-5)
    cache = Cache(m.cfg.n_layer, m.cfg.block_size)
    steps = [m(cached[:, :5], cache=cache)] + [m(cached[:, t:t + 1], cache=cache) for t in range(5, 68)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)


def structure_of(text: str, history: str = "") -> list[tuple[int, int, int]]:
    """structure_ids of a character text ('^' <bos>, '$' <eos>) on a model of its vocabulary."""
    tok = CharTokenizer(sorted(set(text + history) - set("^$")))
    m = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=1, n_embd=8, poem_inputs=True))
    m.poem.set_token_kinds(torch.tensor(token_kinds(tok)))
    m.poem.set_full_stops(torch.tensor(full_stops(tok)))
    ids = [[tok.encode(c.replace("^", "").replace("$", ""), bos=c == "^", eos=c == "$")[0] for c in t]
           for t in (history, text)]
    got = m.poem.structure_ids(torch.tensor([ids[1]]), torch.tensor([ids[0]]) if history else None)  # (1, T, 3)
    return [tuple(r) for r in got[0].tolist()]


def test_structure_ids_of_a_hand_made_poem():
    got = structure_of("^床前明月光，疑是地上霜。举头望明月，低头思故乡。$")
    # the first line: line 1, length unknown (countdown 0, slot 1: first-line character), up to its mark
    assert got[:6] == [(1, 0, 1)] * 6
    assert got[6] == (2, 6, 2)  # after ，: 疑 is next, line 2 (second), 5 characters before the mark
    assert [g[1] for g in got[6:12]] == [6, 5, 4, 3, 2, 1]  # countdown to the mark
    assert got[10] == (2, 2, 4)  # after 疑是地上 the next token (霜) is the rhyme slot of an even line
    assert got[11] == (2, 1, 3)  # then the mark
    assert got[12] == (3, 6, 2) and got[16] == (3, 2, 2)  # line 3 is odd: its last character is no rhyme slot
    assert got[22] == (4, 2, 4)  # 乡's slot: the rhyme of line 4
    assert got[24] == (5, 6, 2)  # after the last mark: a fifth line could follow
    assert got[25] == (0, 0, 0)  # after <eos>: unknown


def test_structure_is_read_from_the_marks_where_no_poem_start_is_in_sight_and_from_the_history():
    text = "地上霜。举头望明月，低头思故乡。"  # a window that starts mid-poem
    got = structure_of(text)
    assert got[:3] == [(0, 0, 0)] * 3  # no mark yet: unknown
    assert got[3:9] == [(0, 0, 1)] * 6  # after 。: characters of a line of unknown length
    assert got[9] == (0, 6, 2)  # after ，: the line is as long as 举头望明月, 5 characters before the mark
    assert got[13] == (0, 2, 4) and got[14] == (0, 1, 3)  # 乡 next: a rhyme slot (the line after ，), then 。
    assert got[15] == (0, 6, 2)  # after 。 a couplet's first line: its last character is no rhyme slot
    assert structure_of("月，举头望明月。低头思故乡，")[11] == (0, 2, 2)  # after 。: not a rhyme slot
    whole = structure_of("^床前明月光，疑是" + text)  # the same lines with the poem's start in sight
    assert [g[1:] for g in got[9:]] == [g[1:] for g in whole[-7:]]  # the same countdowns and slots
    # a poem that starts inside the window is read from its <bos>; after an <eos>, unknown until one
    mixed = structure_of("月，低头思故乡。$^床前明月光，")
    assert mixed[8] == (0, 0, 0) and mixed[9:] == structure_of("^床前明月光，")
    with_history = structure_of(text[:6], history="^床前明月光，疑是")  # a refilled cache's history: the line ids too
    assert with_history == whole[-len(text):-len(text) + 6]
    assert with_history[0] == (2, 3, 2) and with_history[1] == (2, 2, 4)  # after 地, after 上 (霜 next)


@pytest.mark.parametrize("seq", [[0, 3, 4, 5, 7, 8, 9, 10, 14, 3, 4, 5, 6, 7, 8, 9],  # <bos>, marks at 7 and 14
                                 [5, 7, 8, 9, 10, 14, 3, 4, 5, 7, 8, 9, 10, 14, 3, 4]])  # a text that starts mid-poem
def test_the_cache_keeps_the_text_continues_the_structure_and_refills_itself(seq, monkeypatch):
    m, seq = tiny(block_size=16), torch.tensor([seq])
    cache = Cache(m.cfg.n_layer, m.cfg.block_size)
    m(seq[:, :8], cache=cache)
    torch.testing.assert_close(m(seq[:, 8:], cache=cache), m(seq)[:, 8:], rtol=1e-5, atol=1e-5)
    assert torch.equal(cache.ids, seq)
    assert torch.equal(m.poem.structure_ids(seq[:, 8:], seq[:, :8]), m.poem.structure_ids(seq)[:, 8:])
    assert not torch.equal(m.poem.structure_ids(seq[:, 8:]), m.poem.structure_ids(seq)[:, 8:])  # without: unknown
    caches = []
    monkeypatch.setattr("model.engine.Cache", lambda *a: caches.append(Cache(*a)) or caches[-1])
    out = generate(m, seq[:, :5], 20, temperature=0, use_cache=True)  # past block_size: refills
    assert out.shape == (1, 25) and len(caches) == 1  # one cache for the whole text
    # 24 tokens fed; at 17 it refilled with the last 8 (9 stay history), then took 7 more
    assert torch.equal(caches[0].ids, out[:, :24]) and caches[0].length == 15


def test_the_rhyme_loss_scores_the_even_lines_last_characters_only():
    m = tiny(rhyme_loss_weight=0.5)
    # <bos>, four lines of 3 characters, each with its mark (7 or 14): the rhyme slots are lines 2 and 4's last
    idx = torch.tensor([[0, 3, 4, 5, 7, 8, 9, 10, 14, 3, 4, 5, 7, 8, 9, 10]])
    y = torch.cat([idx[:, 1:], torch.tensor([[14]])], dim=1)  # targets: the next tokens
    x = m._hidden(idx)
    slots = [6, 14]  # positions whose target is 10 (line 2's last) and 10 (line 4's last), not 2 and 10 (odd lines')
    assert m.poem.structure_ids(idx)[0, :, 2].eq(4).nonzero()[:, 0].tolist() == slots
    expected = 0.5 * F.cross_entropy(m.poem.rhyme_head(x[0, slots]), m.poem.phon_group_ids[y[0, slots], 0])
    torch.testing.assert_close(m.poem.rhyme_loss(x, y, idx), expected)
    ce = F.cross_entropy(m(idx).view(-1, V), y.view(-1))
    torch.testing.assert_close(m.loss(idx, y), ce + expected)  # the language-model loss plus the rhyme term
    y[0, 6] = -1  # not scored: not in the loss
    torch.testing.assert_close(m.poem.rhyme_loss(x, y, idx), 0.5 * F.cross_entropy(
        m.poem.rhyme_head(x[0, [14]]), m.poem.phon_group_ids[y[0, [14]], 0]))
    assert m.poem.rhyme_loss(x[:, :6], y[:, :6], idx[:, :6]).item() == 0.0  # no rhyme slot: no rhyme term
    with pytest.raises(ValueError, match="needs poem_inputs=true"):
        GPT(GPTConfig(vocab_size=V, rhyme_loss_weight=0.5))


def test_bad_tables_are_refused():
    m, tones = tiny(), torch.zeros(V, dtype=torch.long)
    with pytest.raises(ValueError, match="groups must be"):
        m.poem.set_phonology(torch.zeros(V, 3, dtype=torch.long), tones)
    with pytest.raises(ValueError, match="tones ids"):
        m.poem.set_phonology(torch.zeros(V, 4, dtype=torch.long), torch.full((V,), 4))
    with pytest.raises(ValueError, match="first group id"):
        m.poem.set_phonology(torch.full((V, 4), -1), tones)


@pytest.mark.parametrize("head", ["tied", "adaptive"])
def test_the_phonology_is_added_to_the_output_vectors_and_it_stays_a_distribution(head):
    m = tiny(head=head, head_cutoffs=(20,))
    if head == "adaptive":
        m.lm_head.set_token_counts(torch.arange(V).flip(0))  # id 0 the most frequent
    idx = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(2))
    logp = torch.log_softmax(m(idx), -1)  # (2, 9, V)
    torch.testing.assert_close(m.nats(idx, y), -logp.gather(-1, y[..., None])[..., 0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m.loss(idx, y), m.nats(idx, y).mean(), rtol=1e-4, atol=1e-5)
    x = m._hidden(idx)
    phon = m.poem.output_rows(torch.arange(V)[None])[0]  # (V, n_embd) every token's phonology embedding
    if head == "tied":
        torch.testing.assert_close(m.lm_head(x), x @ (m.wte.weight + phon).T)
    else:  # the head cluster: ranks 0…19 are ids 0…19 here
        w = m.lm_head.adaptive.head.weight
        torch.testing.assert_close(m.lm_head.adaptive.head(x), x @ torch.cat([w[:20] + phon[:20], w[20:]]).T)


def test_a_checkpoint_resumes_with_the_poem_inputs_it_was_trained_with(tmp_path):
    from model.training.checkpoints import check_same_shape

    old = {"hyper_parameters": {"model": {"n_layer": 4, "n_embd": 96}}}  # no poem-input field: trained without
    check_same_shape(old, {"n_layer": 4, "poem_inputs": False}, tmp_path)
    with pytest.raises(ValueError, match="model.poem_inputs: checkpoint False, asked True"):
        check_same_shape(old, {"n_layer": 4, "poem_inputs": True}, tmp_path)
    on = {"hyper_parameters": {"model": {"n_layer": 4, "phonology": True, "phon_output": True, "structure": True,
                                         "struct_recover": True, "rhyme_loss_at": "rhyme_slots"}}}  # before issue 37
    check_same_shape(on, {"n_layer": 4, "poem_inputs": True}, tmp_path)


def test_a_plan_models_structure_starts_after_its_plan_tokens():
    """<bos> <五绝> <rhyme> poem: the plan tokens are not characters of the first line, so every
    position of the poem gets the ids it gets without a plan."""
    from data.verse.plan import plan_labels

    poem = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"
    tok = CharTokenizer.from_texts([poem], plan=plan_labels())
    m = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=1, n_embd=8, poem_inputs=True))
    m.poem.set_token_kinds(torch.tensor(token_kinds(tok)))
    plain = tok.encode(poem, bos=True, eos=True)
    planned = [plain[0], tok.itos.index("<五绝>"), tok.itos.index("<下平聲七陽>"), *plain[1:]]
    ids = m.poem.structure_ids(torch.tensor([plain]))[0]  # (T, 3)
    assert torch.equal(m.poem.structure_ids(torch.tensor([planned]))[0, 2:], ids)
    assert ids[10].tolist() == [2, 2, 4]  # before 霜: line 2, the mark after the next, a rhyme slot


def test_a_ci_planned_by_its_tune_counts_its_lines_by_the_tune_s_template():
    """<bos> <菩萨蛮> <rhyme> 词: every line's countdown comes from the template (7, 7, 5, …) from
    its first character on, each rhyming line's last character is a rhyme slot (5: a 仄 one), the line id counts
    the lines left (8 … 1), 、 ends a line, the countdown id before a mark names the template's (。:
    2, where this 词 has ，or 、); a 词 planned <其他> is read as a 诗 (the first line's length for
    the others)."""
    from data.features import tune_tables
    from data.verse.plan import plan_ids, plan_labels

    ci = "平林漠漠烟如织，寒山一带伤心碧。暝色入高楼、有人楼上愁。玉阶空伫立，宿鸟归飞急。何处是归程，长亭更短亭。"
    tok = CharTokenizer.from_texts([ci], plan=plan_labels(tunes=True))
    m = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=1, n_embd=8, poem_inputs=True))
    m.poem.set_token_kinds(torch.tensor(token_kinds(tok)))
    m.poem.set_tunes(*map(torch.tensor, tune_tables(tok)))
    ids = plan_ids(tok)
    body = tok.encode(ci, eos=True)
    got = m.poem.structure_ids(torch.tensor([[0, ids.tunes["菩萨蛮"][0], ids.none, *body]]))[0, 2:].tolist()
    counts = [c for _, c, _ in got]
    assert counts[:9] == [8, 7, 6, 5, 4, 3, 2, 2, 8]  # after the plan: 7 characters, the mark; line 2 again 7
    assert got[7] == [8, 2, 3] and got[6] == [8, 2, 5]  # before the mark: the template's 。(id 2); before 织 a 仄 rhyme slot
    assert got[15] == [7, 2, 3]
    assert got[16:23] == [[6, 6, 2], [6, 5, 2], [6, 4, 2], [6, 3, 2], [6, 2, 4], [6, 2, 3], [5, 6, 2]]  # 、 ends
    assert got[-3] == [1, 2, 3] and got[-2] == got[-1] == [0, 0, 0]  # the last mark (。) next; then the 词 is done
    shui = m.poem.structure_ids(torch.tensor([[0, ids.tunes["水调歌头"][0], ids.none, *tok.encode("平林漠漠烟，")]]))
    assert shui[0, -2].tolist() == [8, 1, 3]  # 19 lines left (capped: 8); before the template's ，: id 1
    other = m.poem.structure_ids(torch.tensor([[0, ids.forms["other"], ids.none, *body]]))[0, 2:].tolist()
    assert other[:8] == [[1, 0, 1]] * 8 and other[20][1] == 4  # 诗 rules: line 3 as long as line 1 (7), 4 written
