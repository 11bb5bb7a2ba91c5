"""docs/results.md and README.md's generated blocks against the JSON they are written from."""
import json
import re
import shutil

import pytest

from attention_maps import attention_report
from benchmarks import report
from model.inspection.evaluation import evaluation_rows
from tests.conftest import write_corpus
from tests.test_attention_maps import corpus, report_cfg, write_checkpoint  # noqa: F401 (corpus: a fixture)


@pytest.fixture
def results(tmp_path):
    """A copy of the committed result JSON, to change."""
    return shutil.copytree(report.RESULTS, tmp_path / "results")


def edit(results, name, change):
    path = results / f"{name}.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, ensure_ascii=False))


def test_the_committed_pages_are_what_the_json_gives():
    assert report.stale() == [], "run `python -m benchmarks.report`"
    assert report.main(["--check"]) == 0


def test_a_changed_figure_makes_the_check_fail(results, capsys):
    edit(results, "fixed-time-cpu", lambda d: d["runs"]["default"]["poems"].update(val_bpc=7.4321))
    assert set(report.stale(results)) == {report.PAGES["results"], report.PAGES["readme"]}
    assert report.main(["--check", "--results", str(results)]) == 1
    assert "docs/results.md, README.md" in capsys.readouterr().err
    page = report.expected(results)[report.PAGES["results"]]
    d = json.loads((results / "fixed-time-cpu.json").read_text())["runs"]["default"]
    low, high = d["poems"]["bpc_interval_95"]
    row = (f"| {d['steps']:,} | {d['wall_seconds']} | {d['tokens_per_sec']:,} | {d['poems']['val_loss']:.3f} | "
           f"7.432 ({low:.3f}–{high:.3f}) |")
    assert "`val/bpc` **7.43**" in page and row in page


@pytest.fixture(scope="module")
def today():
    return report.default_fingerprint()


def test_results_of_the_default_run_measured_on_another_behaviour_fail_the_check(results, capsys, today, monkeypatch):
    """Issue 37, item 3: the committed figures describe today's default by behaviour; a recipe that trains
    otherwise, or a figure of other weights, names the files and the commands that re-make them."""
    assert report.outdated(report.load(results), today) == []
    doubled = [[2 * lr for lr in s] for s in today["schedule"]["lr"]]
    other = {**today, "schedule": {**today["schedule"], "lr": doubled}}
    assert report.outdated(report.load(results), other) == [
        "fixed-time-cpu.json (trains otherwise: schedule)",
        "evaluate-default-cpu.json (other weights than the default run's)",
        "attention-maps-default-cpu.json (other weights than the default run's)",
        "conditions-cpu.json (other weights than the default run's)"]
    edit(results, "evaluate-default-cpu", lambda d: d.update(weights_sha="0" * 64))
    assert report.outdated(report.load(results), today) == [
        "evaluate-default-cpu.json (other weights than the default run's)"]
    monkeypatch.setattr(report, "default_fingerprint", lambda: today)
    assert report.main(["--check", "--results", str(results)]) == 1
    err = capsys.readouterr().err
    assert "measured on another default than today's behaviour: evaluate-default-cpu.json" in err
    assert "python benchmarks/fixed_time.py" in err


def test_a_result_without_its_machine_or_far_from_the_default_runs_step_fails_the_check(results, capsys):
    """Issue 36, item 5: the CPU throughput figure was 20,121.8 ms a step, 160× the default run's, with
    no machine recorded."""
    assert report.unrecorded_machines(report.load(results)) == [] and report.implausible(report.load(results)) == []
    edit(results, "ddp-step-cpu", lambda d: d.pop("machine"))
    edit(results, "mfu-cpu", lambda d: d.update(ms_per_step=20121.78))
    assert report.unrecorded_machines(report.load(results)) == ["ddp-step-cpu.json"]
    assert report.main(["--check", "--results", str(results)]) == 1
    err = capsys.readouterr().err
    assert "error: no machine recorded in ddp-step-cpu.json: re-run the benchmark that wrote it" in err
    default = json.loads((results / "fixed-time-cpu.json").read_text())["runs"]["default"]
    ratio = 20121.78 / (1000 * default["wall_seconds"] / default["steps"])
    assert f"error: measured beside other work? mfu-cpu.json ({ratio:.1f}× the default run's step time;" in err
    edit(results, "mfu-cpu", lambda d: d.update(ms_per_step=1.0))  # too fast is as suspect
    assert report.implausible(report.load(results))[0].startswith("mfu-cpu.json (0.0×")


