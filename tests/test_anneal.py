import numpy as np
import pytest
import torch
from lightning.pytorch import Trainer
from torch.utils.data import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler

from data.anneal import AnnealSampler, annealing_windows
from data.datamodule import PoetryDataModule
from data.tokenizer import CharTokenizer
from data.verse.script import corpus_to_script
from tests.conftest import POEMS

RHYMED = "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。"  # 流 / 楼: 下平聲十一尤
UNRHYMED = "白日依山尽，黄河入海流。欲穷千里目，更上一层天。"  # 天 (一先) does not rhyme with 流
QIJUE = "朝辞白帝彩云间，千里江陵一日还。两岸猿声啼不住，轻舟已过万重山。"  # 还 / 山: 上平聲十五删
QIJUE_UNRHYMED = QIJUE.replace("山。", "来。")  # 来 (上平聲十灰)


def test_the_annealing_windows_start_the_poems_whose_even_lines_rhyme():
    tok = CharTokenizer.from_texts([RHYMED, UNRHYMED])
    ids = [tok.encode(p, bos=True, eos=True) for p in (RHYMED, UNRHYMED, RHYMED)]
    tokens = np.array(sum(ids, []), dtype=np.uint16)
    n = len(ids[0])
    window_starts = np.array([0, 3, n, 2 * n])  # the poems' <bos>, and one window inside the first
    assert sorted(annealing_windows(window_starts, tokens, tok, "simplified").tolist()) == [0, 3]  # offsets 0 and 2n
    assert annealing_windows(np.array([0]), tokens[n:2 * n], tok, "simplified").tolist() == []


def test_the_forms_mix_keeps_each_forms_share_of_poem_starts():
    poems = [RHYMED, QIJUE_UNRHYMED, RHYMED, QIJUE, RHYMED, QIJUE_UNRHYMED]  # 五绝 3/6 (all rhymed), 七绝 3/6 (1 rhymed)
    tok = CharTokenizer.from_texts([QIJUE, *poems])
    ids = [tok.encode(p, bos=True, eos=True) for p in poems]
    tokens = np.array(sum(ids, []), dtype=np.uint16)
    bos = np.cumsum([0, *map(len, ids)])[:-1]
    window_starts = np.sort(np.concatenate([bos, bos + 3]))  # every poem's start, and a window inside each
    forms = annealing_windows(window_starts, tokens, tok, "simplified", seed=3)  # of 3 rhymed 五绝, 1 七绝
    assert len(forms) == 4
    starts = window_starts[forms].tolist()
    assert starts.count(bos[3]) == 2  # the one rhymed 七绝 twice: half the poem starts are 七绝
    assert len(set(starts) & {bos[0], bos[2], bos[4]}) == 2 and len(set(starts)) == 3  # two distinct 五绝
    assert forms.tolist() == annealing_windows(window_starts, tokens, tok, "simplified", seed=3).tolist()


def test_the_last_share_of_the_run_comes_from_the_annealing_windows_only():
    anneal = np.array([3, 7, 11])
    sampler = AnnealSampler(20, anneal, total=50, fraction=0.2, seed=1)
    order = list(sampler)
    assert len(order) == len(sampler) == 50 and order == list(sampler)  # the same order every time
    main, tail = order[:40], order[40:]
    assert sorted(main[:20]) == list(range(20)) and sorted(main[20:40]) == list(range(20))  # whole permutations
    assert main[:20] != main[20:40]  # each its own
    assert set(tail) == {3, 7, 11} and sorted(tail[:3]) == [3, 7, 11]
    assert order != list(AnnealSampler(20, anneal, total=50, fraction=0.2, seed=2))
    for bad in ({"fraction": 0.0}, {"fraction": 1.0}, {"total": 0}):
        with pytest.raises(ValueError, match="must be in"):
            AnnealSampler(20, anneal, **{"total": 50, "fraction": 0.2, **bad})
    with pytest.raises(ValueError, match="no training poem's even lines rhyme"):
        AnnealSampler(20, np.array([], dtype=np.int64), 50, 0.2)


def test_several_processes_share_one_order_and_anneal_at_the_same_step():
    anneal = np.array([3, 7, 11])
    whole = list(AnnealSampler(20, anneal, total=60, fraction=0.2, seed=4))
    shards = [list(AnnealSampler(20, anneal, total=20, fraction=0.2, seed=4, num_replicas=3, rank=r)) for r in range(3)]
    assert [len(s) for s in shards] == [20, 20, 20]
    assert [i for step in zip(*shards) for i in step] == whole  # rank r takes every 3rd index from the r-th
    assert all(set(s[-4:]) <= {3, 7, 11} and not set(s[:16]) <= {3, 7, 11} for s in shards)  # the last fifth each
    sampler = AnnealSampler(20, anneal, total=20, fraction=0.2, seed=4, num_replicas=3, rank=1)
    assert isinstance(sampler, DistributedSampler)  # Lightning wraps it in no other sampler
    with pytest.raises(ValueError, match="rank 3 is not one of 3 processes"):
        AnnealSampler(20, anneal, total=20, fraction=0.2, num_replicas=3, rank=3)


