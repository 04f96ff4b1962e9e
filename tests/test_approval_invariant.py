"""The approval invariant (issue 24): a run's history passes an approval state only through a
checkpoint that consumes a granted approval bound to that run version, the artifact's sha256
and the action the approval state declares; whatever the status, whoever writes.

Each reproduction of the adversarial pass is here, tried as a hostile operator would: the
failed exit followed by a resume, an approval of another action, the starter approving their
own run, a commit to a worker run without its lease, and a chain written directly (as older
Cairn wrote it) that ``verify`` must catch and no operator action may continue.
"""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints.models import Checkpoint, ExternalOperation, Run, RunStatus
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from checkpoints.services.integrity import run_verify
from checkpoints.services.reads import checkpoint_envelope
from runtime.executor import run_advance
from runtime.registry import workflows_sync
from runtime.services.runs import run_create
from tenants.services import Actor
from tests.approvals_support import DRAFT, ask, at_review, decide, draft
from tests.runtime_support import checkpoint_write_raw

pytestmark = pytest.mark.django_db


@pytest.fixture
def as_bob(api_as, bob, acme):  # noqa: ANN001, ANN201
    return api_as(bob, acme)


def _evidence(artifact) -> dict:  # noqa: ANN001
    return {
        "artifacts": [{"id": str(artifact.id), "sha256": artifact.sha256, "name": "draft"}],
        "validators": [],
    }


def _commit(client, run: Run, state: str, **body):  # noqa: ANN001, ANN003, ANN202
    run.refresh_from_db()
    payload = {"expected_version": run.version, "state": state, "step": state, "envelope": {}}
    payload.update(body)
    return client.post(f"/api/v1/runs/{run.id}/checkpoints", payload, format="json")


def _unchanged(run: Run, before: tuple) -> None:
    run.refresh_from_db()
    assert (run.version, run.checkpoint_sequence, run.state, run.status) == before
    assert Checkpoint.objects.filter(run=run).count() == run.checkpoint_sequence


def _snapshot(run: Run) -> tuple:
    run.refresh_from_db()
    return (run.version, run.checkpoint_sequence, run.state, run.status)


# --- the failed exit, then resume ------------------------------------------------------------
def test_a_failed_exit_past_the_approval_state_is_refused_with_a_sentence(run, as_bob, acme):  # noqa: ANN001
    run = at_review(run, draft(acme))
    before = _snapshot(run)
    answer = _commit(
        as_bob, run, "publish", status="failed", status_reason="giving up", envelope={}
    )
    assert answer.status_code == 409, answer.json()
    body = answer.json()
    assert body["code"] == "approval_required"
    assert "publish" in body["detail"] and "review" in body["detail"]
    _unchanged(run, before)
    # The resume that followed it has nothing to continue: the run still waits at review.
    resumed = as_bob.post(
        f"/api/v1/runs/{run.id}/actions/resume", {"expected_version": run.version}, format="json"
    )
    assert resumed.status_code == 409
    _unchanged(run, before)


def test_failing_in_place_or_ending_in_the_rejected_state_needs_no_approval(run, as_bob, acme):  # noqa: ANN001
    run = at_review(run, draft(acme))
    ends = _commit(as_bob, run, "rejected", status="failed", status_reason="abandoned")
    assert ends.status_code == 201, ends.json()
    run.refresh_from_db()
    assert (run.state, run.status) == ("rejected", RunStatus.FAILED)
    assert run_verify(tenant=acme, run_id=run.pk)["ok"]
    # A terminal state behind the approval ends the run: it never continues from there.
    retried = as_bob.post(
        f"/api/v1/runs/{run.id}/actions/retry",
        {"step": "publish", "reason": "ship it anyway"},
        format="json",
    )
    assert retried.status_code == 409 and retried.json()["code"] == "action_not_allowed"


@pytest.fixture
def gated(db):  # noqa: ANN001
    import tests.invariant_workflows  # noqa: F401  (declares gated_publish)

    workflows_sync()


@pytest.fixture
def service(settings, publishing_service):  # noqa: ANN001, ANN201
    settings.CAIRN_PUBLISHING_URL = publishing_service.url
    settings.CAIRN_PUBLISHING_TOKEN_REF = ""
    settings.CAIRN_RETRY_DELAY_SECONDS = 0
    return publishing_service


def _worker_run(tenant, user) -> Run:  # noqa: ANN001
    return run_create(
        tenant=tenant,
        workflow_type="gated_publish",
        inputs={"title": "Why build cairns?"},
        budget={"max_attempts": 20},
        actor=Actor(user=user),
    )


def _work(run: Run) -> Run:
    """One worker turn in this process: steps until the run waits or ends."""
    run.refresh_from_db()
    run_advance(run_id=run.pk, expected_version=run.version, owner="test-worker")
    run.refresh_from_db()
    return run


