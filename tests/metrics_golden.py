"""The shape of ``/metrics`` as a golden reference: which families it serves, their TYPE and
HELP, and the label names of every series (with the values of the labels that are a fixed
enumeration), on a database seeded so that every series has samples.

``tests/test_metrics_families.py`` compares a scrape against
``tests/fixtures/metrics_families.json``. To record the fixture again (only when a change of
names or labels is intended, since dashboards and alert rules depend on them)::

    .venv/bin/python -m pytest tests/metrics_golden.py

This module is not collected by the suite (its name does not start with ``test_``); pytest
runs it only when it is named on the command line.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest
from checkpoints.models import (
    Artifact,
    ExternalOperation,
    OperationStatus,
    OutboxMessage,
    Run,
    RunStatus,
)
from checkpoints.services.outbox import outbox_enqueue
from checkpoints.services.workflows import workflow_register
from retention.policies import PolicyInput, retention_policy_save
from retention.services import retention_apply
from telemetry.counters import counters_rollup
from telemetry.latency import latency_rollup
from telemetry.models import CommitLatencySample
from tenants.services import Actor
from tests.factories import SIMPLE_DEFINITION
from tests.retention_support import artifact, build

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "metrics_families.json"
# Labels whose values are fixed by the code, not by the data: their values are part of the
# contract. ``tenant`` is data (a slug), so only its name is.
ENUMERATED = ("status", "state", "kind", "le")

HELP = re.compile(r"^# HELP (\S+) (.*)$")
TYPE = re.compile(r"^# TYPE (\S+) (\S+)$")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')


def seed_every_series(*, settings, acme, globex, bob, charlie) -> None:  # noqa: ANN001
    """Data behind every series /metrics serves: runs of both tenants in every status,
    active heads, restores, a stalled operation, approvals waiting and expired, an outbox
    message overdue, commit latency both rolled up and live, and retention deletions of
    every kind (checkpoints, artifacts, a whole run), rolled up and live."""
    settings.CAIRN_STALLED_OPERATION_SECONDS = 600  # named in a HELP text
    for tenant in (acme, globex):
        workflow_register(
            tenant=tenant, workflow_type="research", version="1", definition=SIMPLE_DEFINITION
        )
    runs = {status: build(acme, bob, status=status, length=4).run for status in RunStatus.values}
    build(globex, charlie, status=RunStatus.RUNNING, length=3)
    expired_run = build(acme, bob, status=RunStatus.SUCCEEDED, ended_days_ago=400).run
    Run.objects.filter(pk=runs[RunStatus.WAITING_RETRY].pk).update(restore_count=3)

    # Retention: intermediates older than 30 days, model contexts older than 7, runs
    # finished over a year ago; then fold the counters, and delete once more (live).
    Artifact.objects.update(created_at=timezone.now() - timedelta(days=40))
    retention_policy_save(
        tenant=acme,
        data=PolicyInput(intermediate_days=30, model_context_days=7, run_expiry_days=365),
        actor=Actor.system("test"),
    )
    report = retention_apply()
    assert report.checkpoints and report.artifacts and report.runs_expired == 1
    assert not Run.objects.filter(pk=expired_run.pk).exists()
    assert counters_rollup() > 0
    build(acme, bob, status=RunStatus.FAILED, length=4)
    assert retention_apply().checkpoints > 0

    # Commit latency: every sample so far folded into the totals, then live ones.
    CommitLatencySample.objects.update(created_at=timezone.now() - timedelta(minutes=5))
    assert latency_rollup() > 0
    build(globex, charlie, status=RunStatus.WAITING_APPROVAL, length=3)
    assert CommitLatencySample.objects.exists()

    waiting = runs[RunStatus.WAITING_APPROVAL]
    operation = ExternalOperation.objects.create(
        tenant=acme,
        run=waiting,
        idempotency_key="stalled",
        action="publish",
        target="blog",
        request_fingerprint="f" * 64,
        status=OperationStatus.PENDING,
    )
    ExternalOperation.objects.filter(pk=operation.pk).update(
        created_at=timezone.now() - timedelta(minutes=30)
    )
    draft = artifact(acme, b"draft under review")
    now = timezone.now()
    for action, status, expires in (
        ("publish", "pending", now + timedelta(hours=1)),
        ("send", "expired", now - timedelta(hours=1)),
    ):
        ApprovalRequest.objects.create(
            tenant=acme,
            run=waiting,
            run_version=waiting.version,
            checkpoint_sequence=waiting.checkpoint_sequence,
            artifact=draft,
            artifact_sha256=draft.sha256,
            action=action,
            requester_label="worker",
            status=status,
            expires_at=expires,
        )
    stuck = runs[RunStatus.RUNNING]
    message = outbox_enqueue(run=stuck, kind="run.resume", payload={"run_id": str(stuck.pk)})
    OutboxMessage.objects.filter(pk=message.pk).update(
        created_at=timezone.now() - timedelta(seconds=300)
    )


def exposition_families(text: str) -> list[dict[str, Any]]:
    """The families of an exposition document, in order: name, TYPE, HELP and, per sample
    name, the label names and the values of the enumerated labels (in the order served).
    Sample values and the order of sample lines within a family are left out: they are not
    names or labels. Fails on a line that is not exposition."""
    families: list[dict[str, Any]] = []
    samples: dict[tuple[str, tuple[str, ...]], dict[str, list[str]]] = {}

    def close() -> None:
        if families:
            families[-1]["samples"] = [
                {"name": name, "labels": list(labels), "values": values}
                for (name, labels), values in sorted(samples.items())
            ]
        samples.clear()

    for line in text.splitlines():
        if match := HELP.match(line):
            close()
            families.append({"name": match[1], "help": match[2]})
        elif match := TYPE.match(line):
            assert families and families[-1]["name"] == match[1], line
            families[-1]["type"] = match[2]
        elif match := SAMPLE.match(line):
            assert families and "type" in families[-1], f"a sample before its TYPE: {line!r}"
            labels = LABEL.findall(match[2] or "")
            assert "".join(f'{k}="{v}",' for k, v in labels).rstrip(",") == (match[2] or ""), line
            names = tuple(sorted(k for k, _ in labels))
            values = samples.setdefault((match[1], names), {})
            for key, value in labels:
                if key in ENUMERATED and value not in values.setdefault(key, []):
                    values[key].append(value)
        else:
            pytest.fail(f"not an exposition line: {line!r}")
    close()
    return families


@pytest.mark.django_db
def test_record_the_golden_metrics_families(client, settings, acme, globex, bob, charlie):  # noqa: ANN001
    seed_every_series(settings=settings, acme=acme, globex=globex, bob=bob, charlie=charlie)
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    golden = {
        "content_type": response["Content-Type"],
        "families": exposition_families(response.content.decode()),
    }
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps(golden, indent=2) + "\n")
