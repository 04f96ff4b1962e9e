"""A web server whose database cannot be reached answers the API and /metrics in the API's
error shape (503 ``database_unavailable``), in development mode (DEBUG on, the default) and
in production alike: never Django's debug page, which lists the settings. Real gunicorn
processes pointed at a PostgreSQL port nobody listens on and at a SQLite file that cannot
be opened."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.web_server import free_port, web_server  # noqa: F401

UNREACHABLE = {
    "postgresql": {"DATABASE_URL": f"postgres://postgres@127.0.0.1:{free_port()}/cairn"},
    "sqlite": {"DATABASE_URL": "", "CAIRN_SQLITE_PATH": "/nonexistent/cairn/db.sqlite3"},
}
MODES = {
    "development": {"CAIRN_ENV": "development", "DJANGO_DEBUG": "1"},
    "production": {"CAIRN_ENV": "production", "DJANGO_SECURE_SSL_REDIRECT": "0"},
}
REQUESTS = [
    ("GET", "/api/v1/runs", None),
    ("POST", "/api/v1/runs", {"workflow_type": "research"}),
    ("GET", "/api/v1/runs/6f1c3f5e-1d0e-4a57-9a59-2f61a3a0c001/checkpoints", None),
    ("GET", "/api/v1/approvals", None),
    ("GET", "/metrics", None),
]


def call(url: str, method: str, body: dict | None) -> tuple[int, str, str]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={
            # /metrics is read from loopback (an allowed network), without a token.
            **({} if url.endswith("/metrics") else {"Authorization": "Bearer cairn_" + "x" * 40}),
            "Content-Type": "application/json",
            # What a browser asks for: Django's debug page is HTML, then.
            "Accept": "text/html,application/xhtml+xml,*/*;q=0.8",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("database", UNREACHABLE)
def test_the_api_and_metrics_answer_503_in_their_shape_without_a_database(
    web_server,  # noqa: F811
    database,
    mode,
):  # noqa: ANN001
    server = web_server(env={**UNREACHABLE[database], **MODES[mode]}, database=False)
    for method, path, body in REQUESTS:
        status, content_type, text = call(server.url + path, method, body)
        assert status == 503, (path, status, text[:500])
        assert content_type == "application/json", (path, content_type)
        answer = json.loads(text)
        assert answer["code"] == "database_unavailable", answer
        assert "nothing was changed" in answer["detail"]
        for leak in ("Traceback", "SECRET_KEY", "DATABASES", "settings", "/nonexistent"):
            assert leak not in text, (path, leak)


@pytest.mark.django_db
def test_any_other_unhandled_api_error_is_the_api_500_with_debug_on(
    api_as, bob, acme, settings, monkeypatch
):  # noqa: ANN001
    """Not only the database: with DEBUG on, a bug in a view is the API's 500, not the page
    with the settings (the traceback goes to the log)."""
    from api import views

    def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("a bug")

    settings.DEBUG = True
    monkeypatch.setattr(views, "runs_for_tenant", broken)
    api = api_as(bob, acme)
    api.raise_request_exception = False
    response = api.get("/api/v1/runs", HTTP_ACCEPT="text/html,*/*")
    assert response.status_code == 500
    assert response.json()["code"] == "server_error"
    assert b"Traceback" not in response.content and b"SECRET_KEY" not in response.content
