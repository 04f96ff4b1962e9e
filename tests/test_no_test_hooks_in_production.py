"""Test-only hooks stay out of production code: no module outside tests/ reads a test-only
environment variable, and under the production settings every fault point is inert.

The scan covers every .py file of the repository outside tests/ and hidden directories
(.venv, .git): the apps, cairn/, examples/ and bench/. bench/ is no production code, but the
rule is "outside tests/", and a benchmark has no reason to read a test hook either.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import cairn.faults

REPO = Path(__file__).resolve().parent.parent

# An environment-variable-shaped word (CAIRN_TEST_CRASH_AT) with a TEST… component.
ENV_NAME = re.compile(r"(?<![A-Za-z0-9_])[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+(?![A-Za-z0-9_])")
ENV_READERS = {"get", "getenv", "pop", "setdefault", "env", "env_bool", "env_int"}


def _is_test_name(word: str) -> bool:
    return any(part.startswith("TEST") for part in word.split("_"))


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def _env_read_names(node: ast.AST) -> list[ast.Constant]:
    """The constant names an environment read passes: os.environ[...], os.environ.get(...),
    os.getenv(...), "..." in os.environ, and the settings' env()/env_int()/env_bool()."""
    candidates: list[ast.AST] = []
    if isinstance(node, ast.Subscript) and _is_environ(node.value):
        candidates.append(node.slice)
    elif isinstance(node, ast.Call) and node.args:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        on_environ = isinstance(func, ast.Attribute) and _is_environ(func.value)
        if name in {"getenv", "env", "env_bool", "env_int"} or (on_environ and name in ENV_READERS):
            candidates.append(node.args[0])
    elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
        candidates.append(node.left)
    return [c for c in candidates if isinstance(c, ast.Constant) and isinstance(c.value, str)]


def production_modules(root: Path) -> list[Path]:
    modules = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(
            d
            for d in subdirs
            if not d.startswith(".")
            and d not in {"__pycache__", "node_modules"}
            and not (Path(directory) == root and d == "tests")
        )
        modules += [Path(directory) / f for f in sorted(files) if f.endswith(".py")]
    return modules


def scan_test_only_env_reads(root: Path) -> list[str]:
    """ "path:line: NAME" for every test-only environment variable a module outside tests/
    names in code (docstrings and comments aside) or reads from the environment."""
    findings = []
    for path in production_modules(root):
        tree = ast.parse(path.read_text(), filename=str(path))
        docstrings = _docstrings(tree)
        hits: set[tuple[int, str]] = set()
        for node in ast.walk(tree):
            for constant in _env_read_names(node):
                if "test" in constant.value.lower():
                    hits.add((constant.lineno, constant.value))
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
            ):
                hits |= {(node.lineno, w) for w in ENV_NAME.findall(node.value) if _is_test_name(w)}
        findings += [f"{path.relative_to(root)}:{line}: {name}" for line, name in sorted(hits)]
    return findings


def fault_points_in_code(root: Path) -> set[str]:
    names = set()
    for path in production_modules(root):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", "")) == "fault_point"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                names.add(node.args[0].value)
    return names


def test_no_module_outside_tests_reads_a_test_only_environment_variable():
    findings = scan_test_only_env_reads(REPO)
    assert not findings, "test-only environment variables read outside tests/:\n" + "\n".join(
        findings
    )


def test_the_scan_finds_a_test_hook_however_it_is_read(tmp_path: Path):
    """The scan above passes only because it can fail: planted reads are found, named by file
    and line; docstrings, Django's DATABASES["TEST"] key and tests/ itself are not."""
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "crash.py").write_text(
        '"""Mentions CAIRN_TEST_CRASH_AT in a docstring."""\n'
        "import os\n"
        'AT = os.environ["CAIRN_TEST_CRASH_AT"]\n'
        'PAUSE_ENV = "CAIRN_RETENTION_TEST_PAUSE"\n'
        "pause = os.environ.get(PAUSE_ENV)\n"
        'flag = os.getenv("cairn_test_flag")\n'
        'armed = "CAIRN_TESTING" in os.environ\n'
        'DATABASES = {"default": {"TEST": {"NAME": "x"}}}\n'
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "hooks.py").write_text('import os\nos.environ["CAIRN_TEST_CRASH_AT"]\n')
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "lib.py").write_text('import os\nos.environ["CAIRN_TEST_CRASH_AT"]\n')

    assert scan_test_only_env_reads(tmp_path) == [
        "app/crash.py:3: CAIRN_TEST_CRASH_AT",
        "app/crash.py:4: CAIRN_RETENTION_TEST_PAUSE",
        "app/crash.py:6: cairn_test_flag",
        "app/crash.py:7: CAIRN_TESTING",
    ]


def test_every_fault_point_in_the_code_is_documented_in_cairn_faults():
    points = fault_points_in_code(REPO)
    assert "effect.reserved" in points and "retention.batch" in points, points
    undocumented = {p for p in points if f"``{p}``" not in cairn.faults.__doc__}
    assert not undocumented, f"fault points missing from cairn/faults.py: {undocumented}"


CALL_EVERY_FAULT_POINT = """
import os, sys
import django
django.setup()
from django.conf import settings
from cairn.faults import fault_point
print("injector", repr(settings.CAIRN_FAULT_INJECTOR), flush=True)
for point in sys.argv[1:]:
    os.environ["CAIRN_TEST_CRASH_AT"] = point  # the test injector reads it at each call
    fault_point(point)
print("survived every fault point", flush=True)
"""


def _call_every_fault_point(settings_module: str, marker: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": settings_module,
        "CAIRN_TEST_CRASH_MARKER": str(marker),
        "CAIRN_RETENTION_TEST_PAUSE": "600",
        # An attempt to switch the seam on from the environment: production must ignore it.
        "CAIRN_FAULT_INJECTOR": "tests.faults.inject",
    }
    return subprocess.run(
        [sys.executable, "-c", CALL_EVERY_FAULT_POINT, *sorted(fault_points_in_code(REPO))],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_production_settings_leave_every_fault_point_inert(tmp_path: Path):
    """cairn.settings in a real process, with every test hook variable set: no injector, and
    every fault point of the code passes without a crash, a pause or a marker."""
    marker = tmp_path / "crashed"
    result = _call_every_fault_point("cairn.settings", marker)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "injector None" in result.stdout
    assert "survived every fault point" in result.stdout
    assert not marker.exists()


def test_the_test_settings_arm_the_same_fault_points(tmp_path: Path):
    """The control: the same process under tests.settings is SIGKILLed at the first point,
    so the test above would see an armed seam."""
    marker = tmp_path / "crashed"
    result = _call_every_fault_point("tests.settings", marker)
    assert result.returncode == -9, result.stdout + result.stderr
    assert "injector 'tests.faults.inject'" in result.stdout
    assert marker.read_text() == min(fault_points_in_code(REPO))
