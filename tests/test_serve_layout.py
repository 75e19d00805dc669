"""Imports point one way: the command line uses the server, never the reverse."""

import ast
from pathlib import Path

import sbd.serving


def test_nothing_under_serving_imports_the_command_line():
    folder = Path(sbd.serving.__file__).parent
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                target = "." * node.level + (node.module or "")
                assert not (target.startswith("..cli") or target.startswith("sbd.cli")), f"{path.name}: {target}"
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("sbd.cli") for a in node.names), path.name
