"""benchmarks/poet_levers.py reads what issue 27 asks of a lever from evaluate.py's rows: free rhyme
at each seed, the least form-alone rhyme over forms and seeds, means of the free poems' mix."""
import pytest

from benchmarks.poet_levers import FORMS, SEEDS, summary, table


def rows(free_rhyme: float, form_rhyme: float, qilv: float) -> dict:
    free = {"rhyme_regulated": free_rhyme, "wujue": 0.2, "qijue": 0.2, "wulv": 0.3, "qilv": qilv, "other": 0.3 - qilv,
            "distinct_2": 0.8, "regulated": 0.9, "alternation": 0.9, "nian": 0.8, "dui": 0.85}
    return {"free": free, **{f: {"rhyme_regulated": form_rhyme} for f in FORMS}}


def test_a_levers_summary_keeps_every_seed_and_the_least_form_alone_rhyme():
    run = {"seeds": {str(s): rows(0.8 + i / 100, 0.7 - i / 100, 0.03 * (i + 1)) for i, s in enumerate(SEEDS)},
           "val": {"poems": {"val_bpc": 6.75}, "blocks": {"val_bpc": 7.13}}}
    s = summary(run)
    assert s["free_rhyme"] == pytest.approx([0.8, 0.81, 0.82])
    assert s["form_rhyme"] == {f: pytest.approx(0.68) for f in FORMS}  # the least over the seeds
    assert s["mix"]["qilv"] == pytest.approx(0.06) and s["distinct_2"] == pytest.approx(0.8)
    line = table({"runs": {"x": run}}).splitlines()[-1]
    assert line.startswith("| x | 80.0% / 81.0% / 82.0% | 68.0% | 20.0 / 20.0 / 30.0 / 6.0 / 24.0 | 0.800 | 90.0% "
                           "| 90.0% / 80.0% / 85.0% |")


def test_every_lever_but_the_default_starts_from_a_pinned_default():
    from benchmarks.poet_levers import LANDED, LANDED_SAMPLING, LEVERS, PREVIOUS, PREVIOUS_SAMPLING

    assert LEVERS["default"] == ([], []) and LANDED[: len(PREVIOUS)] == PREVIOUS
    for name, (overrides, sampling) in LEVERS.items():
        if name.startswith("landed+"):
            assert overrides[: len(LANDED)] == LANDED and sampling == LANDED_SAMPLING, name
        elif name != "default":
            assert overrides[: len(PREVIOUS)] == PREVIOUS and sampling == PREVIOUS_SAMPLING, name


def test_step_times_time_each_levers_own_model_and_windows_against_the_first(monkeypatch, tmp_path, tiny_corpus):
    import benchmarks.poet_levers as pl
    from tests.conftest import tiny_overrides

    base = [o for o in tiny_overrides(tmp_path, tiny_corpus) if o.split("=")[0] in
            ("data.corpus_path", "data.cache_dir", "model.n_head", "model.n_embd", "model.block_size")]
    monkeypatch.setattr(pl, "LEVERS", {"one-layer": ([*base, "model.n_layer=1", "data.batch_size=4"], []),
                                       "two-layers": ([*base, "model.n_layer=2", "data.batch_size=2"], [])})
    built = []
    import model.loading

    def spy(model, tokenizer, script):
        gpt = real_build(model, tokenizer, script)
        built.append((gpt.cfg.n_layer, gpt.cfg.block_size))
        return gpt

    real_build = model.loading.build_gpt
    monkeypatch.setattr(model.loading, "build_gpt", spy)
    t = pl.step_times(["one-layer", "two-layers"], steps=2)
    assert built == [(1, 16), (2, 16)]
    assert t["steps_each"] == 2 and t["ratio"]["one-layer"] == 1.0 and all(v > 0 for v in t["ms"].values())
    assert t["ratio"]["two-layers"] == pytest.approx(t["ms"]["two-layers"] / t["ms"]["one-layer"], rel=0.01)


def test_saving_a_lever_keeps_what_another_run_of_the_script_saved_meanwhile(monkeypatch, tmp_path):
    import benchmarks.poet_levers as pl

    monkeypatch.setattr(pl, "OUT", tmp_path / "poet-levers.json")
    pl.save({"a": {"x": 1}}, machine="m1")
    pl.save({"b": {"x": 2}}, machine="m2")  # as a second process would, having read the file before "a"
    pl.save(step_time={"ratio": {"a": 1.0}})
    assert pl.read() == {"runs": {"a": {"x": 1}, "b": {"x": 2}}, "machine": "m2", "step_time": {"ratio": {"a": 1.0}}}
