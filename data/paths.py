"""Where the packages' own files are, and where their caches go, in a checkout or installed from the wheel.

Every file the packages read at run time lies inside them, and `pip install .` (a wheel) carries it
as package data (pyproject.toml, `[tool.setuptools.package-data]`): the verse tables beside their
modules (data/verse/), the attention view's and the studio's pages, the sampling recipe
(model/sampling/recipe.yaml), and the Tang and 词 corpora under `CORPUS_DIR` (tang.jsonl.xz: the
title plan's training poems; ci.jsonl.xz: the 词 metrics' training lines and held-out 词). The
Song corpus, which only training reads (by a config's path), stays in the checkout.

A cache goes where its caller asks (`cache_dir`), except inside the installed packages: a wheel's
tree (site-packages, or wherever it was unpacked) is never written to, and such a cache goes to
`user_cache_dir()` instead ($XDG_CACHE_HOME/mingyue, by default ~/.cache/mingyue). In a checkout
(its root holds .project-root) data/cache is the cache, as the Hydra configs' `data.cache_dir`.
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
"""The `data` package's folder: data/ in a checkout, site-packages/data installed."""
CORPUS_DIR = PACKAGE_DIR / "corpus"
"""The shipped corpora (data/corpus/README.md); tang.jsonl.xz and ci.jsonl.xz are package data."""
CHECKOUT = PACKAGE_DIR.parent if (PACKAGE_DIR.parent / ".project-root").is_file() else None
"""The project checkout the packages are imported from, None for an installed wheel."""


def user_cache_dir() -> Path:
    """The user's cache folder for the packages: $XDG_CACHE_HOME/mingyue, else ~/.cache/mingyue."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mingyue"


def cache_dir(wanted: str | Path) -> Path:
    """Where a cache asked for at `wanted` goes: `wanted`, unless the packages are installed (no
    checkout) and it lies inside their tree (site-packages, or the folder a wheel was unpacked
    into; e.g. the package-relative data/cache): then `user_cache_dir()`."""
    wanted = Path(wanted).expanduser().resolve()
    return user_cache_dir() if CHECKOUT is None and wanted.is_relative_to(PACKAGE_DIR.parent) else wanted