def test_the_worker_run_reproduction_ends_in_a_refusal_and_publishes_nothing(
    gated, service, acme, alice, as_bob
):  # noqa: ANN001
    run = _work(_worker_run(acme, alice))
    assert (run.state, run.status) == ("review", RunStatus.WAITING_APPROVAL)
    before = _snapshot(run)
    # The adversarial pass: fail the run past its approval state, resume it, let it work.
    unleased = _commit(as_bob, run, "publish", status="failed", status_reason="giving up")
    if unleased.status_code == 201:  # old main: the resume then continues into the effect
        run.refresh_from_db()
        as_bob.post(
            f"/api/v1/runs/{run.id}/actions/resume",
            {"expected_version": run.version},
            format="json",
        )
        _work(run)
    assert service.stats()["publications"] == 0
    # Without the lease an API caller may not write a worker run's history at all.
    assert unleased.status_code == 409 and unleased.json()["code"] == "lease_held"
    assert "lease" in unleased.json()["detail"]
    _unchanged(run, before)
    # Holding it, the failed exit past the approval is still refused.
    leased = as_bob.post(
        f"/api/v1/runs/{run.id}/lease",
        {"owner": "bobs-script", "ttl_seconds": 30, "expected_version": run.version},
        format="json",
    )
    assert leased.status_code == 200, leased.json()
    answer = _commit(
        as_bob, run, "publish", status="failed", status_reason="x", lease_owner="bobs-script"
    )
    assert answer.status_code == 409 and answer.json()["code"] == "approval_required"
    _unchanged(run, before)
    assert service.stats()["publications"] == 0


# --- a chain that crossed unapproved (written directly, as older Cairn could) ---------------
def _crossed_unapproved(run: Run, state: str = "publish") -> Checkpoint:
    """Append a checkpoint that leaves ``review`` for ``state`` with no approval, and fail
    the run there: the rows older Cairn wrote for ``{"state": "publish", "status":
    "failed"}``."""
    envelope = checkpoint_envelope(Checkpoint.objects.get(pk=run.latest_checkpoint_id))
    checkpoint = checkpoint_write_raw(
        run, envelope, state=state, step=state, schema_version=envelope["schema_version"]
    )
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED, status_reason="giving up")
    run.refresh_from_db()
    return checkpoint


def test_verify_names_the_checkpoint_that_crossed_the_approval_state_unapproved(run, acme):  # noqa: ANN001
    run = at_review(run, draft(acme))
    crossing = _crossed_unapproved(run)
    report = run_verify(tenant=acme, run_id=run.pk)
    assert not report["ok"]
    assert any(
        f"checkpoint {crossing.sequence}" in problem and "review" in problem
        for problem in report["problems"]
    ), report["problems"]


def test_a_run_past_an_unapproved_approval_state_cannot_be_resumed_retried_or_forked(
    run, as_bob, acme
):  # noqa: ANN001
    run = at_review(run, draft(acme))
    _crossed_unapproved(run)
    before = _snapshot(run)
    resumed = as_bob.post(
        f"/api/v1/runs/{run.id}/actions/resume", {"expected_version": run.version}, format="json"
    )
    assert resumed.status_code == 409, resumed.json()
    assert resumed.json()["code"] == "action_not_allowed"
    assert "review" in resumed.json()["detail"]
    retried = as_bob.post(
        f"/api/v1/runs/{run.id}/actions/retry",
        {"step": "publish", "reason": "again"},
        format="json",
    )
    assert retried.status_code == 409 and retried.json()["code"] == "action_not_allowed"
    forked = as_bob.post(
        f"/api/v1/runs/{run.id}/actions/fork",
        {"from_sequence": run.checkpoint_sequence, "reason": "from here"},
        format="json",
    )
    assert forked.status_code == 409 and forked.json()["code"] == "action_not_allowed"
    _unchanged(run, before)
    assert "stays failed" in resumed.json()["detail"]


# --- the action is bound ---------------------------------------------------------------------
def test_an_approval_of_another_action_does_not_let_the_run_pass(run, as_bob, bob, carol, acme):  # noqa: ANN001
    artifact = draft(acme)
    run = at_review(run, artifact)
    decide(ask(run, artifact, bob, action="delete_everything"), carol)
    before = _snapshot(run)
    answer = _commit(as_bob, run, "publish", envelope={"evidence": _evidence(artifact)})
    assert answer.status_code == 409, answer.json()
    assert answer.json()["code"] == "approval_required"
    assert "delete_everything" in answer.json()["detail"]
    _unchanged(run, before)
    assert ApprovalRequest.objects.get(run=run).status == ApprovalStatus.APPROVED  # not used


