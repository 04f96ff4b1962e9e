"""A NUL character anywhere a request carries text (a path segment, the query string, a
JSON body at any depth, a console form field) is a 400 naming the NUL, on SQLite and
PostgreSQL alike, and writes nothing. PostgreSQL cannot hold NUL in a text or jsonb column:
each of these once reached the database there as a 500.

Nothing here is a hand-written list of addresses: the routes come from the URL resolver,
the bodies from the API's OpenAPI document, the forms from the console's own pages."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from urllib.parse import quote, urlsplit

import pytest
from django.urls import reverse

from checkpoints.models import Checkpoint, ExternalOperation, Run
from console.action_specs import ACTIONS
from retention.models import RetentionPolicy
from tenants.models import AuditEvent
from tests.acme_rows_support import api_client, web_client
from tests.security_support import served_methods, walk

pytestmark = pytest.mark.django_db

NUL = "a\x00b"
# Audit events that opening a page writes (decrypting reads, exports), not a form's effect.
READS = ("checkpoint.read", "artifact.read", "operation.read", "audit.exported", "evidence.export")


def nul_refused(response, what: str) -> str | None:  # noqa: ANN001
    """None when ``response`` is the 400 naming the NUL; else what is wrong with it."""
    body = response.content.decode(errors="replace")
    if response.status_code != 400 or "NUL" not in body:
        return f"{what}: {response.status_code} {body[:160]!r}"
    if what.startswith("/api/") and json.loads(body)["code"] != "invalid_request":
        return f"{what}: {body[:160]!r}"
    return None


def footprint(acme) -> tuple:  # noqa: ANN001
    """Everything a request of these tests could have written."""
    return (
        AuditEvent.objects.exclude(action__in=READS).count(),
        Run.objects.count(),
        Checkpoint.objects.count(),
        ExternalOperation.objects.count(),
        RetentionPolicy.objects.count(),
        tuple(Run.objects.order_by("pk").values_list("version", "legal_hold")),
    )


def assert_all_refused(problems: list[str | None], *, more_than: int, acme, before: tuple) -> None:  # noqa: ANN001
    """More than ``more_than`` requests were sent (``problems`` has one entry a request), each
    was refused as ``nul_refused`` wants, and none of them wrote anything."""
    assert len(problems) > more_than, len(problems)
    wrong = [p for p in problems if p]
    assert not wrong, wrong
    assert footprint(acme) == before


def clients(alice, acme):  # noqa: ANN001
    return api_client(alice, acme), web_client(alice)


def path_variants(route, values: dict) -> list[str]:  # noqa: ANN001
    """The route's real path with a NUL put in: each ``str`` segment holding one, and a
    NUL ending the path (for a route of ids only, where a converter would refuse it)."""
    if any(p not in values for p in route.params):  # Django's admin: regular expressions
        literal = re.split(r"[<(]", route.route)[0].lstrip("^")
        return [f"/{literal}a%00b/"]
    variants = []
    for param in route.params:
        if re.search(rf"<(str:)?{param}>", route.route):
            kwargs = {p: (NUL if p == param else values[p]) for p in route.params}
            variants.append(reverse(route.name, kwargs=kwargs))
    real = reverse(route.name, kwargs={p: values[p] for p in route.params})
    variants.append(real[:-1] + "%00/" if real.endswith("/") else real + "%00")
    return variants


def test_a_nul_in_any_path_segment_of_any_route_is_a_400(acme_rows, acme, alice):  # noqa: ANN001, F811
    api, web = clients(alice, acme)
    before = footprint(acme)
    problems = []
    for route in walk():
        for url in path_variants(route, acme_rows.values):
            for method in served_methods(route.callback):
                client = api if route.is_api else web
                call = getattr(client, method.lower())
                response = (
                    call(url, "{}", content_type="application/json")
                    if method in ("PUT", "PATCH")
                    else call(url)
                )
                problems.append(nul_refused(response, f"{method} {url}"))
    assert_all_refused(problems, more_than=100, acme=acme, before=before)


def _resolve(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def _nul_value(schema: dict, node: dict) -> object:
    node = _resolve(schema, node)
    kind = node.get("type")
    if kind == "object" or "properties" in node:
        return {"k\x00": "v", "k": NUL}
    if kind == "array":
        return [NUL]
    return NUL


def json_operations(schema: dict):  # noqa: ANN201
    """(path template, method, body schema) of every operation that takes a JSON body."""
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            content = (operation.get("requestBody") or {}).get("content", {})
            if "application/json" in content:
                yield path, method.upper(), _resolve(schema, content["application/json"]["schema"])


def test_a_nul_in_any_field_of_any_json_body_is_a_400(acme_rows, acme, alice):  # noqa: ANN001, F811
    api, _ = clients(alice, acme)
    schema = api.get("/api/v1/schema", {"format": "json"}).json()
    before = footprint(acme)
    problems = []
    for template, method, body_schema in json_operations(schema):
        url = re.sub(
            r"\{(\w+)\}", lambda m: quote(str(acme_rows.values[m.group(1)]), safe=""), template
        )
        fields = body_schema.get("properties") or {"body": {}}
        bodies = [{name: _nul_value(schema, node)} for name, node in fields.items()]
        bodies += [{"nested": {"deeper": [{"x\x00": 1}]}}, [NUL]]
        for body in bodies:
            response = getattr(api, method.lower())(
                url, json.dumps(body), content_type="application/json"
            )
            problems.append(nul_refused(response, f"{method} {url} {body!r}"))
    assert_all_refused(problems, more_than=40, acme=acme, before=before)


class Forms(HTMLParser):
    """The forms of a page: action, method and the fields with their current values."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[dict] = []
        self._select: str | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "form":
            self.forms.append(
                {
                    "action": a.get("action") or a.get("hx-post") or a.get("hx-get") or "",
                    "method": "post" if "hx-post" in a else (a.get("method") or "get").lower(),
                    "fields": {},
                }
            )
        elif not self.forms or not a.get("name"):
            return
        elif tag == "input":
            if a.get("type") in ("checkbox", "radio") and "checked" not in a:
                self.forms[-1]["fields"].setdefault(a["name"], "")
            else:
                self.forms[-1]["fields"][a["name"]] = a.get("value") or ""
        elif tag == "textarea":
            self.forms[-1]["fields"][a["name"]] = ""
        elif tag == "select":
            self._select = a["name"]
            self.forms[-1]["fields"][a["name"]] = ""
        elif tag == "option" and self._select and not self.forms[-1]["fields"][self._select]:
            self.forms[-1]["fields"][self._select] = a.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None


