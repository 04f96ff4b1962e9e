"""What a new user meets on ``make run``: Cairn's own error pages (Django's debug pages only
with DJANGO_DEBUG=1), a set-password link for a tenant owner created without a password,
and labelled columns for the demo passwords."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client

from runtime.management.commands.cairn_up import web_command
from tests.publishing import free_port
from tests.web_server import fetch_once_up

ROOT = Path(__file__).resolve().parent.parent


def serve_and_get(tmp_path: Path, *paths: str, **extra_env: str) -> list[tuple[int, str]]:
    """Start the web process as ``make run`` does (its gunicorn, the embedded defaults),
    fetch each of ``paths`` and stop it."""
    env = {**os.environ, "CAIRN_HOME": str(tmp_path), **extra_env}
    for inherited in ("DATABASE_URL", "DJANGO_DEBUG", "DJANGO_ALLOW_ASYNC_UNSAFE", "CAIRN_ENV"):
        if inherited not in extra_env:
            env.pop(inherited, None)
    env["DJANGO_SETTINGS_MODULE"] = "cairn.settings"
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    port = free_port()
    server = subprocess.Popen(
        web_command(sys.executable, f"127.0.0.1:{port}"),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        return [fetch_once_up(f"http://127.0.0.1:{port}{path}") for path in paths]
    finally:
        server.terminate()
        server.wait(timeout=20)


def test_the_embedded_default_shows_cairns_own_404_and_debug_pages_only_when_asked(tmp_path):
    (status, body), (css_status, css) = serve_and_get(
        tmp_path, "/no-such-page/", "/static/cairn/console.css"
    )
    assert status == 404
    assert "There is nothing at this address" in body
    assert "URLconf" not in body and "urlpatterns" not in body
    assert css_status == 200 and ".filters" in css  # without debug, static files still load
    [(status, body)] = serve_and_get(tmp_path, "/no-such-page/", DJANGO_DEBUG="1")
    assert status == 404 and "URLconf" in body


@pytest.mark.django_db
def test_create_tenant_prints_a_set_password_link_the_owner_can_use(django_user_model):
    out = io.StringIO()
    call_command("create_tenant", "initech", "--owner", "alice", stdout=out)
    link = out.getvalue().strip().splitlines()[-1].strip()
    assert link.startswith("http://127.0.0.1:8000/") and "set-password" in link
    path = link.removeprefix("http://127.0.0.1:8000")
    client = Client()
    form = client.get(path, follow=True)
    assert form.status_code == 200
    new = "a long new passphrase 42"
    done = client.post(
        form.redirect_chain[-1][0] if form.redirect_chain else path,
        {"new_password1": new, "new_password2": new},
    )
    assert done.status_code == 302
    assert Client().login(username="alice", password=new)
    again = io.StringIO()
    call_command("create_tenant", "initech", "--owner", "alice", stdout=again)
    assert "alice has a password" in again.getvalue()


@pytest.mark.django_db
def test_seed_demo_labels_the_columns_of_the_passwords_it_prints():
    out = io.StringIO()
    call_command("seed_demo", stdout=out)
    lines = out.getvalue().splitlines()
    header = next(i for i, line in enumerate(lines) if "sign in at" in line) + 1
    assert lines[header].split() == ["ROLE", "USERNAME", "PASSWORD"]
    rows = [line.split() for line in lines[header + 1 : header + 4]]
    assert [row[:2] for row in rows] == [
        ["admin", "admin"],
        ["reviewer", "reviewer"],
        ["operator", "operator"],
    ]
    assert all(len(row) == 3 for row in rows)
    assert Client().login(username=rows[0][1], password=rows[0][2])