@pytest.mark.parametrize("num_replicas, rank", [(1, 0), (2, 1)])
def test_a_resumed_loader_continues_the_annealed_order_exactly(num_replicas, rank):
    data = torch.arange(20)
    sampler = AnnealSampler(20, np.array([3, 7, 11]), total=48, fraction=0.25, seed=5, num_replicas=num_replicas,
                            rank=rank)

    def loader():
        return StatefulDataLoader(data, batch_size=4, sampler=sampler, drop_last=True)

    uninterrupted = [b.tolist() for b in loader()]
    assert len(uninterrupted) == 12
    for stop in (2, 10):  # before the annealing phase and inside it
        first = loader()
        served = []
        for b in first:
            served.append(b.tolist())
            if len(served) == stop:
                break
        resumed = loader()
        resumed.load_state_dict(first.state_dict())
        assert served + [b.tolist() for b in resumed] == uninterrupted, f"stopped after batch {stop}"


def test_the_datamodule_anneals_the_runs_last_steps_on_rhymed_poems(tiny_corpus, tmp_path, caplog):
    dm = PoetryDataModule(str(tiny_corpus), str(tmp_path / "cache"), block_size=8, batch_size=4,
                          anneal_fraction=0.5)
    dm.prepare_data()
    dm.setup("fit")
    dm.trainer = Trainer(max_steps=10, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    loader = dm.train_dataloader()
    batches = [x for x, _ in loader]
    assert len(batches) == 10
    poems = corpus_to_script(POEMS, "simplified")
    rhymed = {poems[i][:7] for i in (0, 1, 4, 5)}  # 霜/乡, 流/楼, 枝/思, 还/山; 鸟/少 and 灭/雪 are oblique
    begun = [(row[0] == 0, dm.tokenizer.decode(row.tolist())) for x in batches for row in x]
    assert not all(bos and text in rhymed for bos, text in begun[:20])  # the first half: every window
    assert all(bos and text in rhymed for bos, text in begun[20:])  # the last: a rhymed poem's <bos>
    dm.trainer = Trainer(max_time="00:00:01:00", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    with caplog.at_level("WARNING", logger="data.datamodule"):
        assert isinstance(dm.train_dataloader().sampler, RandomSampler)  # budget mode: every window, as without it
    assert "data.anneal_fraction=0.5: no annealing phase in this run; it needs trainer.max_steps" in caplog.text
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match=r"data.anneal_fraction=.* is not in \[0, 1\)"):
            PoetryDataModule("x.jsonl.xz", "cache", anneal_fraction=bad)


def test_a_ci_planned_by_its_tune_anneals_when_every_rhyme_position_keeps_its_class():
    """A 浣溪沙 after 苏轼's (啼 → 题, which the rhyme table has) rhymes 溪 泥 题 西 鸡 (第三部平) at its
    template's five positions, though its even lines (泥 少 鸡) share no level-tone group: with tune
    tokens it anneals, with 泥 → 天 (第七部) it does not; without tune tokens the 诗's rule leaves it out."""
    from data.verse.plan import plan_labels, poem_ids

    huanxisha = "山下兰芽短浸溪。松间沙路净无泥。萧萧暮雨子规题。谁道人生无再少，门前流水尚能西。休将白发唱黄鸡。"
    poems = [RHYMED, huanxisha, UNRHYMED, huanxisha.replace("泥", "天"), RHYMED]
    for tunes in (True, False):
        tok = CharTokenizer.from_texts(poems, plan=plan_labels(tunes=tunes))
        ci = {"form": "ci", "tune": "浣溪沙"}
        ids = [poem_ids(tok, p, "simplified", **(ci if p.count("。") == 5 else {})) for p in poems]
        tokens = np.array(sum(ids, []), dtype=np.uint16)
        window_starts = np.cumsum([0, *map(len, ids)])[:-1]
        annealed = sorted(annealing_windows(window_starts, tokens, tok, "simplified").tolist())
        if tunes:  # 3 rhymed of 5 poem starts: the 五绝 3/5 of them (both), the 浣溪沙 2/5 (the rhymed one)
            assert annealed == [0, 1, 4]
        else:  # 2 rhymed (the 五绝), the 五绝's share 3/5 of them: one; no 词 (form `other`) rhymes
            assert len(annealed) == 1 and annealed[0] in (0, 4)
