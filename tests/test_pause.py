"""Pausing a run (issue 29, item 4): an operator's hold that no dispatch path gets past, a
step in flight that still commits, and the hold lifted again. In process, on the real
outbox relay (memory broker) and the worker loop; tests/test_pause_workers.py does the same
with real Celery workers."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ApprovalStatus
from cairn.errors import ActionNotAllowed, RunNotActive
from checkpoints.models import OutboxMessage, Run, RunStatus
from checkpoints.services import outbox
from runtime.executor import run_advance
from runtime.registry import workflow_ensure_registered
from runtime.rescue import runs_rescue
from runtime.services.actions import run_resume
from runtime.services.pause import run_pause, run_unpause
from runtime.services.retry import run_retry
from runtime.services.runner import run_next_command
from tenants.models import AuditEvent
from tenants.services import Actor
from tests.approvals_support import ask, at_review, decide, draft, worker_run
from tests.runtime_support import advance, start

pytestmark = pytest.mark.django_db


def unsent(run: Run) -> list[OutboxMessage]:
    return list(OutboxMessage.objects.filter(run=run, kind="run.resume", sent_at__isnull=True))


@pytest.fixture
def demo(acme, settings):  # noqa: ANN001
    """A demo research run whose first command is queued (not yet published)."""
    settings.CAIRN_DISPATCH_ON_COMMIT = False
    assert workflow_ensure_registered("research", "1")
    return start(acme, "research", question="Why cairns?")


def test_a_paused_runs_commands_are_never_published(demo, bob):
    run_pause(tenant=demo.tenant, run_id=demo.pk, reason="check the sources", actor=Actor(user=bob))
    assert outbox.outbox_dispatch() == 0  # the relay holds it
    assert outbox.outbox_lag_seconds() == 0  # held on purpose: not lag
    assert len(unsent(demo)) == 1
    # Nor does the rescue queue another for it, however long it waits.
    Run.objects.filter(pk=demo.pk).update(updated_at=timezone.now() - timedelta(hours=1))
    assert runs_rescue() == 0
    demo.refresh_from_db()
    assert (demo.paused, demo.status, demo.checkpoint_sequence) == (True, "running", 1)
    event = AuditEvent.objects.get(action="run.pause", run_id=demo.pk)
    assert event.reason == "check the sources" and event.actor_label == "bob"

    run = run_unpause(tenant=demo.tenant, run_id=demo.pk, reason="ok", actor=Actor(user=bob))
    assert not run.paused and run.pause_reason == ""
    assert outbox.outbox_dispatch() == 1  # the held command, not a second one
    assert AuditEvent.objects.filter(action="run.unpause", run_id=demo.pk).exists()


def test_a_worker_given_a_command_sent_before_the_pause_starts_no_step(demo, bob):
    run_pause(tenant=demo.tenant, run_id=demo.pk, reason="hold", actor=Actor(user=bob))
    assert advance(demo) == "on_hold"
    demo.refresh_from_db()
    assert demo.checkpoint_sequence == 1 and demo.lease_owner == ""
    assert demo.budget_used.get("attempts_used", 0) == 0  # no attempt charged


def test_a_step_in_flight_commits_then_the_worker_stops(demo, bob, monkeypatch):
    """The pause lands while the first step runs: that step commits, no other starts."""
    from runtime import demo as research

    original = research.research.steps["collect_sources"].fn

    def step_paused_meanwhile(ctx):  # noqa: ANN001, ANN202
        run_pause(tenant=demo.tenant, run_id=demo.pk, reason="mid-step", actor=Actor(user=bob))
        return original(ctx)

    monkeypatch.setattr(research.research.steps["collect_sources"], "fn", step_paused_meanwhile)
    assert outbox.outbox_dispatch() == 1  # its first command, sent before the pause
    assert advance(demo) == "on_hold"
    demo.refresh_from_db()
    assert demo.checkpoint_sequence == 2 and demo.state == "extract_claims"  # committed
    assert demo.status == RunStatus.RUNNING and demo.paused and demo.lease_owner == ""
    # The command for the next step is held, unclaimed, for the unpause.
    held = unsent(demo)
    assert len(held) == 1 and held[0].claimed_until is None
    assert outbox.outbox_dispatch() == 0
    run_unpause(tenant=demo.tenant, run_id=demo.pk, actor=Actor(user=bob))
    assert outbox.outbox_dispatch() == 1
    monkeypatch.setattr(research.research.steps["collect_sources"], "fn", original)
    assert run_advance(
        run_id=demo.pk, expected_version=held[0].payload["expected_version"], owner="w2"
    ) in ("waiting_approval", "handed_over")
    demo.refresh_from_db()
    assert demo.checkpoint_sequence > 2


def test_resume_and_retry_of_a_paused_run_queue_but_do_not_dispatch(demo, bob):
    actor = Actor(user=bob)
    run_pause(tenant=demo.tenant, run_id=demo.pk, reason="hold", actor=actor)
    OutboxMessage.objects.filter(run=demo).update(sent_at=timezone.now())
    run = run_retry(
        tenant=demo.tenant, run_id=demo.pk, step="collect_sources", reason="again", actor=actor
    )
    assert run.paused and len(unsent(run)) == 1
    assert outbox.outbox_dispatch() == 0
    Run.objects.filter(pk=run.pk).update(status=RunStatus.PAUSED_FOR_REVIEW)
    run_resume(tenant=run.tenant, run_id=run.pk, expected_version=run.version, actor=actor)
    assert outbox.outbox_dispatch() == 0
    run_unpause(tenant=run.tenant, run_id=run.pk, actor=actor)
    assert outbox.outbox_dispatch() == 2  # both held commands; the older one is stale


def test_an_approval_decided_while_paused_waits_for_the_unpause(acme, bob, carol, settings):
    settings.CAIRN_DISPATCH_ON_COMMIT = False
    artifact = draft(acme)
    run = at_review(worker_run(acme, bob), artifact)
    request = ask(run, artifact, bob)
    OutboxMessage.objects.filter(run=run).update(sent_at=timezone.now())
    run_pause(tenant=acme, run_id=run.pk, reason="hold", actor=Actor(user=bob))
    decide(request, carol)
    request.refresh_from_db()
    assert request.status == ApprovalStatus.APPROVED
    assert len(unsent(run)) == 1 and outbox.outbox_dispatch() == 0
    run_unpause(tenant=acme, run_id=run.pk, actor=Actor(user=bob))
    assert outbox.outbox_dispatch() == 1


def test_unpausing_queues_a_command_when_none_is_held(demo, bob):
    actor = Actor(user=bob)
    run_pause(tenant=demo.tenant, run_id=demo.pk, reason="hold", actor=actor)
    assert advance(demo) == "on_hold"  # the command sent before the pause is spent
    OutboxMessage.objects.filter(run=demo).update(sent_at=timezone.now())
    run_unpause(tenant=demo.tenant, run_id=demo.pk, actor=actor)
    [queued] = unsent(demo)
    assert queued.payload["expected_version"] == Run.objects.get(pk=demo.pk).version
    assert outbox.outbox_dispatch() == 1


def test_an_external_runner_is_told_to_wait(acme, bob, run):
    run_pause(tenant=acme, run_id=run.pk, reason="legal asked", actor=Actor(user=bob))
    run.refresh_from_db()
    answer = run_next_command(run=run)
    assert (answer.due, answer.command) == (False, "wait")
    assert "legal asked" in answer.reason


def test_what_cannot_be_paused_or_unpaused_is_refused(acme, bob, run):
    actor = Actor(user=bob)
    with pytest.raises(RunNotActive):
        run_unpause(tenant=acme, run_id=run.pk, actor=actor)
    run_pause(tenant=acme, run_id=run.pk, reason="x", actor=actor)
    with pytest.raises(ActionNotAllowed, match="already paused"):
        run_pause(tenant=acme, run_id=run.pk, reason="x", actor=actor)
    Run.objects.filter(pk=run.pk).update(paused=False, status=RunStatus.SUCCEEDED)
    with pytest.raises(ActionNotAllowed, match="succeeded"):
        run_pause(tenant=acme, run_id=run.pk, reason="x", actor=actor)
    assert AuditEvent.objects.filter(action="run.pause").count() == 1


def test_the_api_pauses_and_unpauses_and_says_why_it_refuses(acme, bob, carol, run, api_as):
    client = api_as(bob, acme)
    url = f"/api/v1/runs/{run.pk}/actions"
    assert (
        api_as(carol, acme).post(f"{url}/pause", {"reason": "x"}, format="json").status_code == 403
    )
    assert client.post(f"{url}/pause", {}, format="json").status_code == 400  # no reason
    response = client.post(f"{url}/pause", {"reason": "legal asked"}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert body["paused"] is True and body["pause_reason"] == "paused by bob: legal asked"
    assert body["version"] == run.version  # the version stays: a step in flight commits
    again = client.post(f"{url}/pause", {"reason": "x"}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "action_not_allowed"
    response = client.post(f"{url}/unpause", {}, format="json")
    assert response.status_code == 200 and response.json()["paused"] is False
    again = client.post(f"{url}/unpause", {}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "run_not_active"


def test_the_runs_page_counts_and_filters_paused_runs(acme, bob, workflow, run):
    from django.test import Client

    from runtime.services.runs import run_create

    other = run_create(
        tenant=acme,
        workflow_type="research",
        inputs={},
        execution="external",
        actor=Actor(user=bob),
    )
    run_pause(tenant=acme, run_id=run.pk, reason="x", actor=Actor(user=bob))
    client = Client()
    client.force_login(bob)
    counts = client.get("/runs/counts/").content.decode()
    assert (
        'id="paused-chip"' in counts and '<span class="count">1</span></a></li>\n  </ul>' in counts
    )
    rows = client.get("/runs/?paused=on").content.decode()
    assert f'id="run-{run.pk}"' in rows and f'id="run-{other.pk}"' not in rows
    assert "data-paused" in rows


def test_the_resume_and_retry_previews_say_a_paused_runs_command_waits(demo, bob):
    from console.action_specs import ACTIONS

    run = run_pause(tenant=demo.tenant, run_id=demo.pk, reason="hold", actor=Actor(user=bob))
    lines = ACTIONS["retry"].summary(run, {"step": "collect_sources"}, None).lines
    assert lines[-1] == "The run is paused: its command waits, unsent, until you unpause it."


def test_the_api_lists_paused_runs_apart(acme, bob, run, api_as):
    client = api_as(bob, acme)
    run_pause(tenant=acme, run_id=run.pk, reason="x", actor=Actor(user=bob))
    paused = client.get("/api/v1/runs?paused=true").json()
    assert [r["id"] for r in paused["results"]] == [str(run.pk)]
    assert client.get("/api/v1/runs?paused=false").json()["results"] == []
    refused = client.get("/api/v1/runs?paused=maybe")
    assert refused.status_code == 400 and refused.json()["fields"] == {"paused": "true or false"}
