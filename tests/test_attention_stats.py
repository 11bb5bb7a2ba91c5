import math

import pytest
import torch

from model.inspection.attention_stats import (
    STATISTICS,
    baseline_statistics,
    classify,
    far_from,
    head_rows,
    head_statistics,
    line_structure,
    mean_statistics,
    random_head_maps,
    random_qk_maps,
    uniform_causal_map,
)

LINE = ["<bos>", *"床前明月光，疑是地上霜。"]  # T = 13: marks at 6 and 12


def one_hot_rows(targets: list[int]) -> torch.Tensor:
    """(T, T) map where row i puts all its weight on column targets[i] (≤ i)."""
    T = len(targets)
    m = torch.zeros(T, T)
    m[torch.arange(T), torch.tensor(targets)] = 1.0
    return m


def test_line_structure_of_the_probe_line():
    is_mark, parallel, rhyme = line_structure(LINE)
    assert is_mark.nonzero().flatten().tolist() == [6, 12]
    assert parallel.tolist() == [-1] * 7 + [1, 2, 3, 4, 5, 6]  # 疑→床 … 。→，
    assert rhyme.tolist() == [-1] * 7 + [5] * 6  # the second line's rows → 光
    _, parallel, rhyme = line_structure(["<bos>", *"白日，黄河入海。"])  # a longer second line
    assert parallel.tolist() == [-1, -1, -1, -1, 1, 2, 3, -1, -1]
    assert rhyme.tolist() == [-1] * 4 + [2] * 5  # → 日
    _, parallel, rhyme = line_structure(["<bos>", *"白日，", "<eos>", "<bos>", *"黄河。"])  # two poems
    assert parallel.eq(-1).all() and rhyme.eq(-1).all()
    _, _, rhyme = line_structure(["<bos>", "，", *"黄河。"])  # a previous "line" of a mark alone
    assert rhyme.eq(-1).all()


def test_identity_map():
    s = head_statistics(torch.eye(len(LINE)), LINE)
    assert s["self"] == 1 and s["max_weight"] == 1 and s["entropy"] == 0
    assert s["prev_token"] == 0 and s["first_token"] == 0 and s["prev_line_same_pos"] == 0
    assert s["prev_line_next_pos"] == 0 and s["prev_line_rhyme"] == 0
    assert s["punctuation"] == pytest.approx(2 / 7)  # rows 6..12 see a mark; rows 6 and 12 are marks


def test_previous_token_map():
    T = len(LINE)
    s = head_statistics(one_hot_rows([0, *range(T - 1)]), LINE)
    assert s["prev_token"] == 1 and s["self"] == 0
    assert s["first_token"] == pytest.approx(1 / (T - 1))  # only row 1's previous token is the first


def test_first_token_punctuation_and_parallel_maps():
    T = len(LINE)
    assert head_statistics(one_hot_rows([0] * T), LINE)["first_token"] == 1
    last_mark = [i if i < 6 else (6 if i < 12 else 12) for i in range(T)]  # the latest mark, else self
    assert head_statistics(one_hot_rows(last_mark), LINE)["punctuation"] == 1
    _, parallel, _ = line_structure(LINE)
    parallel_map = one_hot_rows([int(p) if p >= 0 else i for i, p in enumerate(parallel)])
    s = head_statistics(parallel_map, LINE)
    assert s["prev_line_same_pos"] == 1 and s["prev_token"] == 0
    assert s["prev_line_next_pos"] == 0 and s["prev_line_rhyme"] == pytest.approx(1 / 6)  # row 11 (霜) → 光


def test_predicted_position_map():
    """The issue's layer-3 head 0: row i looks at the previous line's character aligned with token
    i + 1 (，→床, 疑→前, 是→明, 地→月, 上→光, 霜→，); other rows look at themselves."""
    _, parallel, _ = line_structure(LINE)
    targets = [int(parallel[i + 1]) if i + 1 < len(LINE) and parallel[i + 1] >= 0 else i for i in range(len(LINE))]
    assert targets[6:12] == [1, 2, 3, 4, 5, 6]
    s = head_statistics(one_hot_rows(targets), LINE)
    assert s["prev_line_next_pos"] == 1 and s["prev_line_same_pos"] == 0
    assert s["prev_line_rhyme"] == pytest.approx(1 / 6)  # only 上 (row 10) predicts 霜, aligned with 光
    half = 0.5 * one_hot_rows(targets) + 0.5 * torch.eye(len(LINE))  # half the weight there: 0.5
    assert head_statistics(half, LINE)["prev_line_next_pos"] == pytest.approx(0.5)