# --- four eyes -------------------------------------------------------------------------------
def test_whoever_started_the_run_cannot_approve_its_artifact(acme, alice, bob, workflow, api_as):  # noqa: ANN001
    run = run_create(
        tenant=acme,
        workflow_type="research",
        inputs={"question": "why?"},
        execution="external",
        actor=Actor(user=alice),
    )
    artifact = draft(acme)
    run = at_review(run, artifact)
    request = ask(run, artifact, bob)  # an operator raises it
    answer = api_as(alice, acme).post(
        f"/api/v1/approvals/{request.pk}/decision",
        {"decision": "approve", "artifact_sha256": artifact.sha256, "comment": "mine"},
        format="json",
    )
    assert answer.status_code == 409, answer.json()
    assert answer.json()["code"] == "self_approval_forbidden"
    assert "started" in answer.json()["detail"]
    request.refresh_from_db()
    assert request.status == ApprovalStatus.PENDING and not request.decisions.exists()


def test_a_draft_committed_by_hand_is_not_published_under_an_older_approval(
    gated, service, acme, alice, bob, carol, as_bob
):  # noqa: ANN001
    """Swapping the draft past the approval (a hostile commit holding the lease) does not
    ship the swapped draft: the effect is refused, nothing reaches the provider."""
    run = _work(_worker_run(acme, alice))
    request = ApprovalRequest.objects.get(run=run, status=ApprovalStatus.PENDING)
    decide(request, carol)
    # Stop the worker before publish: take the run at publish with the approval consumed.
    run.refresh_from_db()
    head = checkpoint_envelope(Checkpoint.objects.get(pk=run.latest_checkpoint_id))
    checkpoint_commit(
        tenant=acme,
        run_id=run.pk,
        request=CommitRequest(
            expected_version=run.version,
            state="publish",
            step="review",
            envelope={
                "evidence": head["evidence"],
                "control": {"approval_request_id": str(request.pk)},
            },
            actor=Actor(user=bob),
        ),
    )
    swapped = draft(acme, DRAFT + "\nA sentence nobody reviewed.\n")
    run.refresh_from_db()
    lease = as_bob.post(
        f"/api/v1/runs/{run.id}/lease",
        {"owner": "bobs-script", "ttl_seconds": 30, "expected_version": run.version},
        format="json",
    )
    assert lease.status_code == 200
    evidence = dict(head["evidence"])
    evidence["artifacts"] = [
        {**ref, "id": str(swapped.id), "sha256": swapped.sha256} for ref in evidence["artifacts"]
    ]
    _commit(as_bob, run, "publish", envelope={"evidence": evidence}, lease_owner="bobs-script")
    as_bob.delete(f"/api/v1/runs/{run.id}/lease?owner=bobs-script")
    run = _work(run)
    assert service.stats()["publications"] == 0
    assert not ExternalOperation.objects.filter(run=run, status="confirmed").exists()
    assert run.status == RunStatus.FAILED and "approv" in run.status_reason


# --- four eyes, in every path ------------------------------------------------------------
def _involved(involvement: str, acme, alice, bob, api_as):  # noqa: ANN001, ANN202
    """A run at review with a request bob raised, in which alice is involved as named."""
    starter = Actor(user=alice) if involvement == "started" else Actor.system("test runner")
    run = run_create(
        tenant=acme, workflow_type="research", inputs={}, execution="external", actor=starter
    )
    if involvement == "uploaded":
        stored = api_as(alice, acme).generic(
            "POST",
            "/api/v1/artifacts",
            DRAFT.encode(),
            content_type="text/markdown",
            HTTP_X_ARTIFACT_KIND="draft",
        )
        assert stored.status_code in (200, 201), stored.content
    artifact = draft(acme)
    if involvement == "committed":
        committed = _commit(
            api_as(alice, acme), run, "draft_answer", envelope={"evidence": _evidence(artifact)}
        )
        assert committed.status_code == 201, committed.json()
    run = at_review(run, artifact)
    asker = alice if involvement == "requested" else bob
    return run, ask(run, artifact, asker)


