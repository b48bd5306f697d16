"""Every name a bench/ script imports from chatrun exists: the benchmarks are not run by the
suite (they measure, on a quiet machine), so a renamed helper would leave one broken unnoticed
(bench_report.py imported `cli.report._write` for a while after the CLI lost it)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _chatrun_imports() -> list[tuple[str, str, str, int]]:
    found = []
    for script in sorted(BENCH.glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text(), str(script))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "chatrun":
                found += [(script.name, node.module, alias.name, node.lineno) for alias in node.names]
    return found


@pytest.mark.parametrize(("script", "module", "name", "line"), _chatrun_imports(),
                         ids=lambda v: str(v))
def test_a_bench_scripts_chatrun_import_exists(script: str, module: str, name: str, line: int) -> None:
    imported = importlib.import_module(module)
    if not hasattr(imported, name):
        importlib.import_module(f"{module}.{name}")  # a submodule: raises when it is not one either


def test_the_bench_scripts_import_something_of_chatrun() -> None:
    assert len({script for script, *_ in _chatrun_imports()}) >= 10  # the walk above finds them
