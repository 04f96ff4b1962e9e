"""Building run histories for the retention tests, and running the job in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from checkpoints.models import ArtifactKind, Checkpoint, Run, RunStatus
from checkpoints.services.artifacts import artifact_store
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from runtime.services.runs import run_create
from tenants.services import Actor
from tests.faults import RETENTION_PAUSE

ROOT = Path(__file__).resolve().parent.parent
# Statuses a commit can set; cancelling and cancelled belong to operator actions.
COMMITTED = {
    RunStatus.RUNNING,
    RunStatus.WAITING_APPROVAL,
    RunStatus.WAITING_RETRY,
    RunStatus.RECONCILING,
    RunStatus.PAUSED_FOR_REVIEW,
    RunStatus.FAILED,
    RunStatus.SUCCEEDED,
}


@dataclass
class History:
    run: Run
    length: int
    evidence: set[int] = field(default_factory=set)
    artifacts: dict[str, Any] = field(default_factory=dict)

    @property
    def kept_when_compacted(self) -> set[int]:
        """Sequences compaction must keep: genesis (evidence), evidence, final."""
        return {1, self.length} | self.evidence

    def sequences(self) -> set[int]:
        return set(Checkpoint.objects.filter(run=self.run).values_list("sequence", flat=True))


def artifact(tenant, data: bytes, kind: str = ArtifactKind.DRAFT):  # noqa: ANN001, ANN201
    row, _ = artifact_store(tenant=tenant, data=data, media_type="text/plain", kind=kind)
    return row


def ref(row) -> dict[str, str]:  # noqa: ANN001
    return {"id": str(row.id), "sha256": row.sha256}


def build(
    tenant,  # noqa: ANN001
    user,  # noqa: ANN001
    *,
    status: str,
    length: int = 8,
    evidence: tuple[int, ...] = (4,),
    ended_days_ago: float = 40,
    context_at: int | None = 3,
    final_draft: bool = True,
    workflow_type: str = "research",
) -> History:
    """A run of ``length`` checkpoints ending in ``status``, last updated long ago.

    Checkpoint ``context_at`` (an intermediate) names a model_context artifact of its own;
    the final checkpoint names a draft artifact of its own.
    """
    actor = Actor(user=user)
    run = run_create(
        tenant=tenant,
        workflow_type=workflow_type,
        inputs={"question": "why?"},
        execution="external",
        actor=actor,
    )
    history = History(run=run, length=length, evidence=set(evidence))
    for sequence in range(2, length + 1):
        artifacts = []
        if sequence == context_at:
            row = artifact(
                tenant, f"context {run.id} {sequence}".encode(), ArtifactKind.MODEL_CONTEXT
            )
            history.artifacts["context"] = row
            artifacts.append(ref(row))
        if sequence == length and final_draft:
            row = artifact(tenant, f"draft {run.id}".encode())
            history.artifacts["draft"] = row
            artifacts.append(ref(row))
        last = sequence == length
        checkpoint_commit(
            tenant=tenant,
            run_id=run.id,
            request=CommitRequest(
                expected_version=sequence - 1,
                state="collect_sources",
                step=f"step{sequence}",
                envelope={"evidence": {"artifacts": artifacts, "validators": []}},
                actor=actor,
                status=status if last and status in COMMITTED - {RunStatus.SUCCEEDED} else None,
                is_evidence=sequence in evidence,
            ),
        )
    if status not in COMMITTED - {RunStatus.SUCCEEDED}:
        Run.objects.filter(pk=run.pk).update(status=status)
    Run.objects.filter(pk=run.pk).update(updated_at=timezone.now() - timedelta(days=ended_days_ago))
    run.refresh_from_db()
    return history


def db_env() -> dict[str, str]:
    """Environment for a subprocess that uses this test run's database, keys and media."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONUNBUFFERED": "1"}
    env["CAIRN_MEDIA_ROOT"] = str(settings.MEDIA_ROOT)
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
        env["DATABASE_URL"] = f"postgres://{auth}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
    else:
        env.pop("DATABASE_URL", None)
        env["CAIRN_SQLITE_PATH"] = str(db["NAME"])
    return env


def start_job(*args: str, pause: float = 0.0, app_name: str = "") -> subprocess.Popen:
    env = db_env()
    if pause:
        env[RETENTION_PAUSE] = str(pause)  # tests/faults.py sleeps at "retention.batch"
    if app_name:
        env["PGAPPNAME"] = app_name
    return subprocess.Popen(
        [sys.executable, "manage.py", "apply_retention", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