@pytest.mark.parametrize("involvement", ["started", "requested", "uploaded", "committed"])
def test_four_eyes_refuses_whoever_started_asked_uploaded_or_committed_in_every_path(
    involvement, acme, alice, bob, carol, workflow, api_as
):  # noqa: ANN001
    from django.test import Client

    run, request = _involved(involvement, acme, alice, bob, api_as)
    body = {"decision": "approve", "artifact_sha256": request.artifact_sha256, "comment": "ok"}
    api = api_as(alice, acme)
    answer = api.post(f"/api/v1/approvals/{request.pk}/decision", body, format="json")
    assert answer.status_code == 409, answer.json()
    assert answer.json()["code"] == "self_approval_forbidden"
    # The review page refuses with the same code and sentence, and says why before that.
    page = Client()
    page.force_login(alice)
    shown = page.get(f"/approvals/{request.pk}/")
    assert "someone else has to decide it" in shown.text
    refused = page.post(f"/approvals/{request.pk}/decision", body)
    assert refused.status_code == 409 and refused.context["refusal_code"] == answer.json()["code"]
    # Alice's queue does not offer what she could only be refused on; carol's does.
    queue = api.get("/api/v1/approvals?status=pending").json()["results"]
    assert str(request.pk) not in [r["id"] for r in queue]
    theirs = api_as(carol, acme).get("/api/v1/approvals?status=pending").json()["results"]
    assert str(request.pk) in [r["id"] for r in theirs]
    request.refresh_from_db()
    assert request.status == ApprovalStatus.PENDING and not request.decisions.exists()
    approved = api_as(carol, acme).post(
        f"/api/v1/approvals/{request.pk}/decision", body, format="json"
    )
    assert approved.status_code == 200, approved.json()


def test_a_request_the_runtime_raises_is_attributed_to_the_starter_who_may_not_decide_it(
    gated, service, acme, alice, carol, api_as
):  # noqa: ANN001
    run = _work(_worker_run(acme, alice))
    request = ApprovalRequest.objects.get(run=run, status=ApprovalStatus.PENDING)
    assert request.requester == alice
    body = {"decision": "approve", "artifact_sha256": request.artifact_sha256, "comment": "me"}
    answer = api_as(alice, acme).post(
        f"/api/v1/approvals/{request.pk}/decision", body, format="json"
    )
    assert (answer.status_code, answer.json()["code"]) == (409, "self_approval_forbidden")


# --- the audit of stored history ---------------------------------------------------------
def test_the_audit_command_lists_the_runs_that_crossed_an_approval_unapproved(
    run, acme, bob, workflow
):  # noqa: ANN001
    from io import StringIO

    from django.core.management import CommandError, call_command

    clean = run_create(
        tenant=acme,
        workflow_type="research",
        inputs={},
        execution="external",
        actor=Actor(user=bob),
    )
    at_review(clean, draft(acme, DRAFT + "\nclean\n"))
    run = at_review(run, draft(acme))
    crossing = _crossed_unapproved(run)
    out = StringIO()
    with pytest.raises(CommandError, match="1 run"):
        call_command("approvals_audit", stdout=out)
    text = out.getvalue()
    assert str(run.pk) in text and f"checkpoint {crossing.sequence}" in text
    assert str(clean.pk) not in text
    out = StringIO()
    call_command("approvals_audit", "--tenant", "globex-nobody", stdout=out)
    assert "No run breaks the approval invariant" in out.getvalue()


def test_the_run_page_says_which_approval_lets_the_run_pass_and_why_not(run, bob, carol, acme):  # noqa: ANN001
    from django.test import Client

    artifact = draft(acme)
    run = at_review(run, artifact)
    page = Client()
    page.force_login(bob)
    decide(ask(run, artifact, bob, action="delete_everything"), carol)
    shown = page.get(f"/runs/{run.pk}/").text
    assert "cannot leave review yet" in shown and "delete_everything" in shown
    request = ask(run, artifact, bob)  # publish, the action review declares
    decide(request, carol)
    shown = page.get(f"/runs/{run.pk}/").text
    assert f'Approval request <span class="mono">{request.pk}</span> lets the run leave' in shown


def test_four_eyes_follows_a_fork_back_to_whoever_started_its_source(
    gated, service, acme, alice, bob, carol, api_as
):  # noqa: ANN001
    """Found by the state machine: bob forks alice's run; the fork's request (raised in
    bob's name) is still alice's work, through any number of forks."""
    from runtime.services.forks import run_fork

    source = _work(_worker_run(acme, alice))
    fork = source
    for _ in range(3):
        fork = run_fork(
            tenant=acme,
            run_id=fork.pk,
            from_sequence=1,
            reason="again",
            actor=Actor(user=bob),
        ).run
    fork = _work(fork)
    request = ApprovalRequest.objects.get(run=fork, status=ApprovalStatus.PENDING)
    assert request.requester == bob
    body = {"decision": "approve", "artifact_sha256": request.artifact_sha256, "comment": "x"}
    answer = api_as(alice, acme).post(
        f"/api/v1/approvals/{request.pk}/decision", body, format="json"
    )
    assert (answer.status_code, answer.json()["code"]) == (409, "self_approval_forbidden")
    assert "forked from" in answer.json()["detail"]
    queue = api_as(alice, acme).get("/api/v1/approvals?status=pending").json()["results"]
    assert str(request.pk) not in [r["id"] for r in queue]
    approved = api_as(carol, acme).post(
        f"/api/v1/approvals/{request.pk}/decision", body, format="json"
    )
    assert approved.status_code == 200, approved.json()