def test_rhyme_position_map():
    """The issue's layer-3 head 2: every row of the second line looks at 光, the first line's
    last character; the first line's rows look at themselves."""
    targets = [5 if i >= 7 else i for i in range(len(LINE))]
    s = head_statistics(one_hot_rows(targets), LINE)
    assert s["prev_line_rhyme"] == 1
    assert s["prev_line_next_pos"] == pytest.approx(1 / 6)  # row 10 (上) predicts 霜, aligned with 光
    assert s["prev_line_same_pos"] == pytest.approx(1 / 6)  # row 11 (霜) sits under 光
    assert s["self"] == pytest.approx(6 / 12)


def test_uniform_map_entropy_and_single_line_nan():
    T = len(LINE)
    s = head_statistics(uniform_causal_map(T), LINE)
    assert s["entropy"] == pytest.approx(sum(math.log(i + 1) for i in range(1, T)) / (T - 1))
    assert s["max_weight"] == pytest.approx(sum(1 / (i + 1) for i in range(1, T)) / (T - 1))
    assert math.isnan(head_statistics(uniform_causal_map(4), ["<bos>", *"床前，"])["prev_line_same_pos"])


def test_batched_maps_and_shape_errors():
    maps = torch.stack([torch.eye(13), uniform_causal_map(13)]).expand(3, 2, 13, 13)  # (3, 2, T, T)
    s = head_statistics(maps, LINE)
    assert set(s) == set(STATISTICS) and all(v.shape == (3, 2) for v in s.values())
    assert s["self"][:, 0].eq(1).all()
    with pytest.raises(ValueError, match="T = len"):
        head_statistics(torch.eye(5), LINE)
    m = mean_statistics([torch.eye(13), uniform_causal_map(4)], [LINE, ["<bos>", *"床前，"]])
    assert m["self"] == pytest.approx((1 + (1 / 2 + 1 / 3 + 1 / 4) / 3) / 2)
    assert m["prev_line_same_pos"] == 0  # the second sequence's NaN is skipped


def test_random_qk_maps_are_the_lessons_section_3_construction():
    T, n, d = 5, 3, 8
    maps = random_qk_maps(T, n, d, seed=7)
    gen = torch.Generator().manual_seed(7)
    q, k = torch.randn(n, T, d, generator=gen), torch.randn(n, T, d, generator=gen)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(maps, torch.softmax(scores, dim=-1))
    assert maps.shape == (n, T, T) and (maps.triu(1) == 0).all()
    torch.testing.assert_close(maps.sum(-1), torch.ones(n, T))
    assert torch.equal(maps, random_qk_maps(T, n, d, seed=7)) and not torch.equal(maps, random_qk_maps(T, n, d, seed=8))


def test_scaling_keeps_random_attention_spread_as_in_section_4():
    """The lesson's section 4: without 1/√d the largest weight per row nears 1 at d = 256."""
    tokens = ["<bos>", *"一" * 15]
    scaled = head_statistics(random_qk_maps(16, 64, d=256, seed=0), tokens)["max_weight"].mean()
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(64, 16, 256, generator=gen), torch.randn(64, 16, 256, generator=gen)
    unscaled = torch.softmax((q @ k.transpose(-2, -1)).masked_fill(~torch.ones(16, 16, dtype=torch.bool).tril(),
                                                                  float("-inf")), -1)
    assert scaled < 0.6 < 0.9 < head_statistics(unscaled, tokens)["max_weight"].mean()


def test_random_head_maps_are_the_lessons_section_5_construction():
    T, n, d_model, d_head = 5, 2, 16, 8
    maps = random_head_maps(T, n, d_model, d_head, seed=3)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(n, T, d_model, generator=gen)
    W_q = torch.randn(n, d_model, d_head, generator=gen) / math.sqrt(d_model)
    W_k = torch.randn(n, d_model, d_head, generator=gen) / math.sqrt(d_model)
    scores = (x @ W_q) @ (x @ W_k).transpose(-2, -1) / math.sqrt(d_head)
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(maps, torch.softmax(scores, -1))
    assert maps.shape == (n, T, T) and (maps.triu(1) == 0).all()
    with pytest.raises(ValueError):
        random_head_maps(0, 1)