def console_pages(values: dict) -> list[str]:
    """Every console page that answers GET, with real rows, and each action's form."""
    pages = []
    for route in walk():
        if route.is_api or route.name.startswith("admin:") or route.name == "metrics":
            continue
        if "GET" not in served_methods(route.callback) or "uidb64" in route.params:
            continue
        if route.name == "console:run_action":
            pages += [
                reverse(route.name, kwargs={"run_id": values["run_id"], "action": action})
                for action in ACTIONS
            ]
            continue
        pages.append(reverse(route.name, kwargs={p: values[p] for p in route.params}))
    return pages


def test_a_nul_in_any_field_of_any_console_form_is_a_400(acme_rows, acme, alice):  # noqa: ANN001, F811
    _, web = clients(alice, acme)
    before = footprint(acme)
    problems, forms_seen = [], set()
    for page in console_pages(acme_rows.values):
        response = web.get(page)
        if response.status_code != 200 or "html" not in response.get("Content-Type", ""):
            continue
        parser = Forms()
        parser.feed(response.content.decode())
        for form in parser.forms:
            action = form["action"] or page
            fields = {k: v for k, v in form["fields"].items() if k != "csrfmiddlewaretoken"}
            if not urlsplit(action).path or (action, form["method"]) in forms_seen:
                continue
            forms_seen.add((action, form["method"]))
            for name in fields:
                data = {**fields, name: NUL}
                response = getattr(web, form["method"])(action, data)
                problems.append(nul_refused(response, f"{form['method']} {action} {name}"))
    # The members, retention, audit, runs, run action and outcome forms at least.
    assert len(forms_seen) >= 10, forms_seen
    assert_all_refused(problems, more_than=30, acme=acme, before=before)


def test_a_nul_in_a_console_post_body_is_a_400_on_every_console_route(acme_rows, acme, alice):  # noqa: ANN001, F811
    _, web = clients(alice, acme)
    before = footprint(acme)
    problems = []
    for route in walk():
        if route.is_api or "POST" not in served_methods(route.callback):
            continue
        if any(p not in acme_rows.values for p in route.params):
            continue  # Django's admin site, its own (staff-only) forms
        url = reverse(route.name, kwargs={p: acme_rows.values[p] for p in route.params})
        for data in ({"reason": NUL}, {"k\x00": "v"}):
            problems.append(nul_refused(web.post(url, data), f"POST {url} {data!r}"))
    assert_all_refused(problems, more_than=0, acme=acme, before=before)


def test_text_without_nul_still_reaches_the_views(acme_rows, acme, alice):  # noqa: ANN001, F811
    """The control: the same requests without the NUL are answered by the views."""
    api, web = clients(alice, acme)
    run = acme_rows.run
    assert api.get(f"/api/v1/runs/{run.pk}/operations/ab").status_code == 404
    assert web.get(f"/runs/{run.pk}/operations/ab/outcome/").status_code == 404
    put = api.put(
        "/api/v1/workflows/x/versions/1",
        {"initial": "a", "states": ["a", "b"], "transitions": [["a", "b"]], "terminal": ["b"]},
        format="json",
    )
    assert put.status_code == 201, put.content
    # A body whose text holds an escaped backslash before u0000 carries no NUL.
    escaped = api.post(
        "/api/v1/runs",
        '{"workflow_type": "research", "inputs": {"q": "\\\\u0000"}}',
        content_type="application/json",
    )
    assert escaped.status_code == 201, escaped.content
