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

# Lowest first. A module belongs to the first entry that names it or one of its packages; an import may
# point to its own layer or any layer below, never above. The same order as README.md "Layout".
LAYERS = [
    ["sbd.errors", "sbd._version"],
    ["sbd.modes", "sbd.masks", "sbd.sampler", "sbd.tasks"],
    ["sbd.adapter"],
    ["sbd.models"],
    ["sbd.decoding"],
    ["sbd.training", "sbd.evaluation", "sbd.benchmarking"],
    ["sbd.experiment", "sbd.serving"],
    ["sbd.cli"],
    ["sbd"],  # the package's face, sbd/__init__.py: hands the public names on
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


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


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imported(name, path, set(found)) for name, path in found.items()}


def layer_of(name: str) -> int:
    best = None
    for i, names in enumerate(LAYERS):
        for prefix in names:
            if name == prefix or name.startswith(prefix + "."):
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


def test_the_graph_reads_relative_absolute_and_function_level_imports():
    # a guard on the reader itself: imports known to exist in the package, of each kind
    edges = graph()
    assert "sbd.errors" in edges["sbd.models.loading"]                  # from ..errors import (module level)
    assert "sbd.models.narrow_linear" in edges["sbd.models.loading"]    # from . import narrow_linear (in load())
    assert "sbd.models.loading" in edges["sbd.cli.main"]                # from ..models.loading import load (in a function)
    assert "sbd.decoding.generate" in edges["sbd"]                      # the package's face


def test_no_import_circles():
    found = circles(graph())
    assert not found, "modules that import each other (directly or through others): " + \
        "; ".join(" <-> ".join(c) for c in found)


def test_no_import_points_up_a_layer():
    edges = graph()
    up = sorted(f"{a} (layer {layer_of(a)}) -> {b} (layer {layer_of(b)})"
                for a, targets in edges.items() for b in targets if layer_of(b) > layer_of(a))
    assert not up, "imports from a lower layer to a higher one:\n" + "\n".join(up)


@pytest.mark.parametrize("name", sorted(modules()))
def test_every_module_has_a_layer(name):
    layer_of(name)
