"""A SQLite database named by a sqlite:// DATABASE_URL is run like the embedded default.

Both tests run the real settings in subprocesses, because the settings module reads the
environment once; the HTTP test serves a fresh database with gunicorn (several processes and
threads, so the writers really are concurrent) and fires twenty commits at one parent.
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from pathlib import Path

from tests.scaleout_support import (
    free_port,
    gunicorn,
    json_request,
    manage,
    process,
    python,
    wait_http,
)

WRITERS = 20

SEED = """
import json
from runtime.services.runs import run_create
from checkpoints.services.workflows import workflow_register
from tenants.services import Actor, member_set_role, token_issue
from tests.factories import SIMPLE_DEFINITION, TenantFactory, UserFactory
acme = TenantFactory(slug="acme")
bob = UserFactory(username="bob")
member_set_role(tenant=acme, user=bob, role="operator", actor=Actor.system("test"))
workflow_register(tenant=acme, workflow_type="research", version="1", definition=SIMPLE_DEFINITION)
run = run_create(tenant=acme, workflow_type="research", inputs={"question": "why?"},
                 execution="external", actor=Actor(user=bob))
_, secret = token_issue(tenant=acme, user=bob, actor=Actor.system("test"))
print(json.dumps({"run": str(run.id), "token": secret}))
"""


def sqlite_url_env(tmp_path: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "cairn.settings",
        "CAIRN_HOME": str(tmp_path / "home"),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'url.sqlite3'}",
    }
    env.pop("CAIRN_SQLITE_PATH", None)
    return env


def test_a_sqlite_url_gets_the_embedded_defaults_options(tmp_path):
    out = python(
        "from django.conf import settings; from django.db import connection\n"
        "import json\n"
        "with connection.cursor() as c:\n"
        "    c.execute('PRAGMA journal_mode'); mode = c.fetchone()[0]\n"
        "    c.execute('PRAGMA busy_timeout'); busy = c.fetchone()[0]\n"
        "print(json.dumps({'options': settings.DATABASES['default']['OPTIONS'],"
        " 'mode': mode, 'busy': busy}))",
        env=sqlite_url_env(tmp_path),
    )
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["options"]["transaction_mode"] == "IMMEDIATE"
    assert seen["mode"] == "wal"
    assert seen["busy"] == 30000


def test_twenty_concurrent_http_commits_over_a_sqlite_url_answer_one_201_and_nineteen_409(
    tmp_path,
):
    env = sqlite_url_env(tmp_path)
    manage("migrate", "--noinput", env=env)
    seeded = json.loads(python(SEED, env=env).strip().splitlines()[-1])
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with process(gunicorn(port, workers=4, threads=5), env=env, log=tmp_path / "web.log"):
        wait_http(f"{base}/api/v1/runs")
        barrier = threading.Barrier(WRITERS)
        outcomes: list = [None] * WRITERS
        body = {"expected_version": 1, "state": "draft_answer", "step": "draft", "envelope": {}}

        def writer(index: int) -> None:
            barrier.wait(timeout=30)
            status, answer = json_request(
                f"{base}/api/v1/runs/{seeded['run']}/checkpoints", token=seeded["token"], body=body
            )
            outcomes[index] = (status, answer.get("code", "") if status != 201 else "")

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert Counter(outcomes) == {
            (201, ""): 1,
            (409, "concurrent_checkpoint_write"): WRITERS - 1,
        }, outcomes
        status, checkpoints = json_request(
            f"{base}/api/v1/runs/{seeded['run']}/checkpoints", token=seeded["token"]
        )
    assert status == 200
    assert sorted(c["sequence"] for c in checkpoints["results"]) == [1, 2]
