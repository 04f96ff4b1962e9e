"""Backup and restore, as docs/deployment.md ("Backup and restore") says to do it: a
``pg_dump`` taken while work is in flight, ``pg_restore`` into a fresh database, a fresh
broker (a queue nothing was ever sent to), then the web process, workers and beat started
on the restored database. Every run resumes by itself:

- an approved run whose command was in the old broker (gone with it);
- a run whose worker had made the publish call, and was killed before recording it (the
  provider has the publication, the backup does not): reconciled, never published again;
- a run in the middle of a step, leased by a worker that no longer exists.

Each ends with exactly one publication, and every chain verifies on the restored database.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import psycopg
import pytest
from django.db import connection

import tests.runtime_workflows  # noqa: F401 - declares research_gated in this process too
from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints.models import Run
from runtime.services.runs import run_create
from tenants.services import Actor, token_issue
from tests.approvals_support import decide, start_demo
from tests.faults import CRASH_AT, CRASH_MARKER
from tests.scaleout_support import json_request, process, python
from tests.web_server import web_server  # noqa: F401
from tests.worker_fixtures import WORKER_LEASE_SECONDS, database_env, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

RUN = Run._meta.db_table
APPROVAL = ApprovalRequest._meta.db_table


def pending(run: Run) -> ApprovalRequest:
    return wait_for(
        lambda: ApprovalRequest.objects.filter(run=run, status=ApprovalStatus.PENDING).first(),
        what=f"run {run.pk} to ask for approval",
        timeout=180,
    )


@pytest.fixture
def restored_database(postgres_only) -> Iterator[str]:  # noqa: ANN001
    """The name of a fresh database on the test server, dropped at the end."""
    name = f"cairn_restore_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    url = database_env()["DATABASE_URL"]
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                [name],
            )
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def dump_and_restore(into: str, tmp_path) -> str:  # noqa: ANN001
    """pg_dump of the test database (custom format), pg_restore into ``into``; the
    restored database's URL."""
    source = database_env()["DATABASE_URL"]
    parts = urlsplit(source)
    dump = tmp_path / "cairn.dump"
    subprocess.run(["pg_dump", "--format=custom", f"--file={dump}", source], check=True)
    target = f"{parts.scheme}://{parts.netloc}/{into}"
    subprocess.run(["pg_restore", "--no-owner", f"--dbname={target}", str(dump)], check=True)
    return target


def flush_the_broker() -> None:
    from cairn.celery import app

    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge(app.conf.task_default_queue)


def statuses(url: str) -> dict[str, str]:
    with psycopg.connect(url) as conn:
        return {str(pk): status for pk, status in conn.execute(f"SELECT id, status FROM {RUN}")}


VERIFY = """
import json
from checkpoints.models import Run
from checkpoints.services.integrity import run_verify
print(json.dumps({str(r.pk): run_verify(tenant=r.tenant, run_id=r.pk)["problems"]
                  for r in Run.objects.select_related("tenant")}))
"""


def test_after_a_restore_into_a_fresh_database_with_a_fresh_broker_every_run_resumes(
    acme,
    bob,
    carol,
    broker,
    worker_factory,
    web_server,  # noqa: F811
    publishing_service,
    restored_database,
    settings,
    tmp_path,
):
    # Before the backup: two demo runs at their approval, carried there by a worker.
    first = worker_factory("w1")
    approved, published = start_demo(acme, bob), start_demo(acme, bob)
    for run in (approved, published):
        pending(run)
        # The approval is asked inside the step; the worker lets the lease go just after.
        # Killed before that, it would leave a live lease the doomed worker backs off from.
        wait_for(
            lambda run=run: Run.objects.filter(pk=run.pk, lease_owner="").exists(),
            what=f"run {run.pk}'s lease to be let go",
        )
    first.kill()
    # The publish call is made, and its worker killed before it records the answer.
    marker = tmp_path / "crashed"
    doomed = worker_factory("doomed", env={CRASH_AT: "effect.accepted", CRASH_MARKER: str(marker)})
    decide(pending(published), carol)
    wait_for(lambda: marker.exists() and not doomed.alive, what="the publish call, then the kill")
    flush_the_broker()  # its redelivery too: the backup is to find it unrecorded
    # A run in the middle of a step, its worker alive and holding the lease at the backup.
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "extract_claims.hold").write_text("hold")
    busy = worker_factory("busy")
    leased = run_create(
        tenant=acme,
        workflow_type="research_gated",
        inputs={"question": "q", "gate_dir": str(gate)},
        budget={"max_attempts": 20},
        actor=Actor(user=bob),
    )
    wait_for((gate / "extract_claims.entered").exists, what="the step to be entered")
    # Approved while the one worker is busy: its command sits in the broker the backup loses.
    decide(pending(approved), carol)
    _, token = token_issue(tenant=acme, user=carol, actor=Actor.system("test"))
    assert publishing_service.stats()["publications"] == 1  # made before the backup, unrecorded

    restored = dump_and_restore(restored_database, tmp_path)
    busy.kill()  # nothing of the old world goes on: its workers, its broker's queue
    (gate / "extract_claims.hold").unlink()
    connection.close()

    # The restored world: a fresh broker queue, the web process, a worker and the beat.
    fresh = {"DATABASE_URL": restored, "CAIRN_TASK_QUEUE": f"cairn-restored-{uuid.uuid4().hex}"}
    server = web_server(env=fresh)
    worker_factory("after", env=fresh)
    beat = [sys.executable, "-m", "celery", "-A", "cairn", "beat", "--loglevel", "INFO"]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "CAIRN_MEDIA_ROOT": str(settings.MEDIA_ROOT),  # the artifacts are not in the dump
        **broker.env,
    }
    env.update({**database_env(), **fresh, "CAIRN_LEASE_SECONDS": str(WORKER_LEASE_SECONDS)})
    runs = {str(approved.pk), str(published.pk), str(leased.pk)}
    try:
        with process([*beat, "-s", str(tmp_path / "beat")], env=env, log=tmp_path / "beat.log"):
            request = wait_for(
                lambda: _pending_in(restored, leased.pk),
                what="the leased run to go on and ask for approval",
                timeout=180,
            )
            status, body = json_request(
                f"{server.url}/api/v1/approvals/{request[0]}/decision",
                token=token,
                body={"decision": "approve", "artifact_sha256": request[1]},
            )
            assert status == 200, body
            wait_for(
                lambda: (
                    {k: v for k, v in statuses(restored).items() if k in runs}
                    == dict.fromkeys(runs, "succeeded")
                ),
                what="every run to succeed on the restored database",
                timeout=180,
            )
    finally:
        _delete_queue(fresh["CAIRN_TASK_QUEUE"])
    stats = publishing_service.stats()
    assert stats["publications"] == 3
    assert {target: stats["by_target"][target] for target in stats["by_target"]} == {
        f"research/{pk}": 1 for pk in runs
    }
    verified = json.loads(python(VERIFY, env={**env, **fresh}).strip().splitlines()[-1])
    assert {pk: verified[pk] for pk in runs} == dict.fromkeys(runs, [])


def _pending_in(url: str, run_id) -> tuple[str, str] | None:  # noqa: ANN001
    with psycopg.connect(url) as conn:
        return conn.execute(
            f"SELECT id::text, artifact_sha256 FROM {APPROVAL} WHERE run_id = %s "
            "AND status = 'pending'",
            [run_id],
        ).fetchone()


def _delete_queue(name: str) -> None:
    from cairn.celery import app

    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete(name)
