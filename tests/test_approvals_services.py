"""Approval services: binding, every refusal, consumption once, expiry, signals, audit."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals import signals
from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus, ImmutableDecision
from approvals.selectors import review_queue
from approvals.services import (
    approval_consume,
    approval_decide,
    approval_expire_due,
    approval_gate,
    approval_request_create,
)
from cairn.errors import (
    AlreadyDecided,
    ApprovalClosed,
    ApprovalExpired,
    ApprovalHashMismatch,
    ApprovalRequired,
    ApprovalStale,
    ArtifactHashMismatch,
    InvalidRequest,
    NotFound,
    ReviewNotAllowed,
    RunNotActive,
    SelfApprovalForbidden,
)
from checkpoints.models import OutboxMessage, RunStatus
from tenants.models import AuditEvent
from tenants.services import Actor
from tests.approvals_support import ask, at_review, decide, draft, expire_now, move, worker_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def artifact(acme):  # noqa: ANN001
    return draft(acme)


@pytest.fixture
def waiting(run, artifact):  # noqa: ANN001
    return at_review(run, artifact)


@pytest.fixture
def request_(waiting, artifact, bob):  # noqa: ANN001
    return ask(waiting, artifact, bob)


# --- requests -----------------------------------------------------------------------------
def test_a_request_is_bound_to_the_run_version_checkpoint_and_artifact(waiting, request_, bob):
    assert waiting.status == RunStatus.WAITING_APPROVAL
    assert request_.run_version == waiting.version
    assert request_.checkpoint_id == waiting.latest_checkpoint_id
    assert request_.checkpoint_sequence == waiting.checkpoint_sequence
    assert request_.checkpoint_sha256 == waiting.latest_checkpoint_sha256
    assert request_.artifact_sha256 == request_.artifact.sha256
    assert request_.requester == bob and request_.requester_label == "bob"
    assert request_.status == ApprovalStatus.PENDING and request_.required_approvals == 1
    assert request_.expires_at > timezone.now() + timedelta(hours=23)
    assert AuditEvent.objects.filter(action="approval.requested", target=str(request_.pk)).exists()


def test_a_new_request_supersedes_the_live_one_for_the_same_action(waiting, request_, bob):
    newer = ask(waiting, draft(waiting.tenant, "# Second draft\n"), bob)
    request_.refresh_from_db()
    assert request_.status == ApprovalStatus.SUPERSEDED
    assert newer.status == ApprovalStatus.PENDING and newer.previous_id == request_.pk


def test_it_refuses_a_request_for_an_artifact_stored_with_another_hash(waiting, artifact, bob):
    with pytest.raises(ArtifactHashMismatch) as caught:
        approval_request_create(
            tenant=waiting.tenant,
            run_id=waiting.id,
            artifact_id=artifact.id,
            artifact_sha256="0" * 64,
            action="publish",
            actor=Actor(user=bob),
        )
    assert caught.value.status == 422
    assert not ApprovalRequest.objects.exists()


def test_it_refuses_an_expiry_in_the_past(waiting, artifact, bob):
    with pytest.raises(InvalidRequest) as caught:
        ask(waiting, artifact, bob, expires_at=timezone.now() - timedelta(minutes=1))
    assert "expires_at" in caught.value.fields


def test_it_refuses_a_request_on_a_finished_run(run, artifact, bob):
    run = at_review(run, artifact)
    move(run, "publish")
    move(run, "done")
    with pytest.raises(RunNotActive):
        ask(run, artifact, bob)


def test_one_live_request_per_run_and_action_is_enforced_by_the_database(request_):
    with pytest.raises(IntegrityError), transaction.atomic():
        ApprovalRequest.objects.create(
            tenant=request_.tenant,
            run=request_.run,
            run_version=request_.run_version,
            checkpoint_sequence=request_.checkpoint_sequence,
            artifact=request_.artifact,
            artifact_sha256=request_.artifact_sha256,
            action=request_.action,
            requester_label="x",
            expires_at=request_.expires_at,
        )


# --- decisions: success --------------------------------------------------------------------
def test_an_approval_of_a_worker_run_enqueues_its_resume_with_the_bound_version(acme, bob, carol):
    run = at_review(worker_run(acme, bob), draft(acme))
    request = ask(run, draft(acme), bob)
    before = OutboxMessage.objects.filter(run=run, kind="run.resume").count()
    decide(request, carol, comment="reads well")
    request.refresh_from_db()
    assert request.status == ApprovalStatus.APPROVED and request.decided_at
    resumes = OutboxMessage.objects.filter(run=run, kind="run.resume").order_by("id")
    assert resumes.count() == before + 1
    assert resumes.last().payload == {"run_id": str(run.id), "expected_version": run.version}


def test_a_reject_of_an_external_run_fails_it_with_the_comment_as_reason(request_, carol):
    decide(request_, carol, "reject", comment="The second claim has no source.")
    request_.refresh_from_db()
    run = request_.run
    run.refresh_from_db()
    assert request_.status == ApprovalStatus.REJECTED
    assert run.status == RunStatus.FAILED
    assert "The second claim has no source." in run.status_reason


def test_a_reject_of_a_worker_run_leaves_the_ending_to_its_workflow(acme, bob, carol):
    run = at_review(worker_run(acme, bob), draft(acme))
    request = ask(run, draft(acme), bob)
    decide(request, carol, "reject", comment="no")
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_APPROVAL  # the worker's gate moves it on
    assert OutboxMessage.objects.filter(run=run, kind="run.resume").last().payload == {
        "run_id": str(run.id),
        "expected_version": run.version,
    }
    verdict = approval_gate(
        run=run,
        action="publish",
        artifact_id=request.artifact_id,
        artifact_sha256=request.artifact_sha256,
        actor=Actor.system("gate"),
    )
    assert verdict.outcome == "rejected" and verdict.reason == "no"


def test_a_request_needing_two_approvals_waits_for_a_second_reviewer(
    waiting, artifact, bob, carol, alice
):
    request = ask(waiting, artifact, bob, required_approvals=2)
    decide(request, carol)
    request.refresh_from_db()
    assert request.status == ApprovalStatus.PENDING
    decide(request, alice)
    request.refresh_from_db()
    assert request.status == ApprovalStatus.APPROVED


# --- decisions: every refusal ----------------------------------------------------------------
def test_it_refuses_an_expired_request_and_raises_a_fresh_one(request_, carol):
    expire_now(request_)
    with pytest.raises(ApprovalExpired) as caught:
        decide(request_, carol)
    assert caught.value.status == 409 and caught.value.code == "approval_expired"
    request_.refresh_from_db()
    assert request_.status == ApprovalStatus.EXPIRED
    assert not ApprovalDecision.objects.exists()
    fresh = ApprovalRequest.objects.get(status=ApprovalStatus.PENDING)
    assert fresh.previous_id == request_.pk
    assert fresh.artifact_sha256 == request_.artifact_sha256
    assert fresh.run_version == request_.run_version and fresh.expires_at > timezone.now()


def test_it_refuses_a_hash_other_than_the_bound_one(request_, carol):
    with pytest.raises(ApprovalHashMismatch) as caught:
        decide(request_, carol, sha="f" * 64)
    assert caught.value.status == 409 and caught.value.code == "artifact_hash_mismatch"
    request_.refresh_from_db()
    assert request_.status == ApprovalStatus.PENDING and not ApprovalDecision.objects.exists()


def test_it_refuses_a_stale_version(request_, carol):
    move(request_.run, "review")  # the run commits again: it moved past the bound version
    with pytest.raises(ApprovalStale) as caught:
        decide(request_, carol)
    assert caught.value.code == "approval_stale" and caught.value.status == 409
    assert not ApprovalDecision.objects.exists()


def test_it_refuses_a_superseded_request_as_stale(waiting, request_, bob, carol):
    ask(waiting, draft(waiting.tenant, "# A new draft\n"), bob)
    with pytest.raises(ApprovalStale):
        decide(request_, carol)


def test_it_refuses_self_approval(waiting, artifact, alice):
    request = ask(waiting, artifact, alice)  # alice may operate and review
    with pytest.raises(SelfApprovalForbidden) as caught:
        decide(request, alice)
    assert caught.value.code == "self_approval_forbidden" and caught.value.status == 409
    assert not ApprovalDecision.objects.exists()


def test_it_refuses_a_second_decision_by_the_same_reviewer(waiting, artifact, bob, carol):
    request = ask(waiting, artifact, bob, required_approvals=2)
    decide(request, carol)
    with pytest.raises(AlreadyDecided) as caught:
        decide(request, carol, "reject", comment="changed my mind")
    assert caught.value.code == "already_decided" and caught.value.status == 409
    assert ApprovalDecision.objects.filter(request=request).count() == 1


def test_it_refuses_a_decision_on_a_request_others_settled(request_, carol, alice):
    decide(request_, carol)
    with pytest.raises(ApprovalClosed):
        decide(request_, alice, "reject", comment="not good")


def test_another_tenants_request_is_not_found(request_, globex, charlie):
    with pytest.raises(NotFound):
        approval_decide(
            tenant=globex,
            request_id=request_.pk,
            decision="approve",
            artifact_sha256=request_.artifact_sha256,
            actor=Actor(user=charlie),
        )


def test_it_refuses_a_decider_without_the_review_role(request_, bob):
    with pytest.raises(ReviewNotAllowed):
        decide(request_, bob)


def test_decisions_are_immutable(request_, carol):
    decision = decide(request_, carol)
    decision.comment = "changed my mind"
    with pytest.raises(ImmutableDecision):
        decision.save()
    with pytest.raises(ImmutableDecision):
        decision.delete()


def test_every_decision_and_every_refusal_is_audited(request_, carol):
    with pytest.raises(ApprovalHashMismatch):
        decide(request_, carol, sha="f" * 64)
    decide(request_, carol, comment="ok")
    refused = AuditEvent.objects.get(action="approval.decision_refused")
    assert refused.details["code"] == "artifact_hash_mismatch" and refused.actor_label == "carol"
    recorded = AuditEvent.objects.get(action="approval.decision")
    assert recorded.details["decision"] == "approve" and recorded.reason == "ok"


# --- consumption ---------------------------------------------------------------------------
def test_an_approval_is_consumed_once_for_its_version_action_and_hash(request_, carol):
    decide(request_, carol)
    run = request_.run
    run.refresh_from_db()
    actor = Actor.system("worker")
    sha = request_.artifact_sha256
    with pytest.raises(ApprovalHashMismatch):
        approval_consume(
            run=run, request_id=request_.pk, action="publish", artifact_sha256="e" * 64, actor=actor
        )
    # An approval of publish is no approval of another action (issue 24: approval_required).
    with pytest.raises(ApprovalRequired):
        approval_consume(
            run=run, request_id=request_.pk, action="delete", artifact_sha256=sha, actor=actor
        )
    used = approval_consume(
        run=run, request_id=request_.pk, action="publish", artifact_sha256=sha, actor=actor
    )
    assert used.status == ApprovalStatus.CONSUMED and used.consumed_at
    with pytest.raises(ApprovalClosed):
        approval_consume(
            run=run, request_id=request_.pk, action="publish", artifact_sha256=sha, actor=actor
        )


def test_an_approval_past_its_expiry_is_not_used(request_, carol):
    decide(request_, carol)
    expire_now(request_)
    run = request_.run
    run.refresh_from_db()
    with pytest.raises(ApprovalExpired):
        approval_consume(
            run=run,
            request_id=request_.pk,
            action="publish",
            artifact_sha256=request_.artifact_sha256,
            actor=Actor.system("worker"),
        )
    request_.refresh_from_db()
    assert request_.status == ApprovalStatus.EXPIRED


# --- the gate (restore step 6) --------------------------------------------------------------
def gate(run, artifact):  # noqa: ANN001, ANN201
    run.refresh_from_db()
    return approval_gate(
        run=run,
        action="publish",
        artifact_id=artifact.id,
        artifact_sha256=artifact.sha256,
        actor=Actor.system("gate"),
    )


def test_the_gate_raises_a_request_attributed_to_the_runs_starter(waiting, artifact, bob, carol):
    verdict = gate(waiting, artifact)
    assert verdict.outcome == "waiting" and verdict.request.requester == bob
    assert gate(waiting, artifact).request == verdict.request  # waiting raises nothing new
    decide(verdict.request, carol)
    approved = gate(waiting, artifact)
    # The gate only answers: the commit that moves the run past review consumes it.
    assert approved.proceed and approved.request.status == ApprovalStatus.APPROVED


def test_a_draft_regenerated_after_approval_is_not_published_under_the_old_approval(
    waiting, artifact, carol, bob
):
    old = gate(waiting, artifact).request
    decide(old, carol)
    # Before the worker used the approval, the draft step was retried and wrote a new draft.
    regenerated = draft(waiting.tenant, "# Cairns\n\nA different answer entirely.\n")
    run = move(waiting, "review", regenerated)
    verdict = gate(run, regenerated)
    assert not verdict.proceed and verdict.outcome == "waiting"
    old.refresh_from_db()
    assert old.status == ApprovalStatus.SUPERSEDED
    assert verdict.request.artifact_sha256 == regenerated.sha256 != old.artifact_sha256
    with pytest.raises((ApprovalClosed, ApprovalStale, ApprovalHashMismatch)):
        approval_consume(
            run=run,
            request_id=old.pk,
            action="publish",
            artifact_sha256=regenerated.sha256,
            actor=Actor.system("worker"),
        )


def test_the_gate_replaces_an_expired_request_with_a_fresh_one(waiting, artifact, carol):
    old = gate(waiting, artifact).request
    decide(old, carol)
    expire_now(old)
    verdict = gate(waiting, artifact)
    old.refresh_from_db()
    assert old.status == ApprovalStatus.EXPIRED
    assert verdict.outcome == "waiting" and verdict.request.pk != old.pk
    assert verdict.request.previous_id == old.pk


def test_the_gate_lets_a_consumed_approval_count_again_only_while_the_run_has_not_moved(
    waiting, artifact, carol
):
    request = gate(waiting, artifact).request
    decide(request, carol)
    assert gate(waiting, artifact).proceed  # consumed; the move that follows failed
    assert gate(waiting, artifact).proceed  # the same, single use: the run is where it was
    moved = move(waiting, "review")  # the run moves on (here: stays in review, new version)
    assert not gate(moved, artifact).proceed


# --- expiry sweep, queue, signals ------------------------------------------------------------
def test_the_expiry_sweep_expires_due_requests_and_raises_fresh_ones(request_):
    from approvals.tasks import expire_due

    expire_now(request_)
    assert expire_due() == 1  # the beat task
    request_.refresh_from_db()
    assert request_.status == ApprovalStatus.EXPIRED
    assert ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING).count() == 1
    assert approval_expire_due() == 0
    assert AuditEvent.objects.filter(action="approval.expired").count() == 1


def test_the_queue_holds_pending_requests_others_asked_for_and_not_yet_decided(
    waiting, artifact, bob, carol, alice
):
    request = ask(waiting, artifact, alice, required_approvals=2)
    assert list(review_queue(tenant=waiting.tenant, user=carol)) == [request]
    assert list(review_queue(tenant=waiting.tenant, user=alice)) == []  # her own
    assert list(review_queue(tenant=waiting.tenant, user=bob)) == []  # no review role
    decide(request, carol)
    assert list(review_queue(tenant=waiting.tenant, user=carol)) == []  # decided already
    expire_now(request)
    assert list(review_queue(tenant=waiting.tenant, user=carol)) == []


def test_signals_fire_after_commit_with_the_rows(
    waiting, artifact, bob, carol, django_capture_on_commit_callbacks
):
    seen = []

    def on_requested(sender, request, **kwargs):  # noqa: ANN001, ANN003
        seen.append(("requested", request.pk, request.status))

    def on_decided(sender, request, decision, **kwargs):  # noqa: ANN001, ANN003
        seen.append(("decided", request.pk, decision.decision))

    def broken(sender, **kwargs):  # noqa: ANN001, ANN003
        raise RuntimeError("mail server down")

    signals.approval_requested.connect(on_requested)
    signals.approval_requested.connect(broken)
    signals.approval_decided.connect(on_decided)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            request = ask(waiting, artifact, bob)
            assert seen == []  # not before commit
        with django_capture_on_commit_callbacks(execute=True):
            decide(request, carol)
    finally:
        signals.approval_requested.disconnect(on_requested)
        signals.approval_requested.disconnect(broken)
        signals.approval_decided.disconnect(on_decided)
    assert seen == [("requested", request.pk, "pending"), ("decided", request.pk, "approve")]


def test_the_queue_leaves_out_requests_whose_run_moved_on(waiting, request_, carol):
    assert list(review_queue(tenant=waiting.tenant, user=carol)) == [request_]
    move(waiting, "review")  # a new version: deciding would be refused as stale
    assert list(review_queue(tenant=waiting.tenant, user=carol)) == []
