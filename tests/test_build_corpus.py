import json
import lzma
import tarfile

import pytest

from data.build_corpus import CORPUS_DIR, build, split_of, write


def poem(pid, *paragraphs):
    return {"id": pid, "title": "t", "author": "a", "paragraphs": list(paragraphs)}


@pytest.fixture
def source(tmp_path):
    """A miniature npm package: quantangshi with a supplement file, an error list and a decoy folder."""
    tang = tmp_path / "package" / "dist" / "quantangshi"
    (tang / "error").mkdir(parents=True)
    main = [
        poem("keep", "床前明月光，疑是地上霜。", "舉頭望明月，低頭思故鄉。"),
        poem("note", "邏人（一作「叉」）橫鳥道，[爽]節照寒林。"),
        poem("err", "白日依山盡，黃河入海流。"),
        poem("lost", "侯門處處槐花□，獻賦何時遇至公。"),
        poem("placeholder", "{𥫗/戢}子來，山中月色明。"),
        poem("latin", "abc山中，月色明。"),
        poem("empty"),
        poem("frag", "獨句無對。"),
        poem("dup", "床前明月光，疑是地上霜。", "舉頭望明月，低頭思故鄉。"),
    ]
    (tang / "poet.tang.0.json").write_text(json.dumps(main, ensure_ascii=False))
    (tang / "poet.tang.50000.json").write_text(json.dumps([poem("supp", "春眠不覺曉，處處聞啼鳥。")], ensure_ascii=False))
    (tang / "error" / "poet.tang.0.json").write_text(json.dumps([poem("err", "x")]))
    decoy = tmp_path / "package" / "dist" / "strains" / "json"
    decoy.mkdir(parents=True)
    (decoy / "poet.tang.0.json").write_text(json.dumps([poem("strain", "平平仄仄平，仄仄仄平平。")], ensure_ascii=False))
    return tmp_path / "package"


def test_each_rule_on_a_fixture(source):
    poems, stats = build(source)
    assert {p["id"]: p["text"] for p in poems} == {
        "keep": "床前明月光，疑是地上霜。舉頭望明月，低頭思故鄉。",
        "note": "邏人橫鳥道，爽節照寒林。",
    }
    assert stats["dropped"] == {"supplement-file": 1, "listed-in-error": 1, "bad-characters": 3,
                                "empty": 1, "fragment": 1, "duplicate": 1}
    assert {p["id"]: p["form"] for p in poems} == {"keep": "wujue", "note": "other"}
    assert stats["kept"] == 2 and stats["source_poems"] == 10


def test_tarball_gives_the_same_corpus(source, tmp_path):
    tgz = tmp_path / "chinese-poetry.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(source, arcname="package")
    assert build(tgz) == build(source)


def test_missing_or_empty_source_is_explained(tmp_path):
    with pytest.raises(FileNotFoundError, match="npm pack chinese-poetry"):
        build(tmp_path / "nope.tgz")
    with pytest.raises(ValueError, match="no poet.tang"):
        build(tmp_path)


def test_split_is_seeded_and_about_five_percent():
    ids = [f"id-{i}" for i in range(20000)]
    splits = [split_of(i) for i in ids]
    assert splits == [split_of(i) for i in ids]
    assert 0.045 < splits.count("val") / len(ids) < 0.055
    assert [split_of(i, seed=1) for i in ids] != splits


def test_write_is_readable_and_atomic(source, tmp_path):
    poems, stats = build(source)
    path = write(poems, stats, tmp_path / "out")
    with lzma.open(path, "rt", encoding="utf-8") as f:
        assert [json.loads(line) for line in f] == poems
    assert json.loads((tmp_path / "out" / "stats.json").read_text()) == stats
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["stats.json", "tang.jsonl.xz"]


def test_a_training_poem_with_a_validation_body_is_dropped(tmp_path):
    """Issue 36, item 3: the leakage rule inside one corpus: a training poem whose body is a validation
    poem's once marks are taken out and the script is simplified (栖/棲) is dropped, wherever it stands."""
    from tests.test_song_corpus import ids_of

    (val,), train = ids_of("val", 1, "v"), ids_of("train", 3, "w")
    folder = tmp_path / "package" / "dist" / "quantangshi"
    folder.mkdir(parents=True)
    records = [poem(train[0], "宿鳥歸飛急，寒鴉棲復驚。"),  # before the validation poem, other marks and script
               poem(val, "宿鳥歸飛急；寒鴉栖復驚！"), poem(train[1], "宿鳥歸飛急，寒鴉栖復驚。"),
               poem(train[2], "白日依山盡，黃河入海流。")]
    (folder / "poet.tang.0.json").write_text(json.dumps(records, ensure_ascii=False))
    poems, stats = build(tmp_path / "package")
    assert [p["id"] for p in poems] == [val, train[2]]
    assert stats["dropped"] == {"val-duplicate": 2} and stats["split"] == {"val": 1, "train": 1}


def test_shipped_corpus_matches_its_stats():
    """The real embedded corpus: size, licence, counts and the forms the issue expects."""
    path = CORPUS_DIR / "tang.jsonl.xz"
    assert path.stat().st_size < 8e6
    assert "MIT License" in (CORPUS_DIR / "LICENSE").read_text()
    stats = json.loads((CORPUS_DIR / "stats.json").read_text())
    with lzma.open(path, "rt", encoding="utf-8") as f:
        poems = [json.loads(line) for line in f]
    assert len(poems) == stats["kept"]
    assert 47000 <= len(poems) <= 50000
    assert len({p["text"] for p in poems}) == len(poems)
    forms = {f: sum(p["form"] == f for p in poems) for f in ("wujue", "qijue", "wulv", "qilv")}
    assert forms == {f: stats["forms"][f] for f in forms}
    assert forms["wulv"] > 13000 and forms["qijue"] > 9000 and forms["qilv"] > 7000 and forms["wujue"] > 3000
    assert 0.04 < sum(p["split"] == "val" for p in poems) / len(poems) < 0.06
