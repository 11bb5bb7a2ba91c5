"""The one start-mode resolver (issue 59, `model.training.start`): each of the four starts from the
options that ask for it, the refusals in one line, and one resolution per run. The checkpoints are
stand-ins (what `load_checkpoint` and `Base` would read); one end-to-end run of each start:
tests/test_train.py (scratch), tests/test_resume.py (resume), tests/test_finetune.py (fine-tune and
resuming it)."""
import pytest
from omegaconf import OmegaConf

from model.training import start as start_module
from model.training.start import FINETUNE, RESUME, RESUME_FINETUNE, SCRATCH, resolve_start

TUNED = {"from": "base/last.ckpt", "from_weights_sha": "ab", "poets": ["李白"], "corpus": "tang.jsonl.xz",
         "train_poems": 9, "val_poems": 1}


class Base:
    """Stands in for `model.training.finetune.Base`: says how it was made."""
    read = classmethod(lambda cls, spec, folder: ("read", spec))
    of = classmethod(lambda cls, path, saved: ("of", path.parent.name))


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """Checkpoint files: `scratch` (a run trained from scratch, step 7) and `tuned` (a fine-tuning run on
    李白, step 5); each read is counted."""
    reads = []
    saved = {"scratch": {"global_step": 7}, "tuned": {"global_step": 5, "finetuned": TUNED}}
    for name in saved:
        (tmp_path / name).mkdir()
        (tmp_path / name / "last.ckpt").write_bytes(b"stand-in")
    monkeypatch.setattr(start_module, "load_checkpoint", lambda path: reads.append(path) or saved[path.parent.name])
    monkeypatch.setattr(start_module, "Base", Base)
    monkeypatch.setattr(start_module, "_kept", None)
    return tmp_path, reads


def config(folder, *, ckpt_path=None, init_from=None, finetune=False, poets=()):
    return OmegaConf.create({"ckpt_path": ckpt_path and str(folder / ckpt_path), "init_from": init_from,
                             "run_tag": "-ft-libai" if finetune else "", "paths": {"checkpoint_dir": str(folder)},
                             "data": {"poets": list(poets), "corpus_path": "/corpus/tang.jsonl.xz"}})


def test_each_start_is_resolved_from_the_options_that_ask_for_it(runs):
    folder, _ = runs
    scratch = resolve_start(config(folder))
    assert (scratch.mode, scratch.ckpt_path, scratch.base, scratch.resuming) == (SCRATCH, None, None, False)
    resume = resolve_start(config(folder, ckpt_path="scratch"))
    assert (resume.mode, resume.ckpt_path, resume.saved["global_step"], resume.base) == \
        (RESUME, folder / "scratch" / "last.ckpt", 7, None)
    tune = resolve_start(config(folder, init_from="base", finetune=True, poets=["李白"]))
    assert (tune.mode, tune.ckpt_path, tune.base) == (FINETUNE, None, ("read", "base"))
    again = resolve_start(config(folder, ckpt_path="tuned", finetune=True, poets=["李白"]))
    assert (again.mode, again.saved["global_step"], again.base) == (RESUME_FINETUNE, 5, ("of", "tuned"))
    given = resolve_start(config(folder, ckpt_path="tuned", init_from="base", finetune=True, poets=["李白"]))
    assert (given.mode, given.base) == (RESUME_FINETUNE, ("of", "tuned"))  # init_from is not read: its own base


@pytest.mark.parametrize("options, message", [
    ({"finetune": True}, "experiment=finetune needs init_from="),
    ({"ckpt_path": "scratch", "finetune": True}, "experiment=finetune needs init_from="),
    ({"ckpt_path": "scratch", "init_from": "base", "finetune": True},
     r"scratch/last.ckpt is no fine-tuning run, and init_from=base starts one: give ckpt_path to resume it"),
    ({"ckpt_path": "tuned"}, r"is a fine-tuning run on 李白: resume it as it was started, python train.py "
                             r"experiment=finetune \"data.poets=\[李白\]\" ckpt_path="),
    ({"ckpt_path": "tuned", "finetune": True, "poets": ["杜甫"]}, "is a fine-tuning run on 李白"),
    ({"ckpt_path": "nowhere"}, "checkpoint .*nowhere not found"),
])
def test_a_start_that_cannot_be_is_refused_in_one_line(runs, options, message):
    folder, _ = runs
    with pytest.raises((ValueError, FileNotFoundError), match=message) as err:
        resolve_start(config(folder, **options))
    assert "\n" not in str(err.value)


def test_a_run_is_resolved_once_and_again_when_its_checkpoint_changes(runs):
    """Hydra's callback resolves the start before the run's folder is made, train() gets the same record."""
    folder, reads = runs
    first = resolve_start(config(folder, ckpt_path="scratch"))
    assert resolve_start(config(folder, ckpt_path="scratch")) is first and len(reads) == 1
    (folder / "scratch" / "last.ckpt").write_bytes(b"another stand-in")  # a new step saved: read again
    assert resolve_start(config(folder, ckpt_path="scratch")) is not first and len(reads) == 2
    assert resolve_start(config(folder)).mode == SCRATCH and len(reads) == 2
    kept = resolve_start(config(folder, ckpt_path="scratch"))
    assert resolve_start(config(folder, ckpt_path="scratch"), keep=False) is kept  # train() takes Hydra's check's
    assert resolve_start(config(folder, ckpt_path="scratch")) is not kept and len(reads) == 4  # then resolves anew
