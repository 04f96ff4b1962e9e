"""Nothing in the console is left unreachable: every view function is routed by a URL, and
every template filter it registers is used by a template."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

from django.conf import settings
from django.urls import URLPattern, URLResolver, get_resolver

import console.views
from console.templatetags import console as console_tags


def _routed(patterns) -> set:  # noqa: ANN001
    found = set()
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            found |= _routed(pattern.url_patterns)
        elif isinstance(pattern, URLPattern):
            found.add(pattern.callback)
    return found


def _view_functions() -> dict[str, object]:
    modules = [importlib.import_module("console.actions")] + [
        importlib.import_module(f"console.views.{info.name}")
        for info in pkgutil.iter_modules(console.views.__path__)
    ]
    views = {}
    for module in modules:
        for name, value in vars(module).items():
            if name.startswith("_") or not inspect.isfunction(value):
                continue
            if value.__module__ != module.__name__:
                continue  # imported, not defined here
            params = list(inspect.signature(inspect.unwrap(value)).parameters)
            if params[:1] == ["request"]:
                views[f"{module.__name__}.{name}"] = value
    return views


def test_every_console_view_is_routed_by_a_url():
    routed = _routed(get_resolver().url_patterns)
    views = _view_functions()
    assert "console.views.runs.runs" in views  # the scan finds views at all
    assert sorted(name for name, view in views.items() if view not in routed) == []


def test_every_console_template_filter_is_used_by_a_template():
    folders = [Path(d) for d in settings.TEMPLATES[0]["DIRS"]]
    folders += [Path(settings.BASE_DIR) / app / "templates" for app in ("console", "retention")]
    text = "\n".join(
        path.read_text() for folder in folders if folder.exists() for path in folder.rglob("*.html")
    )
    filters = set(console_tags.register.filters)
    assert "short_id" in filters
    assert sorted(f for f in filters if not re.search(rf"\|\s*{f}\b", text)) == []