def test_a_figure_in_a_single_section_is_checked_too(results):
    edit(results, "sampling-cpu", lambda d: d["rows"][3].update(cache_tokens_per_sec=999.0))
    assert report.stale(results) == [report.PAGES["results"]]
    row = json.loads((results / "sampling-cpu.json").read_text())["rows"][3]
    assert (f"| `small` | 16 | 127 | {row['no_cache_tokens_per_sec']:,.0f} | 999 | {row['ratio']:.1f}× |"
            in report.expected(results)[report.PAGES["results"]])


def test_each_section_names_the_machine_of_its_file(results):
    edit(results, "attention-cpu", lambda d: d["meta"].update(machine="Some CPU (8 cores, 8 threads), torch 9"))
    pages = report.expected(results)
    assert ("Machine: Some CPU (8 cores, 8 threads), torch 9 (`benchmarks/results/attention-cpu.json`)."
            in pages[report.PAGES["results"]])
    machines = [line for page in pages.values() for line in page.splitlines() if line.startswith("Machine: ")]
    assert {line.rsplit("/", 1)[1] for line in machines} == {f"{p.name}`)." for p in report.RESULTS.glob("*.json")}


def test_the_readme_blocks_come_from_the_default_run():
    ft = json.loads((report.RESULTS / "fixed-time-cpu.json").read_text())
    blocks = report.readme_blocks(report.load())
    default = ft["runs"]["default"]
    assert blocks["train"].startswith(f"{default['steps']:,} steps, about {round(default['wall_seconds'] / 60)} minutes")
    assert f"≈ {default['poems']['val_bpc']:.1f}" in blocks["train"] and ft["machine"] in blocks["headline"]


def test_nanogpt_rows_kept_from_another_run_are_said_to_be(results):
    edit(results, "fixed-time-cpu", lambda d: d.update(reference_commit="0123456789abcdef"))
    pages = report.expected(results)
    for page in (report.PAGES["results"], report.PAGES["readme"]):
        assert "**nanoGPT's rows are kept from commit 0123456** (`--keep-reference`)" in pages[page]
    edit(results, "fixed-time-cpu", lambda d: d.update(reference_commit=d["commit"]))  # trained side by side
    assert "kept from commit" not in report.expected(results)[report.PAGES["readme"]]


def test_blocks_need_their_markers():
    text = "a\n<!-- report:x -->\nold\n<!-- /report:x -->\nb"
    assert report.fill_blocks(text, {"x": "new"}) == "a\n<!-- report:x -->\nnew\n<!-- /report:x -->\nb"
    with pytest.raises(ValueError, match="report:y"):
        report.fill_blocks(text, {"y": "new"})


def test_the_default_runs_evaluation_and_heads_are_pending_until_committed(results, tmp_path, corpus):  # noqa: F811
    for name in ("evaluate-default-cpu", "attention-maps-default-cpu"):
        (results / f"{name}.json").unlink(missing_ok=True)
    page = report.expected(results)[report.PAGES["results"]]
    assert "Pending: `benchmarks/results/evaluate-default-cpu.json`" in page
    assert "Pending: `benchmarks/results/attention-maps-default-cpu.json`" in page

    free = ["白日依山尽，黄河入海流。欲穷千里目，更上一层楼。"] * 2
    rows = evaluation_rows({"free": free}, ["床前明月光，疑是地上霜。"] * 5, write_corpus(tmp_path / "tang.jsonl.xz"),
                           "simplified")
    evaluation = {"device": "cpu", "settings": {"num_samples": 2, "reference": 5}, "rows": rows,
                  "val": {"val/bpc": 6.1234, "val/loss": 4.25}, "seconds": {"sampling": 30.0, "metrics": 40.0}}
    (results / "evaluate-default-cpu.json").write_text(json.dumps(evaluation, ensure_ascii=False))
    ckpt = write_checkpoint(tmp_path / "checkpoints" / "run" / "last.ckpt")
    heads = attention_report(report_cfg(tmp_path, corpus, ckpt, "text='床前明月光，疑是地上霜。'"))
    (results / "attention-maps-default-cpu.json").write_text(json.dumps(heads, ensure_ascii=False))

    page = report.expected(results)[report.PAGES["results"]]
    assert "Pending" not in page
    assert "`val/bpc` 6.1234, `val/loss` 4.2500; 70 s in all" in page
    assert re.search(r"^free +2 +100\.0%", page, re.M)  # evaluate.py's own table: n, then `regulated`
    assert "### On 3 held-out poems" in page and page.count("  random-like\n") == 2 * 4  # held-out and probe


