"""Approve with edits (issue 27, item 3): a reviewer fixes the draft instead of bouncing it.
The edited bytes become a new artifact (own sha256, the original's kind and media type,
derived from it, uploaded by the reviewer); the edit supersedes the request and raises one
bound to the edited hash in the same transaction, with the editor's approval as its first;
earlier approvals of the old hash do not carry over. The run continues with the edited
artifact: the worker's gate hands the run the edited artifact under the reviewed name, and an
externally driven run is told which artifact to ship."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest

from approvals.evidence_verify import load_public_key, verify
from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from approvals.port import restore_approval_outcome
from approvals.services import approval_decide, approval_gate
from approvals.services.evidence import run_evidence_export
from cairn.errors import (
    ApprovalHashMismatch,
    ApprovalStale,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    SecretInEnvelope,
    SelfApprovalForbidden,
)
from checkpoints.models import Artifact, ArtifactUpload, OutboxMessage
from checkpoints.services.artifacts import artifact_content
from tenants.models import AuditEvent
from tenants.services import Actor, member_set_role
from tests.approvals_support import (
    DRAFT,
    ask,
    at_review,
    decide,
    draft,
    legal_quorum_request,
    worker_run,
)
from tests.evidence_support import RUNNER, _commit
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

EDITED = DRAFT.replace("mark a route", "mark a route above the tree line")
SECRET = "sk-" + "proj-" + "a1B2c3D4e5F6g7H8i9J0kLmN"


def _member(username: str, tenant, role: str = "reviewer"):  # noqa: ANN001, ANN202
    user = UserFactory(username=username, email=f"{username}@example.org")
    member_set_role(tenant=tenant, user=user, role=role, actor=Actor.system("test"))
    return user


@pytest.fixture
def rita(acme):  # noqa: ANN001
    return _member("rita", acme)


@pytest.fixture
def sam(acme):  # noqa: ANN001
    return _member("sam", acme)


@pytest.fixture
def pending(acme, alice, bob, rita, sam):  # noqa: ANN001
    """A quorum-2 request for the group 'legal' (rita, sam) on an externally driven run."""
    return legal_quorum_request(acme, alice, bob, [rita, sam])


def edit(request: ApprovalRequest, user, text: str = EDITED, **kwargs) -> ApprovalDecision:  # noqa: ANN001
    return approval_decide(
        tenant=request.tenant,
        request_id=request.pk,
        decision="approve",
        artifact_sha256=kwargs.pop("sha", request.artifact_sha256),
        comment=kwargs.pop("comment", "Said where."),
        edited_text=text,
        actor=Actor(user=user),
    )


def test_an_edit_restarts_the_quorum_on_the_edited_hash(pending, rita, sam):  # noqa: ANN001
    decide(pending, sam)  # 1 of 2 on the original: it will not carry over
    decision = edit(pending, rita)

    old = ApprovalRequest.objects.get(pk=pending.pk)
    new = decision.request
    edited = Artifact.objects.get(pk=new.artifact_id)
    assert edited.sha256 == hashlib.sha256(EDITED.encode()).hexdigest()
    assert artifact_content(edited) == EDITED.encode()
    assert (edited.kind, edited.media_type) == (pending.artifact.kind, pending.artifact.media_type)
    assert ArtifactUpload.objects.filter(artifact=edited, uploaded_by=rita).exists()

    assert old.status == ApprovalStatus.SUPERSEDED
    assert str(new.pk) in old.status_reason and "rita" in old.status_reason
    assert new.previous_id == old.pk
    assert new.status == ApprovalStatus.PENDING
    assert (new.artifact_sha256, new.edited_from_id, new.edited_from_sha256) == (
        edited.sha256,
        pending.artifact_id,
        pending.artifact_sha256,
    )
    assert new.edited_by == rita
    assert (new.run_version, new.required_approvals) == (pending.run_version, 2)
    assert list(new.decisions.values_list("approver__username", "decision", "artifact_sha256")) == [
        ("rita", "approve", edited.sha256)
    ]
    event = AuditEvent.objects.get(action="approval.edited")
    assert event.details["from_sha256"] == pending.artifact_sha256
    assert event.details["to_sha256"] == edited.sha256

    # The old request takes no more decisions; the new one needs a second reviewer.
    with pytest.raises(ApprovalStale):
        decide(old, sam)
    with pytest.raises(SelfApprovalForbidden, match="You uploaded the artifact under review"):
        decide(new, rita)  # her approval of her edit is in; she wrote those bytes
    decide(new, sam)
    new.refresh_from_db()
    assert new.status == ApprovalStatus.APPROVED
    # The runner is told which artifact to ship: the edited one.
    message = OutboxMessage.objects.get(kind="approval.decided")
    assert message.payload["artifact_id"] == str(edited.pk)
    assert message.payload["artifact_sha256"] == edited.sha256
    assert message.payload["edited_from_sha256"] == pending.artifact_sha256


def test_a_quorum_of_one_is_approved_by_the_edit(acme, bob, carol):  # noqa: ANN001
    run = worker_run(acme, bob)
    artifact = draft(acme)
    request = ask(at_review(run, artifact), artifact, bob)
    decision = edit(request, carol)
    assert decision.request.status == ApprovalStatus.APPROVED
    assert OutboxMessage.objects.filter(kind="run.resume", payload__run_id=str(run.pk)).exists()


def test_the_gate_hands_the_run_the_edited_artifact(acme, bob, carol):  # noqa: ANN001
    run = worker_run(acme, bob)
    artifact = draft(acme)
    request = ask(at_review(run, artifact), artifact, bob)
    new = edit(request, carol).request
    run.refresh_from_db()
    # The run's evidence still names the original draft: the gate finds the edit's approval.
    verdict = approval_gate(
        run=run,
        action="publish",
        artifact_id=artifact.pk,
        artifact_sha256=artifact.sha256,
        actor=Actor.system("approval gate"),
    )
    assert verdict.outcome == "approved" and verdict.request.pk == new.pk
    envelope = {
        "evidence": {
            "artifacts": [
                {
                    "id": str(artifact.pk),
                    "sha256": artifact.sha256,
                    "name": "draft",
                    "kind": "draft",
                }
            ]
        }
    }
    spec = SimpleNamespace(state="review", action="publish", artifact="draft")
    outcome = restore_approval_outcome(run=run, spec=spec, envelope=envelope)
    assert outcome.decision == "approved"
    assert outcome.evidence["artifacts"] == [
        {
            "id": str(new.artifact_id),
            "sha256": new.artifact_sha256,
            "name": "draft",
            "kind": "draft",
        }
    ]


def test_a_pending_edit_keeps_the_gate_waiting_on_it(pending, rita):  # noqa: ANN001
    new = edit(pending, rita).request
    run = pending.run
    run.refresh_from_db()
    verdict = approval_gate(
        run=run,
        action="publish",
        artifact_id=pending.artifact_id,
        artifact_sha256=pending.artifact_sha256,
        actor=Actor.system("approval gate"),
    )
    assert verdict.outcome == "waiting" and verdict.request.pk == new.pk
    assert ApprovalRequest.objects.filter(run=run).count() == 2  # nothing raised anew


# --- refusals ---------------------------------------------------------------------------------
def _unchanged(request: ApprovalRequest) -> None:
    request.refresh_from_db()
    assert request.status == ApprovalStatus.PENDING
    assert ApprovalRequest.objects.filter(run=request.run).count() == 1
    assert not Artifact.objects.filter(sha256=hashlib.sha256(EDITED.encode()).hexdigest()).exists()


def test_an_edit_that_changes_nothing_is_refused(pending, rita):  # noqa: ANN001
    with pytest.raises(InvalidRequest, match="changes nothing"):
        edit(pending, rita, DRAFT)
    _unchanged(pending)


def test_an_edit_of_a_stale_hash_is_refused(pending, rita):  # noqa: ANN001
    with pytest.raises(ApprovalHashMismatch):
        edit(pending, rita, sha="0" * 64)
    _unchanged(pending)


def test_an_oversized_edit_is_refused(pending, rita, settings):  # noqa: ANN001
    settings.CAIRN_MAX_ARTIFACT_BYTES = len(EDITED) - 1
    with pytest.raises(PayloadTooLarge):
        edit(pending, rita)
    _unchanged(pending)


def test_a_credential_in_the_edit_is_refused(pending, rita):  # noqa: ANN001
    with pytest.raises(SecretInEnvelope):
        edit(pending, rita, EDITED + f"\nkey: {SECRET}\n")
    pending.refresh_from_db()
    assert pending.status == ApprovalStatus.PENDING
    assert ApprovalRequest.objects.filter(run=pending.run).count() == 1


def test_a_reject_with_an_edit_is_refused(pending, rita):  # noqa: ANN001
    with pytest.raises(InvalidRequest):
        approval_decide(
            tenant=pending.tenant,
            request_id=pending.pk,
            decision="reject",
            artifact_sha256=pending.artifact_sha256,
            comment="no",
            edited_text=EDITED,
            actor=Actor(user=rita),
        )
    _unchanged(pending)


def test_the_runs_starter_may_not_edit_it(acme, bob, carol):  # noqa: ANN001
    member_set_role(tenant=acme, user=bob, role="admin", actor=Actor.system("test"))
    run = worker_run(acme, bob)
    artifact = draft(acme)
    request = ask(at_review(run, artifact), artifact, carol)
    with pytest.raises(SelfApprovalForbidden):
        edit(request, bob)
    _unchanged(request)


def test_another_tenants_request_cannot_be_edited(pending, globex, charlie):  # noqa: ANN001
    with pytest.raises(NotFound):
        approval_decide(
            tenant=globex,
            request_id=pending.pk,
            decision="approve",
            artifact_sha256=pending.artifact_sha256,
            edited_text=EDITED,
            actor=Actor(user=charlie),
        )
    _unchanged(pending)


# --- the API ---------------------------------------------------------------------------------
def test_the_api_approves_with_an_edit(api_as, pending, rita):  # noqa: ANN001
    body = {
        "decision": "approve",
        "artifact_sha256": pending.artifact_sha256,
        "edited_text": EDITED,
        "comment": "Said where.",
    }
    answer = api_as(rita, pending.tenant).post(
        f"/api/v1/approvals/{pending.pk}/decision", body, format="json"
    )
    assert answer.status_code == 200, answer.content
    data = answer.json()
    new = ApprovalRequest.objects.get(edited_from_sha256=pending.artifact_sha256)
    assert data["request"]["id"] == str(new.pk)
    assert data["request"]["previous_request_id"] == str(pending.pk)
    assert data["request"]["artifact_sha256"] == hashlib.sha256(EDITED.encode()).hexdigest()
    assert data["request"]["edited_from"] == {
        "artifact_id": str(pending.artifact_id),
        "artifact_sha256": pending.artifact_sha256,
        "edited_by": "rita",
    }
    assert data["request"]["quorum"]["approved"] == 1
    assert data["decision"]["artifact_sha256"] == new.artifact_sha256


@pytest.mark.parametrize(
    ("text", "status", "code"),
    [
        (DRAFT, 400, "invalid_request"),
        (EDITED + f"\n{SECRET}\n", 422, "secret_in_envelope"),
    ],
)
def test_the_api_refuses_bad_edits(api_as, pending, rita, text, status, code):  # noqa: ANN001
    body = {"decision": "approve", "artifact_sha256": pending.artifact_sha256, "edited_text": text}
    answer = api_as(rita, pending.tenant).post(
        f"/api/v1/approvals/{pending.pk}/decision", body, format="json"
    )
    assert answer.status_code == status, answer.content
    assert answer.json()["code"] == code
    _unchanged(pending)


def test_the_api_refuses_an_edit_of_another_tenants_request(api_as, pending, charlie, globex):  # noqa: ANN001
    body = {
        "decision": "approve",
        "artifact_sha256": pending.artifact_sha256,
        "edited_text": EDITED,
    }
    answer = api_as(charlie, globex).post(
        f"/api/v1/approvals/{pending.pk}/decision", body, format="json"
    )
    assert answer.status_code == 404
    _unchanged(pending)


# --- evidence ----------------------------------------------------------------------------------
def test_the_evidence_shows_both_hashes_and_the_diff_and_verifies(
    pending, rita, sam, bob, settings, tmp_path
):  # noqa: ANN001
    settings.CAIRN_EVIDENCE_KEY_FILE = tmp_path / "evidence_signing_key.pem"
    settings.CAIRN_EVIDENCE_KEY_GENERATE = True
    new = edit(pending, rita).request
    decide(new, sam)
    run = pending.run
    edited = Artifact.objects.get(pk=new.artifact_id)
    shipped = {
        "artifacts": [{"id": str(edited.id), "sha256": edited.sha256, "name": "draft"}],
        "validators": [],
    }
    _commit(run, "publish", {"evidence": shipped})
    bundle = run_evidence_export(tenant=run.tenant, run_id=run.pk, actor=Actor(user=bob))
    from approvals.signing import evidence_signing_key

    key = load_public_key(evidence_signing_key().public_pem)
    assert verify(bundle.data, key) == []
    import json

    approvals = json.loads(bundle.data)["payload"]["approvals"]
    (entry,) = [a for a in approvals if a["id"] == str(new.pk)]
    assert entry["artifact_sha256"] == edited.sha256
    assert entry["edited_from"]["artifact_sha256"] == pending.artifact_sha256
    assert entry["edited_from"]["edited_by"] == "rita"
    assert "+- above the tree line" not in entry["edited_from"]["diff"]
    assert (
        "+Hikers build cairns to mark a route above the tree line." in entry["edited_from"]["diff"]
    )
    data = bytearray(bundle.data)
    data[len(data) // 2] ^= 0x01
    assert verify(bytes(data), key) != []
    assert RUNNER  # the runner that shipped it


# --- the review page ---------------------------------------------------------------------------
def _console(user):  # noqa: ANN001, ANN202
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


def _post_edit(client, request: ApprovalRequest, text: str):  # noqa: ANN001, ANN202
    return client.post(
        f"/approvals/{request.pk}/decision",
        {
            "decision": "approve",
            "artifact_sha256": request.artifact_sha256,
            "line_endings": "lf",
            # As a browser sends a textarea: CRLF line ends.
            "edited_text": text.replace("\n", "\r\n"),
            "comment": "",
        },
    )


def test_the_review_page_offers_the_text_and_shows_the_restarted_quorum(pending, rita):  # noqa: ANN001
    client = _console(rita)
    page = client.get(f"/approvals/{pending.pk}/").content.decode()
    assert 'id="approve-with-edits"' in page and 'name="edited_text"' in page
    assert "Hikers build cairns to mark a route." in page

    answer = _post_edit(client, pending, EDITED)
    new = ApprovalRequest.objects.get(edited_from_sha256=pending.artifact_sha256)
    assert answer.status_code == 302 and answer["Location"] == f"/approvals/{new.pk}/"
    assert artifact_content(new.artifact) == EDITED.encode()  # LF, as the draft had
    page = client.get(answer["Location"]).content.decode()
    assert 'data-approved="1" data-required="2"' in page
    assert "1 of 2; rita approved at" in page
    assert pending.artifact_sha256 in page and new.artifact_sha256 in page  # both hashes
    assert "+Hikers build cairns to mark a route above the tree line." in page  # the diff
    assert "your approval of the edit is recorded" in page
    assert 'id="approve-with-edits"' not in page  # she decided: no form


def test_the_review_page_refuses_an_edit_that_changes_nothing(pending, rita):  # noqa: ANN001
    answer = _post_edit(_console(rita), pending, DRAFT)
    assert answer.status_code == 400
    assert "The edit changes nothing" in answer.content.decode()
    _unchanged(pending)


def test_an_external_run_must_ship_the_edited_artifact(pending, rita, sam):  # noqa: ANN001
    from cairn.errors import ApprovalHashMismatch as Mismatch

    new = edit(pending, rita).request
    decide(new, sam)
    run = pending.run
    original, edited = pending.artifact, Artifact.objects.get(pk=new.artifact_id)

    def leave(artifact: Artifact) -> None:
        evidence = {
            "artifacts": [{"id": str(artifact.id), "sha256": artifact.sha256, "name": "draft"}],
            "validators": [],
        }
        _commit(run, "publish", {"evidence": evidence})

    with pytest.raises(Mismatch, match="no longer names"):
        leave(original)  # the draft the reviewers did not approve
    leave(edited)
    run.refresh_from_db()
    new.refresh_from_db()
    assert (run.state, new.status) == ("publish", ApprovalStatus.CONSUMED)
