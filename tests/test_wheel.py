"""The package carries what it reads (issue 54): the wheel `pip install .` builds holds every file the
packages read at run time (pyproject.toml's package-data; data/paths.py), so installed outside the
checkout it imports every module and samples a 五绝 with rhyme and a 词 to 浣溪沙, from a working
directory that is not the checkout, with the checkout on no path."""
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import ROOT

SOURCES = ("pyproject.toml", "requirements.txt", "README.md", "data", "model")
"""What the wheel is built from (pyproject.toml: the packages `data*`, `model*`, their package data)."""

SHIPPED_CORPUS = ("data/corpus/tang.jsonl.xz", "data/corpus/ci.jsonl.xz", "data/corpus/LICENSE", "data/corpus/README.md")
"""The corpora the packages read (the title plan, the 词 metrics) and their licence; not the Song corpus (training
only, by a config's path) nor the corpora's stats (the tests')."""

INSTALLED = r"""
import importlib, itertools, json, pkgutil, sys
from pathlib import Path

site = Path(sys.argv[1]).resolve()
import data, model
assert all(Path(p.__file__).resolve().is_relative_to(site) for p in (data, model)), (data.__file__, model.__file__)
for package in (data, model):  # a module that reads a file at import time reads it from the wheel
    for m in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(m.name)

import torch
from omegaconf import OmegaConf

from data.corpus_io import iter_corpus
from data.paths import CORPUS_DIR, cache_dir, user_cache_dir
from data.tokenizer import CharTokenizer
from data.verse.poetry import form_of, split_lines
from data.verse.rhyme import rhyme_groups
from data.verse.tunes import variant_of
from model.engine import Engine
from model.inspection.ci_metrics import CI_CORPUS
from model.loading import build_gpt
from data import title_plan
from model.sampling import poems as sampling
from model.sampling.poems import SamplingOptions, sample_poems
from model.studio.server import create_app

assert CI_CORPUS.is_file(), f"{CI_CORPUS} missing: the 词 metrics' corpus"
assert title_plan.CORPUS.is_file(), f"{title_plan.CORPUS} missing: the title plan's corpus"
assert cache_dir(title_plan.CACHE_DIR) == user_cache_dir()  # the title plan's cache: never into site-packages
create_app(checkpoint_dir=Path.cwd() / "checkpoints")  # the studio's page, with the attention view's
recipe = OmegaConf.to_container(OmegaConf.load(Path(sampling.__file__).with_name("recipe.yaml")))
assert {k: getattr(SamplingOptions(), k) for k in recipe} == recipe  # the sampling recipe, from the package

texts = [p["text"] for p in itertools.islice(iter_corpus(CORPUS_DIR / "ci.jsonl.xz"), 3000)]  # simplified
tok = CharTokenizer.from_texts(texts)
torch.manual_seed(0)
engine = Engine(build_gpt({"block_size": 128, "n_layer": 1, "n_head": 2, "n_embd": 16}, tok).eval(), tok)
opts = dict(num_samples=3, temperature=1.0, top_k=None, max_new_tokens=100)
poems = sample_poems(engine, SamplingOptions(form="wujue", rhyme=True, **opts))
ci = sample_poems(engine, SamplingOptions(tune="浣溪沙", **opts))
print(json.dumps({"poems": poems, "ci": ci}, ensure_ascii=False))
for p in poems:
    ends = [line[-2] for line in split_lines(p)[1::2]]  # the character before 。
    groups = rhyme_groups(ends, "simplified")
    assert form_of(p) == "wujue" and set(groups) == set(ends) and frozenset.intersection(*groups.values()), p
assert all(variant_of(c, "浣溪沙") is not None for c in ci), ci
"""


def has_setuptools_wheel() -> bool:
    """Whether this environment's setuptools builds wheels by itself (70.1+: bdist_wheel built in), so
    the build needs no isolated environment fetched from the index."""
    try:
        from setuptools.command.bdist_wheel import bdist_wheel  # noqa: F401
    except ImportError:
        return False
    return True


def build_wheel(src: Path, out: Path) -> Path:
    """The wheel of a copy of the checkout's sources at `src` (a copy: building in the checkout would
    leave build/ there, whose stale files a later wheel takes in), written to `out`."""
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "cache"))
        else:
            shutil.copy2(ROOT / name, src / name)
    cmd = [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-q", "-w", str(out)]
    subprocess.run(cmd + ["--no-build-isolation"] * has_setuptools_wheel(), check=True, cwd=src)
    return next(out.glob("mingyue-*.whl"))


def test_the_wheel_imports_and_samples_outside_the_checkout(tmp_path):
    wheel = build_wheel(tmp_path / "src", tmp_path / "dist")
    site, work = tmp_path / "site", tmp_path / "work"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(site),
                    str(wheel)], check=True)
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PROJECT_ROOT")}
    env.update(PYTHONPATH=str(site), XDG_CACHE_HOME=str(tmp_path / "user-cache"), OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-c", INSTALLED, str(site)], cwd=work, env=env, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(out["poems"]) == len(out["ci"]) == 3
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if not n.endswith(".py") and ".dist-info/" not in n}
    files = [p.relative_to(ROOT) for package in ("data", "model") for p in (ROOT / package).rglob("*") if p.is_file()]
    assert shipped == {p.as_posix() for p in files  # every data file in the packages' folders, and the corpora read
                       if p.suffix not in (".py", ".pyc") and {"corpus", "cache"}.isdisjoint(p.parts)} | set(SHIPPED_CORPUS)
    assert not (site / "data" / "cache").exists() and sorted(p.name for p in work.iterdir()) == []


def test_a_cache_is_never_written_into_the_installed_packages(tmp_path, monkeypatch):
    """data.paths.cache_dir: in a checkout, where it is asked for; installed (no checkout), a cache inside the
    packages' tree goes to the user's cache folder ($XDG_CACHE_HOME/mingyue), one elsewhere where it is asked for."""
    from data import paths

    assert paths.CHECKOUT == ROOT and paths.CORPUS_DIR == ROOT / "data" / "corpus"
    assert paths.cache_dir(ROOT / "data" / "cache") == ROOT / "data" / "cache"
    monkeypatch.setattr(paths, "CHECKOUT", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.cache_dir(paths.PACKAGE_DIR / "cache") == tmp_path / "xdg" / "mingyue"
    assert paths.cache_dir(tmp_path / "mine") == tmp_path / "mine"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert paths.user_cache_dir() == Path.home() / ".cache" / "mingyue"
