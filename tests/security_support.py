"""Walking every URL pattern of the project, for the enumeration and CSRF tests."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from django.urls import URLPattern, URLResolver, get_resolver

WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")
METHODS = ("GET", *WRITE_METHODS)


@dataclass(frozen=True)
class Route:
    name: str  # namespaced, e.g. "api:run"
    route: str  # the pattern as written, e.g. "api/v1/runs/<uuid:run_id>"
    callback: Callable
    params: tuple[str, ...]
    defaults: dict

    @property
    def is_api(self) -> bool:
        return self.route.startswith("api/")


def _params(route: str) -> tuple[str, ...]:
    named = re.findall(r"<(?:\w+:)?(\w+)>", route)
    return tuple(named or re.findall(r"\(\?P<(\w+)>", route))


def walk(patterns: list | None = None, prefix: str = "", namespace: str = "") -> Iterator[Route]:
    """Every URL pattern of the project, resolvers followed (API, console, approvals, admin)."""
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(entry, URLResolver):
            inner = namespace
            if entry.namespace:
                inner = f"{namespace}:{entry.namespace}" if namespace else entry.namespace
            yield from walk(entry.url_patterns, prefix + str(entry.pattern), inner)
        elif isinstance(entry, URLPattern):
            route = prefix + str(entry.pattern)
            name = f"{namespace}:{entry.name}" if namespace else (entry.name or "")
            yield Route(
                name=name or f"<unnamed {route}>",
                route=route,
                callback=entry.callback,
                params=_params(route),
                defaults=dict(entry.default_args),
            )


def served_methods(callback: Callable) -> tuple[str, ...]:
    """The HTTP methods a view answers (besides HEAD/OPTIONS).

    Class-based views say so; function views decorated with require_http_methods keep the
    list in a closure; an undecorated function view is taken to answer GET and POST.
    """
    view_class = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
    if view_class is not None:
        allowed = {m.upper() for m in view_class.http_method_names}
        return tuple(m for m in METHODS if m in allowed and hasattr(view_class, m.lower()))
    function: Callable | None = callback
    while function is not None:
        for cell in function.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if (
                isinstance(value, list | tuple)
                and value
                and all(isinstance(m, str) and m in METHODS for m in value)
            ):
                return tuple(m for m in METHODS if m in value)
        function = getattr(function, "__wrapped__", None)
    return ("GET", "POST")
