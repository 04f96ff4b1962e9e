"""Hardening: CSRF on every state-changing request (forms and htmx), a CSP that allows only
the app's own scripts, JSON-only deserialization, request size limits, secure production
settings, and no stack traces to clients."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.http import HttpRequest
from django.test import Client
from django.urls import path
from rest_framework.views import APIView

from api.parsers import LimitedJSONParser
from api.views import RawBytesParser
from cairn.celery import app as celery_app
from cairn.urls import handler404, handler500  # noqa: F401 - the test URLconf's handlers
from cairn.urls import urlpatterns as project_urlpatterns
from tenants import roles
from tenants.services import permissions_of
from tests.security_support import WRITE_METHODS, served_methods, walk

ROOT = Path(__file__).resolve().parents[1]
PROJECT_PACKAGES = ("cairn", "checkpoints", "approvals", "console", "tenants", "retention")
SECRET_MESSAGE = "db password is hunter2 at /srv/cairn/settings.py line 42"


# --- a URLconf with views that fail, for the no-stack-trace tests --------------------------
def _boom_page(request: HttpRequest):  # noqa: ANN202
    raise RuntimeError(SECRET_MESSAGE)


class _BoomAPI(APIView):
    authentication_classes: list = []
    permission_classes: list = []

    def get(self, request):  # noqa: ANN001, ANN201
        raise RuntimeError(SECRET_MESSAGE)


urlpatterns = [
    path("boom/", _boom_page),
    path("api/v1/boom", _BoomAPI.as_view()),
    path("api/v1/boom-plain", _boom_page),
    *project_urlpatterns,
]


def web_as(user, *, csrf: bool = False) -> Client:  # noqa: ANN001
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


# --- CSRF --------------------------------------------------------------------------------
def test_every_state_changing_request_with_a_session_needs_the_csrf_token(alice, run):  # noqa: ANN001
    """Walks every URL: a signed-in POST/PUT/PATCH/DELETE without the token is 403."""
    client = web_as(alice, csrf=True)
    problems, checked = [], 0
    for route in walk():
        if route.name.startswith("admin:") or route.name == "metrics":
            continue
        kwargs = {p: _sample(p, run) for p in route.params}
        from django.urls import reverse

        url = reverse(route.name, kwargs=kwargs)
        for method in served_methods(route.callback):
            if method not in WRITE_METHODS:
                continue
            response = getattr(client, method.lower())(url)
            checked += 1
            if response.status_code != 403:
                problems.append((route.name, method, response.status_code))
    assert checked > 25
    assert not problems, f"accepted without a CSRF token: {problems}"


def _sample(param: str, run) -> object:  # noqa: ANN001
    return {
        "run_id": run.pk,
        "sequence": 1,
        "user_id": 1,
        "uidb64": "MQ",
        "token": "x",
        "action": "cancel",
        "key": "k",
        "workflow_type": "research",
        "version": "1",
    }.get(param, "6f1c1a52-8a4b-4e43-9d5a-6d1c3c6c8d11")


def test_htmx_requests_carry_the_token_from_the_page(alice, bob):  # noqa: ANN001
    client = web_as(alice, csrf=True)
    page = client.get("/members/").content.decode()
    token = re.search(r"hx-headers='\{\"X-CSRFToken\": \"([^\"]+)\"\}'", page).group(1)
    response = client.post(
        f"/members/{bob.pk}/role",
        {"role": "reviewer"},
        HTTP_HX_REQUEST="true",
        HTTP_X_CSRFTOKEN=token,
    )
    assert response.status_code == 200
    assert b"bob is now reviewer." in response.content


def _templates() -> list[Path]:
    dirs = [ROOT / "templates", *ROOT.glob("*/templates")]
    return sorted(p for d in dirs for p in d.rglob("*.html"))


def test_every_post_form_in_every_template_has_a_csrf_token():
    missing = []
    for template in _templates():
        for form in re.findall(r"<form\b[^>]*>.*?</form>", template.read_text(), re.S | re.I):
            opening = form.split(">", 1)[0].lower()
            if 'method="post"' in opening and not re.search(
                r"{% csrf_token %}|csrfmiddlewaretoken", form
            ):
                missing.append(str(template.relative_to(ROOT)))
    assert len(_templates()) > 10
    assert not missing, f"POST forms without a CSRF token: {missing}"


# --- Content-Security-Policy --------------------------------------------------------------
def test_no_template_has_inline_script_event_handlers_or_inline_styles():
    offending = []
    patterns = {
        "inline script": r"<script(?![^>]*\bsrc=)[^>]*>",
        "external script": r"<script[^>]*\bsrc=\"(https?:)?//",
        "event handler": r"<[a-z][^>]*\son[a-z]+\s*=",
        "javascript: URL": r"javascript:",
        "inline style": r"<[a-z][^>]*\sstyle\s*=|<style",
        "htmx eval": r"hx-on|hx-vars|js:",
    }
    for template in _templates():
        text = re.sub(
            r"{#.*?#}|{% comment %}.*?{% endcomment %}", "", template.read_text(), flags=re.S
        )
        for what, pattern in patterns.items():
            if re.search(pattern, text, re.I):
                offending.append((str(template.relative_to(ROOT)), what))
    assert not offending, offending


@pytest.mark.parametrize(
    "url", ["/login/", "/runs/", "/members/", "/no-such-page/", "/api/v1/runs"]
)
def test_every_response_carries_a_policy_allowing_only_the_apps_own_scripts(alice, url):  # noqa: ANN001
    policy = web_as(alice).get(url)["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["script-src"] == "'self'"
    assert directives["default-src"] == "'self'"
    assert directives["object-src"] == "'none'"
    assert directives["frame-ancestors"] == "'none'"
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy


def test_htmx_is_configured_not_to_evaluate_or_inject_styles(alice):  # noqa: ANN001
    html = web_as(alice).get("/members/").content.decode()
    config = json.loads(re.search(r"<meta name=\"htmx-config\" content='([^']+)'>", html).group(1))
    assert config["allowEval"] is False
    assert config["includeIndicatorStyles"] is False
    # Settling would copy a style attribute across a swap, i.e. set an inline style.
    assert "style" not in config["attributesToSettle"]
    assert re.search(r'<script src="/static/[^"]*htmx[^"]*\.js"', html)


# --- JSON only ------------------------------------------------------------------------------
def test_celery_and_sessions_deserialize_json_only():
    assert celery_app.conf.accept_content == ["json"]
    assert celery_app.conf.task_serializer == "json"
    assert celery_app.conf.result_serializer == "json"
    assert celery_app.conf.result_accept_content in (None, ["json"])
    assert django_settings.SESSION_SERIALIZER.endswith("JSONSerializer")


def test_every_api_view_parses_json_or_raw_bytes_only():
    allowed = {LimitedJSONParser, RawBytesParser}
    problems = []
    for route in walk():
        view_class = getattr(route.callback, "cls", None)
        if view_class is None:
            continue
        parsers = set(view_class.parser_classes)
        if not parsers <= allowed:
            problems.append((route.name, parsers - allowed))
    assert not problems, problems


def test_a_form_encoded_api_body_is_refused_not_parsed(api_as, bob, acme, workflow):  # noqa: ANN001
    response = api_as(bob, acme).post(
        "/api/v1/runs", "workflow_type=research", content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 415
    assert response.json()["code"] == "unsupported_media_type"


def test_no_project_module_uses_an_unsafe_deserializer_or_eval():
    unsafe = re.compile(
        r"^\s*(import|from)\s+(pickle|cPickle|marshal|shelve|dill|jsonpickle)\b"
        r"|\bpickle\.loads?\(|\byaml\.(unsafe_)?load\((?![^)]*SafeLoader)"
        r"|(?<![\w.])eval\(|(?<![\w.])exec\(",
        re.M,
    )
    offending = []
    for package in PROJECT_PACKAGES:
        for module in (ROOT / package).rglob("*.py"):
            if unsafe.search(module.read_text()):
                offending.append(str(module.relative_to(ROOT)))
    assert not offending, offending


# --- request size limits ----------------------------------------------------------------------
def test_an_oversized_api_body_is_413_before_it_is_read(api_as, bob, acme, settings):  # noqa: ANN001
    settings.CAIRN_MAX_REQUEST_BYTES = 1000
    body = json.dumps({"workflow_type": "research", "inputs": {"x": "a" * 2000}})
    response = api_as(bob, acme).post("/api/v1/runs", body, content_type="application/json")
    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"


def test_an_oversized_artifact_is_413(api_as, bob, acme, settings):  # noqa: ANN001
    settings.CAIRN_MAX_ARTIFACT_BYTES = 100
    response = api_as(bob, acme).post("/api/v1/artifacts", b"x" * 101, content_type="text/plain")
    assert response.status_code == 413


def test_an_oversized_or_overfull_console_form_is_refused(alice, bob, acme, settings):  # noqa: ANN001
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2000
    client = web_as(alice)
    url = f"/members/{bob.pk}/role"
    assert client.post(url, {"role": "reviewer", "padding": "x" * 5000}).status_code == 400
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10**6
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 50
    fields = {"role": "reviewer", **{f"f{i}": "1" for i in range(60)}}
    assert client.post(url, fields).status_code == 400
    assert permissions_of(user=bob, tenant=acme) == {roles.OPERATE}
    # The same change within the limits goes through.
    assert client.post(url, {"role": "reviewer"}).status_code == 302


# --- no stack traces ---------------------------------------------------------------------------
@pytest.mark.urls("tests.test_security_hardening")
@pytest.mark.parametrize("url", ["/api/v1/boom", "/api/v1/boom-plain"])
def test_an_api_failure_answers_a_json_sentence_without_internals(db, url):  # noqa: ANN001
    response = Client(raise_request_exception=False).get(url)
    assert response.status_code == 500
    assert response.json() == {
        "code": "server_error",
        "detail": "Something went wrong on our side; nothing was changed.",
    }
    assert b"hunter2" not in response.content and b"Traceback" not in response.content


@pytest.mark.urls("tests.test_security_hardening")
def test_a_page_failure_shows_a_page_that_names_nothing_internal(db):  # noqa: ANN001
    response = Client(raise_request_exception=False).get("/boom/")
    assert response.status_code == 500
    assert b"Something went wrong" in response.content
    for leak in (b"hunter2", b"Traceback", b"RuntimeError", b"settings.py"):
        assert leak not in response.content


def test_an_unknown_api_address_answers_in_the_apis_error_shape(db):  # noqa: ANN001
    response = Client().get("/api/v1/no-such-thing")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"
    assert Client().get("/no-such-page/").status_code == 404


# --- production settings -----------------------------------------------------------------------
def test_production_settings_are_secure(tmp_path):  # noqa: ANN001
    names = [
        "DEBUG",
        "SESSION_COOKIE_SECURE",
        "CSRF_COOKIE_SECURE",
        "SESSION_COOKIE_HTTPONLY",
        "SECURE_SSL_REDIRECT",
        "SECURE_HSTS_SECONDS",
        "SECURE_HSTS_INCLUDE_SUBDOMAINS",
        "SECURE_CONTENT_TYPE_NOSNIFF",
        "X_FRAME_OPTIONS",
        "SESSION_COOKIE_SAMESITE",
        "CSRF_COOKIE_SAMESITE",
    ]
    code = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        f"print(json.dumps({{n: getattr(s, n) for n in {names!r}}}))"
    )
    env = {
        **os.environ,
        "CAIRN_ENV": "production",
        "DJANGO_SETTINGS_MODULE": "cairn.settings",
        "CAIRN_HOME": str(tmp_path),
        "DJANGO_SECRET_KEY": os.urandom(40).hex(),
    }
    env.pop("DJANGO_DEBUG", None)
    env.pop("DATABASE_URL", None)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    values = json.loads(result.stdout.strip().splitlines()[-1])
    assert values["DEBUG"] is False
    assert values["SESSION_COOKIE_SECURE"] is values["CSRF_COOKIE_SECURE"] is True
    assert values["SESSION_COOKIE_HTTPONLY"] is True
    assert values["SECURE_SSL_REDIRECT"] is True
    assert values["SECURE_HSTS_SECONDS"] >= 31536000
    assert values["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is True
    assert values["SECURE_CONTENT_TYPE_NOSNIFF"] is True
    assert values["X_FRAME_OPTIONS"] == "DENY"
    assert values["SESSION_COOKIE_SAMESITE"] in ("Lax", "Strict")