def test_the_studio_pages_figures_come_from_its_json(results):
    edit(results, "studio-cpu", lambda d: d.update(cold_first_ms=987.0))
    assert report.stale(results) == [report.PAGES["studio"]]
    assert "(a 七律 with meter) had its first character after 987 ms" in report.expected(results)[report.PAGES["studio"]]


def test_free_samples_are_marked_with_their_rhyme_group_or_no_rhyme():
    e = {"poems": {"free": ["床前明月光，疑是地上霜。举头望明月，低头思故乡。",
                            "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。",
                            "千山鸟飞绝，万径人踪灭。孤舟蓑笠翁，独钓寒江雪。"]}}
    assert report.free_samples(e).splitlines() == ["1. 床前明月光，疑是地上霜。举头望明月，低头思故乡。 — 下平聲七陽",
                                  "2. 白日依山尽，黄河入海流。欲穷千里目，更上一层楼。 — 下平聲十一尤",
                                  "3. 千山鸟飞绝，万径人踪灭。孤舟蓑笠翁，独钓寒江雪。 — no rhyme"]


def test_the_readme_caption_says_in_two_sentences_what_the_heads_that_look_at_the_rhyme_are(results):
    """Issue 37, item 6: the looking heads off together against the noise, and the largest drop beside it;
    a run where no head looks at the rhyme says so, with the largest drop of a layer switched off."""
    def study(looking, together=None, layer0=(-87.4, [-90.1, -84.7])):
        def change(d):
            free = {"intact": {"heads": [], "change": 0.0, "interval": [0.0, 0.0]},
                    "layer 0": {"heads": [f"L0H{h}" for h in range(4)], "change": layer0[0], "interval": layer0[1]},
                    "layer 1": {"heads": [f"L1H{h}" for h in range(4)], "change": -0.5, "interval": [-4.0, 3.0]},
                    "random set 1": {"heads": ["L2H0"], "change": -99.0, "interval": [-99.5, -98.5]}}
            if looking:
                free["looking heads together"] = {"heads": looking, "change": together[0], "interval": together[1]}
            d["head_effects"]["rhyme"].update(looking=looking, free=free)
        edit(results, "attention-maps-default-cpu", change)
        caption = report.readme_blocks(report.load(results))["caption"]
        assert caption.count(". ") == 1 and caption.endswith(".*") and "nats" not in caption
        return caption

    caption = study(["L1H1", "L3H0"], (-1.9, [-6.4, 2.6]))
    figures = report.load(results)["attention-maps-default-cpu"]["figures"]
    assert caption.startswith(f"*Layer {len(figures) - 1} (the last) of the default run")  # the figure it captions
    assert "L1H1 and L3H0, are not heads the rhyme needs" in caption
    assert "by -1.9 points, within the noise (95 % interval -6.4 to +2.6), while without layer 0 it falls by 87.4" in caption
    caption = study(["L1H1", "L3H0"], (-12.5, [-16.0, -9.0]))
    assert "L1H1 and L3H0, are heads the rhyme needs" in caption and "by -12.5 points, outside the noise" in caption
    caption = study([])  # the random sets are controls, never the largest drop
    assert ": no head looks at the previous line's rhyme more than the flag asks, so none is a candidate rhyme head. " \
        "Switched off, the largest drop in the share of free regulated poems that rhyme is without layer 0, 87.4 " \
        "points (95 % interval -90.1 to -84.7) ([every verdict]" in caption
    assert "no layer switched off moves the share" not in caption
    caption = study([], layer0=(-1.0, [-5.0, 3.0]))
    assert "No layer switched off moves the share of free regulated poems that rhyme beyond the noise (" in caption
