"""How the test suite itself is laid out: shared helpers and fixtures live in support
modules (``tests/*_support.py``, ``tests/factories.py``, the fixtures ``conftest.py``
registers), so no test module imports another and a test runs where pytest collected it."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _imported_test_modules(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        found += [n for n in names if n.startswith("tests.test_") or n.startswith("test_")]
    return found


def test_no_test_module_imports_another():
    imports = {
        str(path.relative_to(TESTS)): modules
        for path in sorted(TESTS.rglob("*.py"))
        if (modules := _imported_test_modules(path))
    }
    assert imports == {}


def test_the_check_finds_an_import_of_a_test_module(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import os\nfrom tests.test_fast_path import X\nimport tests.test_docs\n"
        "from langgraph.checkpoint.conformance.test_utils import generate_checkpoint\n"
    )
    assert _imported_test_modules(sample) == ["tests.test_fast_path", "tests.test_docs"]
