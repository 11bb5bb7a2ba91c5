"""The import graph is the data flow: every module imports only its own layer and the layers
below it, and no import is circular (imports inside functions and under TYPE_CHECKING count)."""
import ast
import graphlib
import subprocess
import sys

import pytest

from tests.conftest import ROOT

LAYERS = (  # lowest first; a module belongs to the layer of its longest matching prefix
    ("poetry rules", ("data.verse",)),
    ("data pipeline", ("data",)),
    ("network", ("model.attention", "model.poem_inputs", "model.gpt")),
    ("engine", ("model.engine", "model.decoding", "model.checkpoint_meta", "model.kv_cache", "model.device",
                "model.ablation", "model.loading")),
    ("sampling", ("model.sampling",)),
    ("inspection", ("model.inspection",)),
    ("training", ("model.training",)),
    ("entry scripts", ("model.cli", "train", "sample", "evaluate", "attention_maps", "benchmarks")),
    ("studio", ("studio", "model.studio", "benchmarks.studio")),  # the page's server: a thin top layer nothing imports
)
NOT_PURE = {"torch", "numpy", "lightning", "torchmetrics", "torchdata", "hydra", "omegaconf", "tiktoken", "matplotlib"}
"""Packages the poetry rules never import: they are pure Python (and a few dictionaries' data)."""
LIGHTNING = {"lightning", "lightning_fabric", "pytorch_lightning", "torchmetrics"}


def project_modules() -> dict[str, ast.Module]:
    """Dotted name → parsed source of every module of data/, model/, benchmarks/ and the entry scripts."""
    files = [*ROOT.glob("*.py"), *(p for d in ("data", "model", "benchmarks") for p in (ROOT / d).rglob("*.py"))]
    modules = {}
    for path in files:
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = ast.parse(path.read_text(), str(path))
    return modules


def imports(name: str, tree: ast.Module, known: set[str]) -> tuple[set[str], set[str]]:
    """(project modules, top-level names of other packages) that module `name` imports anywhere in it."""
    inner, outer = set(), set()
    package = name if any(k.startswith(name + ".") for k in known) else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], *filter(None, [base])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            owner = next((t for t in (target, *_parents(target)) if t in known), None)
            if owner is not None:
                inner.add(owner)
            elif target.split(".")[0] not in sys.stdlib_module_names and target != "__future__":
                outer.add(target.split(".")[0])
    inner.discard(name)
    return inner, outer


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def layer_of(name: str) -> int:
    """The index in LAYERS of a module's layer. raises KeyError for a module in none."""
    matches = [(len(prefix), i) for i, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
               if name == prefix or name.startswith(prefix + ".")]
    if not matches:
        raise KeyError(f"{name} belongs to no layer of tests/test_imports.py LAYERS")
    return max(matches)[1]


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a layer above its own, as `a (layer) imports b (layer)`."""
    return [f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
            for a, targets in sorted(graph.items()) for b in sorted(targets) if layer_of(b) > layer_of(a)]


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circular chain of imports (`[a, b, ..., a]`), or None if there is none."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        return err.args[1]
    return None


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    modules = project_modules()
    found = {name: imports(name, tree, set(modules)) for name, tree in modules.items()}
    return {n: inner for n, (inner, _) in found.items()}, {n: outer for n, (_, outer) in found.items()}


def test_every_import_points_down_and_none_is_circular(graph):
    inner, _ = graph
    assert upward(inner) == []
    assert cycle(inner) is None


def test_the_checks_catch_an_upward_import_and_a_cycle(graph):
    inner, _ = graph
    planted = {**inner, "model.sampling.poems": inner["model.sampling.poems"] | {"model.training.lit"}}
    assert upward(planted) == ["model.sampling.poems (sampling) imports model.training.lit (training)"]
    assert cycle(inner) is None and cycle({**inner, "model.engine": inner["model.engine"] | {"model.sampling.poems"}})
    assert cycle({"data.a": {"data.b"}, "data.b": {"data.a"}}) in (["data.a", "data.b", "data.a"],
                                                                ["data.b", "data.a", "data.b"])


def test_the_poetry_rules_are_pure_python_and_corpus_reading_a_leaf(graph):
    inner, outer = graph
    verse = [n for n in inner if n.startswith("data.verse")]
    assert len(verse) >= 6 and all(layer_of(b) == 0 for n in verse for b in inner[n])  # nothing of the pipeline
    assert {n: outer[n] & NOT_PURE for n in verse if outer[n] & NOT_PURE} == {}
    assert {layer_of(b) for b in inner["data.corpus_io"]} <= {0} and not outer["data.corpus_io"] & NOT_PURE
    assert inner["model.gpt"] == {"model.attention", "model.poem_inputs"}  # the network: the attention, the poem inputs
    assert inner["model.poem_inputs"] == {"data.features"}  # their ids and counts: the data layer's one definition


def test_sampling_and_inspection_need_no_lightning(graph):
    inner, outer = graph
    starts = [n for n in inner if n.startswith(("model.engine", "model.sampling", "model.inspection"))]
    reach = {m for n in starts for m in (n, *descendants(inner, n))}
    assert {n: outer[n] & LIGHTNING for n in sorted(reach) if outer[n] & LIGHTNING} == {}
    probe = "import sys, sample; print(sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:])))"
    out = subprocess.run([sys.executable, "-c", probe, *LIGHTNING], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"  # sample.py starts without Lightning


def descendants(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for b in graph.get(todo.pop(), ()):
            if b not in seen:
                seen.add(b)
                todo.append(b)
    return seen


MAX_FUNCTION_LINES = 60
"""Issue 59: no product function longer than this (its `def` to its last line, docstring included)."""


def test_no_product_function_is_longer_than_sixty_lines():
    long = [f"{name}.{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for name, tree in project_modules().items() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


MAX_SAMPLING_LINES = 1396
"""Issue 59: `model/sampling/` no longer than it was when the issue was filed (its rules decided once,
not again by each caller); a new drawing lever belongs to the engine (`model/decoding.py`)."""


def test_the_sampling_package_is_no_longer_than_when_issue_59_was_filed():
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in (ROOT / "model" / "sampling").glob("*.py"))
    assert 1000 < lines <= MAX_SAMPLING_LINES
