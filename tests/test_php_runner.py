"""Proof in another language: the plain-PHP runner in examples/php/ drives the demo research
workflow over HTTP only (lease, artifacts, commits with its code version, the approval
awaited by long-poll, the publish operation under its idempotency key) against the server
``make run`` and production run (gunicorn with ``cairn/gunicorn.py``), is killed with
SIGKILL mid-run, is started again, and the run verifies and was published exactly once.
Needs Debian's php-cli and php-curl (``make php-deps``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import approval_decide
from checkpoints.models import Checkpoint, ExternalOperation, Run, RunStatus
from checkpoints.services.integrity import run_verify
from checkpoints.services.reads import checkpoint_envelope
from tenants.services import Actor, token_issue
from tests.web_server import web_server  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "examples" / "php" / "runner.php"


class _Approver(threading.Thread):
    """Carol, reviewing: approves every pending request of the tenant, on its bound hash."""

    def __init__(self, tenant, reviewer) -> None:  # noqa: ANN001
        super().__init__(daemon=True)
        self.tenant, self.reviewer = tenant, reviewer
        self.stop = threading.Event()
        self.approved: list[str] = []

    def run(self) -> None:
        from django.db import connection

        try:
            while not self.stop.is_set():
                for request in ApprovalRequest.objects.filter(
                    tenant=self.tenant, status=ApprovalStatus.PENDING
                ):
                    approval_decide(
                        tenant=self.tenant,
                        request_id=request.pk,
                        decision="approve",
                        artifact_sha256=request.artifact_sha256,
                        actor=Actor(user=self.reviewer),
                    )
                    self.approved.append(str(request.pk))
                time.sleep(0.3)
        finally:
            connection.close()


def _php(env: dict[str, str], state_file: Path, log: Path) -> subprocess.Popen:
    php = shutil.which("php")
    assert php, "php is not installed: run `make php-deps` (Debian's php-cli and php-curl)"
    return subprocess.Popen(
        [php, str(RUNNER), str(state_file), "Why do hikers build cairns?"],
        env=env,
        stdout=open(log, "w"),  # noqa: SIM115 - closed with the process
        stderr=subprocess.STDOUT,
    )


@pytest.mark.parametrize("crash_at", ["after_draft_answer", "waiting_approval", "published"])
def test_the_php_runner_survives_a_kill_and_publishes_exactly_once(
    crash_at: str,
    web_server,  # noqa: ANN001, F811
    publishing_service,  # noqa: ANN001
    acme,  # noqa: ANN001
    bob,  # noqa: ANN001
    carol,  # noqa: ANN001
    tmp_path: Path,
):
    _, token = token_issue(tenant=acme, user=bob, actor=Actor.system("test"))
    state_file = tmp_path / "runner.json"
    marker = tmp_path / "crashed"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        # The server make run and production run (cairn/gunicorn.py), not Django's.
        "CAIRN_URL": web_server().url,
        "CAIRN_TOKEN": token,
        "CAIRN_PUBLISHING_URL": publishing_service.url,
        "CAIRN_RUNNER_CRASH_AT": crash_at,
        "CAIRN_RUNNER_CRASH_MARKER": str(marker),
    }
    approver = _Approver(acme, carol)
    approver.start()
    try:
        first = _php(env, state_file, tmp_path / "first.log")
        first.wait(timeout=120)
        log = (tmp_path / "first.log").read_text()
        assert first.returncode == -9, log  # SIGKILL: no handler ran
        assert f"crashing at {crash_at}" in log
        run = Run.objects.get(workflow_type="research", tenant=acme)
        assert run.status != RunStatus.SUCCEEDED

        second = _php(env, state_file, tmp_path / "second.log")
        second.wait(timeout=120)
        log2 = (tmp_path / "second.log").read_text()
        assert second.returncode == 0, log + "\n---\n" + log2
        assert f"resuming run {run.pk}" in log2
    finally:
        approver.stop.set()
        approver.join(timeout=10)

    run.refresh_from_db()
    assert (run.status, run.state) == (RunStatus.SUCCEEDED, "done")
    assert run_verify(tenant=acme, run_id=run.pk)["ok"]
    assert len(approver.approved) == 1
    # The runner's commit past the approval state consumed the approval (issue 15, item 1).
    assert ApprovalRequest.objects.get(run=run).status == ApprovalStatus.CONSUMED
    # Published exactly once, under the runner's idempotency key.
    key = f"php.{run.pk}.publish.1"
    stats = publishing_service.stats()
    assert stats["publications"] == 1
    assert stats["by_key"] == {key: 1}
    operation = ExternalOperation.objects.get(run=run)
    assert (operation.idempotency_key, operation.status) == (key, "confirmed")
    assert operation.provider_operation_id == stats["ids"][key]
    # Every commit the runner made says which code wrote it.
    written = [
        checkpoint_envelope(c)["compatibility"]["workflow_code_version"]
        for c in Checkpoint.objects.filter(run=run, sequence__gt=1)
    ]
    assert written and set(written) == {"php-runner-1"}
    assert list(
        Checkpoint.objects.filter(run=run).exclude(step="").values_list("step", flat=True)
    ) == [
        "collect_sources",
        "extract_claims",
        "draft_answer",
        "validate_citations",
        "request_approval",
        "publish",
    ]
