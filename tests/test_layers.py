"""Imports point one way: no module imports itself back through others, and no layer imports a layer
above it. The order is the one README.md "Layout" gives; the graph is read from the source with `ast`
(module-level and function-level imports, relative and absolute), nothing is imported.

SBD_LAYERS_ROOT=DIR checks another checkout (DIR holds the `sbd` package), e.g. an older commit.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(os.environ.get("SBD_LAYERS_ROOT") or Path(__file__).resolve().parent.parent)
PACKAGE = "sbd"

# Lowest first. A module belongs to the layer of the longest entry that names it or one of its packages
# ("sbd" names only the package's __init__.py); an import may point to its own layer or any layer below,
# never above. The same order as README.md "Layout" (tests/test_readme_results.py holds the two together).
LAYERS = [
    ["sbd.errors", "sbd._version", "sbd.interrupts"],
    ["sbd.modes", "sbd.masks", "sbd.sampler", "sbd.tasks"],
    ["sbd.drafters"],
    ["sbd.models"],
    ["sbd.decoding"],
    ["sbd.training", "sbd.evaluation", "sbd.benchmarking"],
    ["sbd.experiment", "sbd.serving"],
    ["sbd.integrations"],  # beside the library (vLLM's plug-in); only the CLI hands over to it
    ["sbd.cli"],
    ["sbd", "sbd.console"],  # the package's face, and the `sbd` command's entry  # the package's face, sbd/__init__.py: hands the public names on
]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted((root / PACKAGE).rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports anywhere in its file (a package counts as its
    __init__; `from pkg import mod` counts as pkg.mod when mod is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()

    def add(target: str) -> None:
        while target and target not in known:  # `sbd.models.loading.load` -> sbd.models.loading
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                if f"{source}.{alias.name}" in known:
                    add(f"{source}.{alias.name}")
                else:
                    add(source)
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    found = modules(root)
    return {name: imported(name, path, set(found)) for name, path in found.items()}


def layer_of(name: str, layers: list[list[str]] = LAYERS) -> int:
    best = None
    for i, names in enumerate(layers):
        for prefix in names:
            if name == prefix or (prefix != PACKAGE and name.startswith(prefix + ".")):
                if best is None or len(prefix) > best[1]:
                    best = (i, len(prefix))
    if best is None:
        raise AssertionError(f"{name} is in no layer: add it to LAYERS (and to README.md 'Layout')")
    return best[0]


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def upward(edges: dict[str, set[str]], layers: list[list[str]] = LAYERS) -> list[str]:
    return sorted(f"{a} (layer {layer_of(a, layers)}) -> {b} (layer {layer_of(b, layers)})"
                  for a, targets in edges.items() for b in targets if layer_of(b, layers) > layer_of(a, layers))


def test_the_reader_finds_every_kind_of_import(tmp_path):
    # a made-up package: each kind of import once, one circle a -> b -> c -> a, one arrow up (low -> a)
    files = {
        "__init__.py": "from .a import x\n",
        "a.py": "from .b import y\nimport json\n",                       # relative, module level
        "b.py": "def f():\n    from sbd.c import z\n    return z\n",     # absolute, in a function
        "c.py": "import sbd.a\n",                                          # plain import
        "low/__init__.py": "",
        "low/m.py": "from .. import a\nfrom . import n\n",                 # a module taken from its package
        "low/n.py": "from ..errors import E\n",                             # a module that is not there
    }
    for name, text in files.items():
        (tmp_path / PACKAGE / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / PACKAGE / name).write_text(text)
    edges = graph(tmp_path)
    assert edges == {"sbd": {"sbd.a"}, "sbd.a": {"sbd.b"}, "sbd.b": {"sbd.c"}, "sbd.c": {"sbd.a"},
                     "sbd.low": set(), "sbd.low.m": {"sbd.a", "sbd.low.n"}, "sbd.low.n": {"sbd"}}
    assert circles(edges) == [["sbd.a", "sbd.b", "sbd.c"]]
    layers = [["sbd.low"], ["sbd.a", "sbd.b", "sbd.c"], ["sbd"]]
    assert upward(edges, layers) == ["sbd.low.m (layer 0) -> sbd.a (layer 1)", "sbd.low.n (layer 0) -> sbd (layer 2)"]


def test_no_import_circles():
    found = circles(graph())
    assert not found, "modules that import each other (directly or through others): " + \
        "; ".join(" <-> ".join(c) for c in found)


def test_no_import_points_up_a_layer():
    up = upward(graph())
    assert not up, "imports from a lower layer to a higher one:\n" + "\n".join(up)


@pytest.mark.parametrize("name", sorted(modules()))
def test_every_module_has_a_layer(name):
    layer_of(name)
