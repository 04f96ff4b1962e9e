"""The documentation stays true to the code it describes, and stays inside the repository.

- every route of the OpenAPI document is a heading of docs/api.md (and no heading names a
  route the API does not have), and each route's section names its own status codes;
- every domain error's code and status is a row of docs/api.md's error table;
- the settings table of docs/deployment.md lists exactly the variables cairn/settings.py
  reads;
- no markdown file links outside the repository or cites the issue tracker, and every
  relative link, image and anchor resolves;
- the README is the short front door and embeds screenshots from docs/images/.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
import yaml

from cairn import errors

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# Directories of generated or installed files, never documentation of this repository.
NOT_OURS = {
    ".git",
    ".venv",
    "var",
    "staticfiles",
    "test-artifacts",
    "node_modules",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
}
# "issue 15", "issues 13 and 19", "issue #16": the tracker's numbers, not the repository's.
ISSUE_MENTION = re.compile(r"\b[Ii]ssues? #?\d+")
ROUTE_HEADING = re.compile(r"^### (GET|POST|PUT|PATCH|DELETE) (/\S+)$", re.M)
# Every authenticated route may answer these; api.md says so once, under "Errors" (414: the
# web server itself; 411 and 413 a route that takes a body, 415 one that takes JSON).
COMMON_CODES = {"400", "401", "403", "406", "411", "413", "414", "415", "503"}


def section(text: str, heading_at: int) -> str:
    """The text from a heading to the next heading of the same or a higher level."""
    level = len(re.match(r"#+", text[heading_at:])[0])
    rest = text[heading_at:].split("\n", 1)[1]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    return rest[: end.start()] if end else rest


# --- the HTTP API ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def openapi() -> dict:
    from django.test import Client

    response = Client().get("/api/v1/schema")
    assert response.status_code == 200
    return yaml.safe_load(response.content)


def documented_routes(text: str) -> dict[tuple[str, str], str]:
    return {(m[1], m[2]): section(text, m.start()) for m in ROUTE_HEADING.finditer(text)}


def test_every_route_of_the_openapi_document_is_documented_in_api_md(openapi):
    served = {
        (method.upper(), path)
        for path, operations in openapi["paths"].items()
        for method in operations
        if method in {"get", "post", "put", "patch", "delete"}
    }
    documented = set(documented_routes((DOCS / "api.md").read_text()))
    assert served, "the OpenAPI document lists no routes"
    undocumented = sorted(f"{m} {p}" for m, p in served - documented)
    assert not undocumented, f"routes missing from docs/api.md (### METHOD path): {undocumented}"
    stale = sorted(f"{m} {p}" for m, p in documented - served)
    assert not stale, f"docs/api.md documents routes the API does not have: {stale}"


def test_each_route_section_names_the_status_codes_the_route_answers(openapi):
    sections = documented_routes((DOCS / "api.md").read_text())
    missing = []
    for path, operations in openapi["paths"].items():
        for method, operation in operations.items():
            text = sections.get((method.upper(), path), "")
            for code in sorted(set(operation["responses"]) - COMMON_CODES):
                if not re.search(rf"\b{code}\b", text):
                    missing.append(f"{method.upper()} {path}: {code}")
    assert not missing, f"status codes a route answers but docs/api.md does not name: {missing}"


def domain_errors() -> set[tuple[int, str]]:
    found, todo = set(), [errors.CairnError]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls is not errors.CairnError and inspect.getmodule(cls) is errors:
            found.add((cls.status, cls.code))
    return found


def test_every_domain_error_is_a_row_of_the_error_table():
    text = (DOCS / "api.md").read_text()
    rows = set(re.findall(r"^\| (\d{3}) \| `([a-z_]+)` \|", text, re.M))
    table = {(int(status), code) for status, code in rows}
    wanted = domain_errors()
    assert len(wanted) > 20, "the domain errors were not found"
    missing = sorted(f"{status} {code}" for status, code in wanted - table)
    assert not missing, f"domain errors missing from docs/api.md's error table: {missing}"


# --- settings --------------------------------------------------------------------------------
def settings_read_from_the_environment() -> set[str]:
    """Every name cairn/settings.py passes to env(), env_bool(), env_int(), os.getenv() or
    os.environ (.get or [...])."""
    tree = ast.parse((ROOT / "cairn" / "settings.py").read_text())
    # The helpers themselves read os.environ by their parameter's name.
    helpers = {
        id(node)
        for function in tree.body
        if isinstance(function, ast.FunctionDef) and function.name in {"env", "env_bool", "env_int"}
        for node in ast.walk(function)
    }
    names = set()
    for node in ast.walk(tree):
        if id(node) in helpers:
            continue
        target = None
        if isinstance(node, ast.Call) and node.args:
            func = ast.unparse(node.func)
            if func in {"env", "env_bool", "env_int", "os.getenv", "os.environ.get"}:
                target = node.args[0]
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            target = node.slice
        if target is not None:
            assert isinstance(target, ast.Constant), (
                f"a setting read by a computed name: {ast.unparse(node)}"
            )
            names.add(target.value)
    return names


def settings_documented() -> set[str]:
    text = (DOCS / "deployment.md").read_text()
    heading = re.search(r"^## Settings$", text, re.M)
    assert heading, "docs/deployment.md has no '## Settings' section"
    rows = re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", section(text, heading.start()), re.M)
    assert len(rows) == len(set(rows)), "a setting is listed twice"
    return set(rows)


def test_the_settings_table_lists_exactly_the_settings_cairn_reads():
    read, documented = settings_read_from_the_environment(), settings_documented()
    assert {"DATABASE_URL", "CAIRN_HOME", "DJANGO_SECRET_KEY"} <= read, (
        "the parser found too little"
    )
    undocumented = sorted(read - documented)
    assert not undocumented, f"settings read by cairn/settings.py, not in the table: {undocumented}"
    unknown = sorted(documented - read)
    assert not unknown, f"settings in the table that cairn/settings.py never reads: {unknown}"


# --- links -----------------------------------------------------------------------------------
def markdown_files() -> list[Path]:
    return sorted(
        path
        for path in ROOT.rglob("*.md")
        if not NOT_OURS & set(path.relative_to(ROOT).parts)
        and not any(part.endswith(".egg-info") for part in path.parts)
    )


def prose(text: str) -> str:
    """The text with fenced code blocks and inline code left out (their brackets are code)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def link_targets(text: str) -> list[str]:
    body = prose(text)
    inline = re.findall(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", body)
    reference = re.findall(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", body, re.M)
    html = re.findall(r"<(?:img|a)\b[^>]*?(?:src|href)=\"([^\"]+)\"", body)
    return inline + reference + html


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+?)\s*#*$", text, re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def link_problems(path: Path, root: Path = ROOT) -> list[str]:
    problems = []
    text = path.read_text()
    where = path.relative_to(root)
    for outside in ("../shared", "/work/"):
        if outside in text:
            problems.append(f"{where}: refers to {outside!r}, outside the repository")
    # The issue tracker is not in a clone either: name the commit or the feature instead.
    for mention in sorted(set(ISSUE_MENTION.findall(prose(text)))):
        problems.append(f"{where}: refers to {mention!r} of the tracker, outside the repository")
    for target in link_targets(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        if file_part.startswith("/"):
            problems.append(f"{where}: {target} is an absolute path")
            continue
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.is_relative_to(root):
            problems.append(f"{where}: {target} leads outside the repository")
        elif not resolved.exists():
            problems.append(f"{where}: {target} does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{where}: {target} names no heading of {resolved.name}")
    return problems


def test_no_markdown_file_links_outside_the_repository_or_to_nothing():
    files = markdown_files()
    assert ROOT / "README.md" in files and DOCS / "api.md" in files
    problems = [problem for path in files for problem in link_problems(path)]
    assert not problems, "\n".join(problems)


def test_the_link_check_catches_an_escaping_a_missing_and_a_dangling_link(tmp_path):
    # The check above passes only if it can fail: a page with each kind of broken link, in
    # a repository of its own.
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (tmp_path / "outside.md").write_text("# Outside\n")
    (root / "docs" / "api.md").write_text("# API\n\n### Errors\n")
    page = root / "docs" / "probe.md"
    page.write_text(
        "[a](../../outside.md) [b](missing.md) [c](api.md#no-such-heading) "
        "![d](images/none.png) [e](/etc/passwd) see ../shared/DESIGN.md, as issue 15 said\n"
        "[ok](api.md#errors) [ok too](#probe) `[code](ignored.md)` `issue_token`\n\n# Probe\n"
    )
    problems = link_problems(page, root)
    assert len(problems) == 7, problems


def test_every_make_target_the_docs_name_exists():
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))
    named = {
        (path.relative_to(ROOT), target)
        for path in markdown_files()
        # As a command: in inline code or at the start of a line in a code block.
        for target in re.findall(r"(?:`|^)make ([a-z][a-z-]*)\b", path.read_text(), re.M)
    }
    assert {"run", "test"} <= {target for _, target in named}
    missing = sorted(f"{path}: make {target}" for path, target in named if target not in targets)
    assert not missing, f"make targets the docs name but the Makefile lacks: {missing}"


# --- the README ------------------------------------------------------------------------------
def test_the_readme_is_the_short_front_door_with_screenshots():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    images = re.findall(r"!\[[^\]]+\]\((docs/images/[^)\s]+\.png)\)", readme)
    assert len(set(images)) >= 2, f"the README embeds {images}"
    for image in images:
        data = (ROOT / image).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n"), f"{image} is not a PNG"
    # The two commands, as the Makefile and .ci/run spell them.
    assert "make run" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    for page in ("design", "api", "workflows", "console", "deployment", "security"):
        assert f"docs/{page}.md" in readme, f"the README does not link docs/{page}.md"
