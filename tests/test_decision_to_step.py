"""Decision to next step (issue 27, item 6): an approval's commit publishes the run's next
command itself; no sweep interval lies between a reviewer's approve and the worker.
bench/approval_latency.py measures the whole path with real workers and no beat."""

from __future__ import annotations

from django.utils import timezone

from cairn.celery import app
from checkpoints.models import OutboxMessage
from tests.approvals_support import ask, at_review, decide, draft, worker_run


def test_an_approval_publishes_the_runs_next_command_at_its_commit_without_a_sweep(
    acme, bob, carol, settings, monkeypatch, django_capture_on_commit_callbacks
):  # noqa: ANN001
    settings.CAIRN_DISPATCH_ON_COMMIT = True
    run = at_review(worker_run(acme, bob), draft(acme))
    request = ask(run, draft(acme), bob)
    OutboxMessage.objects.filter(run=run).update(sent_at=timezone.now())  # earlier commands
    sent = []
    # The broker is the edge of the world here: what reaches it, and when.
    monkeypatch.setattr(app, "send_task", lambda name, kwargs, **_: sent.append((name, kwargs)))
    with django_capture_on_commit_callbacks(execute=True):
        decide(request, carol)
        assert sent == []  # nothing leaves before the decision is committed
    run.refresh_from_db()
    assert sent == [
        ("checkpoints.run_advance", {"run_id": str(run.pk), "expected_version": run.version})
    ]
    command = OutboxMessage.objects.filter(run=run, kind="run.resume").latest("id")
    assert command.payload["expected_version"] == run.version and command.sent_at is not None
    assert not OutboxMessage.objects.filter(run=run, sent_at__isnull=True).exists()