def test_baseline_statistics_shapes_and_reproducibility():
    lists = [LINE, ["<bos>", *"白日依山尽，黄河入海流。"]]
    b = baseline_statistics(lists, n_samples=8, seed=1)
    assert set(b) == {"uniform", "random_qk", "random_head"}
    assert all(v.shape == (8,) for v in b["random_qk"].values()) and b["uniform"]["entropy"].shape == ()
    assert torch.equal(b["random_head"]["self"], baseline_statistics(lists, n_samples=8, seed=1)["random_head"]["self"])
    assert 0.3 < b["random_qk"]["max_weight"].mean() < 0.55  # the lesson's d = 8 rows: spread, not one-hot


def test_far_from_and_pattern_names():
    samples = torch.tensor([0.18, 0.20, 0.22])
    assert far_from(0.9, samples) == 1 and far_from(0.0, samples) == -1
    assert far_from(0.25, samples) == 0  # beyond 3 std but less than min_effect
    assert far_from(float("nan"), samples) == 0
    base = {n: torch.tensor([0.18, 0.2, 0.22]) for n in STATISTICS}
    base["entropy"] = torch.tensor([1.5, 1.6, 1.7])
    baselines = {"random_qk": base, "init": {n: v + 0.01 for n, v in base.items()}}
    prev_head = {**{n: 0.2 for n in STATISTICS}, "entropy": 0.5, "prev_token": 0.9, "self": 0.6}
    flags, pattern = classify(prev_head, baselines)
    assert flags == {"entropy": "low", "prev_token": "high", "self": "high"} and pattern == "previous-token head"
    assert classify({**{n: 0.2 for n in STATISTICS}, "entropy": 1.6}, baselines) == ({}, "random-like")
    assert classify({**{n: 0.2 for n in STATISTICS}, "entropy": 0.3}, baselines)[1] == "focused"
    stats = {n: torch.full((2, 3), 0.2) for n in STATISTICS}
    stats["entropy"] = torch.full((2, 3), 1.6)
    stats["prev_line_same_pos"][1, 2] = 0.8
    stats["prev_line_next_pos"][1, 1] = 0.7
    stats["prev_line_rhyme"][1, 0] = 0.6
    stats["prev_line_next_pos"][0, 2], stats["prev_line_rhyme"][0, 2] = 0.5, 0.9  # both: the larger names it
    rows = head_rows(stats, baselines)
    assert len(rows) == 6 and (rows[5]["layer"], rows[5]["head"]) == (1, 2)
    assert [r["pattern"] for r in rows] == ["random-like", "random-like", "previous-rhyme head",
                                            "previous-rhyme head", "parallel-position head", "same-position head"]
    assert rows[2]["flags"] == {"prev_line_next_pos": "high", "prev_line_rhyme": "high"}


@pytest.mark.parametrize("statistic, pattern", [("prev_line_next_pos", "parallel-position head"),
                                                ("prev_line_rhyme", "previous-rhyme head")])
def test_poetry_heads_are_flagged_and_named_against_the_random_baselines(statistic, pattern):
    """Heads like the issue's L3H0 and L3H2 (0.8 of each second-line row on the target, the rest
    uniform) stand out from the lesson's random maps and are named after what they do."""
    T = len(LINE)
    _, parallel, rhyme = line_structure(LINE)
    target = {"prev_line_next_pos": torch.cat([parallel[1:], torch.tensor([-1])]), "prev_line_rhyme": rhyme}[statistic]
    head = uniform_causal_map(T)
    for i in range(T):
        if target[i] >= 0:
            head[i] = 0.2 * head[i]
            head[i, target[i]] += 0.8
    values = {n: v.item() for n, v in head_statistics(head, LINE).items()}
    assert values[statistic] > 0.8
    random_maps = baseline_statistics([LINE], n_samples=16)
    flags, name = classify(values, {"random_qk": random_maps["random_qk"], "random_head": random_maps["random_head"]})
    assert flags[statistic] == "high" and name == pattern
