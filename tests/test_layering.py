"""The apps depend one way (pyproject.toml, [tool.importlinter]; `make lint` runs it): the
real tree keeps the contracts, and a copy of it with one upward import or one cycle does
not."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LINT_IMPORTS, "pyproject.toml", "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    """The root packages' Python files and pyproject.toml, copied to tmp_path."""
    for package in CONFIG["root_packages"]:
        shutil.copytree(
            ROOT / package,
            tmp_path / package,
            ignore=lambda _dir, names: (
                [n for n in names if not n.endswith(".py") and not (Path(_dir) / n).is_dir()]
                + ["__pycache__", "templates", "static", "fixtures"]
            ),
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_its_import_contracts():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


def test_the_layers_run_from_the_web_glue_down_to_the_ground():
    layers = CONFIG["contracts"][0]["layers"]
    # Top first: a layer's position is its height. Siblings share one.
    positions = {
        name.strip(): index
        for index, layer in enumerate(layers)
        for name in layer.replace(":", "|").split("|")
    }
    chain = ["console", "api", "approvals", "runtime", "checkpoints", "tenants"]
    heights = [positions[name] for name in chain]
    assert heights == sorted(heights) and len(set(heights)) == len(heights) - 1


@pytest.mark.parametrize(
    ("module", "upward_import", "reported"),
    [
        (
            "checkpoints/models.py",
            "import runtime.executor",
            "checkpoints is not allowed to import runtime",
        ),
        (
            "tenants/roles.py",
            "import checkpoints.models",
            "tenants is not allowed to import checkpoints",
        ),
        (
            "runtime/lease.py",
            "import approvals.models",
            "runtime is not allowed to import approvals",
        ),
    ],
)
def test_an_upward_import_breaks_the_lint(tree_copy, module, upward_import, reported):
    with (tree_copy / module).open("a") as source:
        source.write(f"\n{upward_import}  # noqa\n")
    result = lint_imports(tree_copy)
    assert result.returncode == 1
    assert reported in result.stdout


def test_a_cycle_inside_an_app_breaks_the_lint(tree_copy):
    # runtime.registry imports runtime.definition; the reverse closes a cycle.
    with (tree_copy / "runtime" / "definition.py").open("a") as source:
        source.write("\nimport runtime.registry  # noqa\n")
    result = lint_imports(tree_copy)
    assert result.returncode == 1
    assert "No cycles are allowed in runtime" in result.stdout
