"""Who may decide (issue 27, item 1): an approval state declares its reviewers (a role, or a
reviewer group an admin manages) and a quorum of distinct reviewers. The queue shows each
reviewer only what they may decide; deciding anything else is refused with 403 and a
sentence; the review page shows quorum progress; any rejection rejects; groups are per
tenant and every change to them is audited."""

from __future__ import annotations

import copy
import json

import pytest
from django.test import Client

from approvals.models import ApprovalDecision, ApprovalStatus
from approvals.selectors import review_queue
from approvals.services.evidence import run_evidence_export
from approvals.services.standing import quorum_progress
from cairn.errors import InvalidDefinition, ReviewNotAllowed
from checkpoints.services.workflows import workflow_register
from runtime.services.runs import run_create
from tenants.models import AuditEvent
from tenants.reviewer_groups import reviewer_group_create, reviewer_group_member_add
from tenants.services import Actor, member_set_role
from tests.approvals_support import ask, at_review, decide, draft
from tests.factories import SIMPLE_DEFINITION, UserFactory

pytestmark = pytest.mark.django_db


def _member(username: str, tenant, role: str):  # noqa: ANN001, ANN202
    user = UserFactory(username=username)
    member_set_role(tenant=tenant, user=user, role=role, actor=Actor.system("test"))
    return user


def definition_with(review: dict) -> dict:
    definition = copy.deepcopy(SIMPLE_DEFINITION)
    definition["approvals"] = {"review": {"action": "publish", **review}}
    return definition


@pytest.fixture
def rita(acme):  # noqa: ANN001
    return _member("rita", acme, "reviewer")


@pytest.fixture
def sam(acme):  # noqa: ANN001
    return _member("sam", acme, "reviewer")


@pytest.fixture
def legal(acme, alice, rita, sam):  # noqa: ANN001
    """acme's reviewer group 'legal': rita and sam (carol, also a reviewer, is not in it)."""
    admin = Actor(user=alice)
    group = reviewer_group_create(tenant=acme, name="legal", actor=admin)
    for user in (rita, sam):
        reviewer_group_member_add(tenant=acme, name="legal", username=user.username, actor=admin)
    return group


def _run(acme, bob, review: dict, workflow_type: str = "legal-review"):  # noqa: ANN001, ANN202
    workflow_register(
        tenant=acme, workflow_type=workflow_type, version="1", definition=definition_with(review)
    )
    return run_create(
        tenant=acme,
        workflow_type=workflow_type,
        inputs={},
        execution="external",
        actor=Actor(user=bob),
    )


@pytest.fixture
def pending(acme, bob, legal):  # noqa: ANN001
    """A request at a state whose reviewers are the group 'legal', quorum 2."""
    artifact = draft(acme)
    run = at_review(_run(acme, bob, {"reviewers": {"group": "legal"}, "quorum": 2}), artifact)
    return ask(run, artifact, bob)


def signed_in(user) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(user)
    return client


# --- the declaration -------------------------------------------------------------------------
def test_an_approval_state_declares_its_reviewers_and_quorum(acme):  # noqa: ANN001
    row, _ = workflow_register(
        tenant=acme,
        workflow_type="declared",
        version="1",
        definition=definition_with({"reviewers": {"group": "legal"}, "quorum": 2}),
    )
    assert row.definition["approvals"]["review"] == {
        "action": "publish",
        "reviewers": {"group": "legal"},
        "quorum": 2,
    }


@pytest.mark.parametrize(
    "review, field",
    [
        ({"reviewers": {"group": "legal", "role": "admin"}}, "approvals.review.reviewers"),
        ({"reviewers": {"role": "operator"}}, "approvals.review.reviewers"),
        ({"reviewers": {"group": "Not a name!"}}, "approvals.review.reviewers"),
        ({"reviewers": "legal"}, "approvals.review.reviewers"),
        ({"quorum": 0}, "approvals.review.quorum"),
        ({"quorum": 21}, "approvals.review.quorum"),
        ({"quorum": True}, "approvals.review.quorum"),
    ],
)
def test_a_bad_reviewer_declaration_is_refused_with_its_field(acme, review, field):  # noqa: ANN001
    with pytest.raises(InvalidDefinition) as raised:
        workflow_register(
            tenant=acme, workflow_type="bad", version="1", definition=definition_with(review)
        )
    assert field in raised.value.fields


def test_a_python_workflow_declares_reviewers_and_quorum():
    from runtime import Workflow

    wf = Workflow("declared-py", version="1", register=False)

    @wf.step("draft", next="review")
    def write(ctx):  # noqa: ANN001, ANN202
        return {}

    wf.approval("review", next="done", reviewers={"group": "legal"}, quorum=2)
    wf.terminal("done")
    declared = wf.definition()["approvals"]["review"]
    assert declared["reviewers"] == {"group": "legal"} and declared["quorum"] == 2


def test_a_request_at_the_state_carries_its_reviewers_and_quorum(pending):  # noqa: ANN001
    assert pending.reviewer_group == "legal"
    assert pending.reviewer_role == ""
    assert pending.required_approvals == 2


def test_a_larger_quorum_asked_for_is_kept(acme, bob, legal):  # noqa: ANN001
    artifact = draft(acme)
    run = at_review(_run(acme, bob, {"reviewers": {"group": "legal"}, "quorum": 2}), artifact)
    assert ask(run, artifact, bob, required_approvals=3).required_approvals == 3


# --- the queue and the refusal ---------------------------------------------------------------
def test_the_queue_shows_each_reviewer_only_what_they_may_decide(pending, acme, rita, sam, carol):  # noqa: ANN001
    assert [r.pk for r in review_queue(tenant=acme, user=rita)] == [pending.pk]
    assert [r.pk for r in review_queue(tenant=acme, user=sam)] == [pending.pk]
    assert list(review_queue(tenant=acme, user=carol)) == []


def test_deciding_a_request_of_another_group_is_refused_and_audited(pending, carol):  # noqa: ANN001
    with pytest.raises(ReviewNotAllowed) as raised:
        decide(pending, carol)
    assert raised.value.status == 403
    assert "reviewer group 'legal'" in raised.value.detail
    assert "nothing was decided" in raised.value.detail
    assert not ApprovalDecision.objects.filter(request=pending).exists()
    refused = AuditEvent.objects.get(action="approval.decision_refused", target=str(pending.pk))
    assert refused.details["code"] == "permission_denied"


def test_the_api_queue_and_decision_follow_the_declared_reviewers(
    api_as, acme, pending, rita, carol
):  # noqa: ANN001
    as_carol, as_rita = api_as(carol, acme), api_as(rita, acme)
    assert as_carol.get("/api/v1/approvals").json()["results"] == []
    queued = as_rita.get("/api/v1/approvals").json()["results"]
    assert [r["id"] for r in queued] == [str(pending.pk)]
    assert queued[0]["reviewers"] == {"group": "legal", "role": None}
    body = {"decision": "approve", "artifact_sha256": pending.artifact_sha256, "comment": ""}
    refused = as_carol.post(f"/api/v1/approvals/{pending.pk}/decision", body, format="json")
    assert refused.status_code == 403
    assert refused.json()["code"] == "permission_denied"
    assert "reviewer group 'legal'" in refused.json()["detail"]
    assert (
        as_rita.post(f"/api/v1/approvals/{pending.pk}/decision", body, format="json").status_code
        == 200
    )


def test_a_group_that_does_not_exist_lets_nobody_decide(acme, bob, carol):  # noqa: ANN001
    artifact = draft(acme)
    run = at_review(_run(acme, bob, {"reviewers": {"group": "nobody-yet"}}), artifact)
    request = ask(run, artifact, bob)
    assert list(review_queue(tenant=acme, user=carol)) == []
    with pytest.raises(ReviewNotAllowed) as raised:
        decide(request, carol)
    assert "'nobody-yet'" in raised.value.detail


def test_a_role_declaration_admits_only_that_role(acme, bob, alice, carol):  # noqa: ANN001
    artifact = draft(acme)
    run = at_review(_run(acme, bob, {"reviewers": {"role": "admin"}}), artifact)
    request = ask(run, artifact, bob)
    assert list(review_queue(tenant=acme, user=carol)) == []
    assert [r.pk for r in review_queue(tenant=acme, user=alice)] == [request.pk]
    with pytest.raises(ReviewNotAllowed) as raised:
        decide(request, carol)
    assert "admin" in raised.value.detail
    decide(request, alice)
    request.refresh_from_db()
    assert request.status == ApprovalStatus.APPROVED


def test_without_a_declaration_every_reviewer_may_decide_as_before(run, acme, bob, carol):  # noqa: ANN001
    artifact = draft(acme)
    request = ask(at_review(run, artifact), artifact, bob)
    assert request.reviewer_group == "" and request.reviewer_role == ""
    assert [r.pk for r in review_queue(tenant=acme, user=carol)] == [request.pk]


# --- quorum -------------------------------------------------------------------------------
def test_the_quorum_needs_distinct_reviewers_and_shows_its_progress(pending, rita, sam):  # noqa: ANN001
    progress = quorum_progress(pending)
    assert (progress.approved, progress.required) == (0, 2)
    assert str(progress) == "0 of 2"
    decide(pending, rita)
    pending.refresh_from_db()
    assert pending.status == ApprovalStatus.PENDING
    progress = quorum_progress(pending)
    assert str(progress).startswith("1 of 2; rita approved at ")
    decide(pending, sam)
    pending.refresh_from_db()
    assert pending.status == ApprovalStatus.APPROVED
    assert str(quorum_progress(pending)).startswith("2 of 2; rita approved at ")


def test_any_rejection_rejects_whatever_the_approvals(pending, rita, sam):  # noqa: ANN001
    decide(pending, rita)
    decide(pending, sam, "reject", comment="The figures are wrong.")
    pending.refresh_from_db()
    assert pending.status == ApprovalStatus.REJECTED


def test_the_review_page_shows_quorum_progress_and_who_may_decide(pending, rita, carol):  # noqa: ANN001
    decide(pending, rita)
    page = signed_in(rita).get(f"/approvals/{pending.pk}/").content.decode()
    assert "1 of 2; rita approved at " in page
    page = signed_in(carol).get(f"/approvals/{pending.pk}/").content.decode()
    assert "reviewer group &#x27;legal&#x27;" in page
    assert 'value="approve"' not in page
    refused = signed_in(carol).post(
        f"/approvals/{pending.pk}/decision",
        {"decision": "approve", "artifact_sha256": pending.artifact_sha256, "comment": ""},
    )
    assert refused.status_code == 403
    assert "reviewer group &#x27;legal&#x27;" in refused.content.decode()


def test_the_console_queue_shows_only_what_the_reviewer_may_decide(pending, rita, carol):  # noqa: ANN001
    assert str(pending.pk) in signed_in(rita).get("/approvals/").content.decode()
    assert str(pending.pk) not in signed_in(carol).get("/approvals/").content.decode()


# --- groups: per tenant, audited, managed by admins in the API and the console ---------------
def test_an_admin_manages_a_group_through_the_api_and_each_change_is_audited(
    api_as, acme, alice, rita
):  # noqa: ANN001
    api = api_as(alice, acme)
    created = api.post("/api/v1/reviewer-groups", {"name": "legal"}, format="json")
    assert created.status_code == 201, created.content
    assert created.json() == {"name": "legal", "members": []}
    added = api.post("/api/v1/reviewer-groups/legal/members", {"username": "rita"}, format="json")
    assert added.status_code == 200 and added.json()["members"] == ["rita"]
    assert api.get("/api/v1/reviewer-groups").json()["results"] == [
        {"name": "legal", "members": ["rita"]}
    ]
    assert api.delete("/api/v1/reviewer-groups/legal/members/rita").status_code == 204
    assert api.delete("/api/v1/reviewer-groups/legal").status_code == 204
    actions = list(
        AuditEvent.objects.filter(tenant=acme, action__startswith="reviewer_group.")
        .order_by("id")
        .values_list("action", "target")
    )
    assert actions == [
        ("reviewer_group.created", "legal"),
        ("reviewer_group.member_added", "legal"),
        ("reviewer_group.member_removed", "legal"),
        ("reviewer_group.deleted", "legal"),
    ]


def test_group_input_mistakes_get_a_sentence(api_as, acme, alice, legal, charlie):  # noqa: ANN001
    api = api_as(alice, acme)
    bad = api.post("/api/v1/reviewer-groups", {"name": "Not a name!"}, format="json")
    assert bad.status_code == 400 and bad.json()["fields"]["name"]
    again = api.post("/api/v1/reviewer-groups", {"name": "legal"}, format="json")
    assert again.status_code == 409 and "already" in again.json()["detail"]
    # charlie is globex's admin, not a member of acme: he cannot be added to acme's group.
    outsider = api.post(
        "/api/v1/reviewer-groups/legal/members", {"username": "charlie"}, format="json"
    )
    assert outsider.status_code == 400 and "not a member of acme" in outsider.json()["detail"]
    assert api.get("/api/v1/reviewer-groups/nope").status_code == 404


def test_only_admins_manage_groups(api_as, acme, carol, bob, legal):  # noqa: ANN001
    for user in (carol, bob):
        assert api_as(user, acme).get("/api/v1/reviewer-groups").status_code == 403
        answer = api_as(user, acme).post("/api/v1/reviewer-groups", {"name": "mine"}, format="json")
        assert answer.status_code == 403


def test_groups_and_their_members_are_per_tenant(api_as, acme, globex, charlie, pending, carol):  # noqa: ANN001
    outsider = api_as(charlie, globex)
    assert outsider.get("/api/v1/reviewer-groups").json()["results"] == []
    assert outsider.get("/api/v1/reviewer-groups/legal").status_code == 404
    # globex's own 'legal' group, with a globex member, lets no one decide in acme.
    assert (
        outsider.post("/api/v1/reviewer-groups", {"name": "legal"}, format="json").status_code
        == 201
    )
    both = _member("carol-two", globex, "reviewer")
    _member_in(acme, both)
    outsider.post("/api/v1/reviewer-groups/legal/members", {"username": both.username})
    assert list(review_queue(tenant=acme, user=both)) == []
    with pytest.raises(ReviewNotAllowed):
        decide(pending, both)


def _member_in(tenant, user) -> None:  # noqa: ANN001
    member_set_role(tenant=tenant, user=user, role="reviewer", actor=Actor.system("test"))


def test_an_admin_manages_groups_in_the_console(acme, alice, rita):  # noqa: ANN001
    client = signed_in(alice)
    page = client.get("/members/groups/")
    assert page.status_code == 200
    client.post("/members/groups/create", {"name": "legal"})
    client.post("/members/groups/legal/members", {"username": "rita"})
    page = client.get("/members/groups/").content.decode()
    assert 'id="group-legal"' in page and "rita" in page
    refused = client.post("/members/groups/legal/members", {"username": "nobody"})
    assert refused.status_code == 400 and "not a member of acme" in refused.content.decode()
    client.post("/members/groups/legal/members/rita/remove")
    client.post("/members/groups/legal/delete")
    assert 'id="group-legal"' not in client.get("/members/groups/").content.decode()
    assert AuditEvent.objects.filter(action="reviewer_group.deleted", target="legal").exists()


def test_the_groups_page_is_for_admins_only(acme, carol, charlie, legal):  # noqa: ANN001
    assert signed_in(carol).get("/members/groups/").status_code == 403
    page = signed_in(charlie).get("/members/groups/")
    assert page.status_code == 200 and 'id="group-legal"' not in page.content.decode()


def test_a_request_the_worker_gate_raises_carries_the_declared_reviewers(acme, bob, legal):  # noqa: ANN001
    from approvals.services import approval_gate

    artifact = draft(acme)
    run = at_review(_run(acme, bob, {"reviewers": {"group": "legal"}, "quorum": 2}), artifact)
    verdict = approval_gate(
        run=run,
        action="publish",
        artifact_id=artifact.id,
        artifact_sha256=artifact.sha256,
        actor=Actor.system("gate"),
    )
    assert verdict.outcome == "waiting"
    assert verdict.request.reviewer_group == "legal"
    assert verdict.request.required_approvals == 2


def test_the_run_page_shows_who_decides_and_the_quorum(pending, alice, rita):  # noqa: ANN001
    decide(pending, rita)
    page = signed_in(alice).get(f"/runs/{pending.run_id}/").content.decode()
    assert "The reviewer group &#x27;legal&#x27;" in page
    assert "1 of 2; rita approved at " in page


def test_the_signed_evidence_names_who_could_decide(pending, rita, sam, alice):  # noqa: ANN001
    decide(pending, rita)
    decide(pending, sam)
    bundle = run_evidence_export(
        tenant=pending.tenant, run_id=pending.run_id, actor=Actor(user=alice)
    )
    payload = json.loads(bundle.data)["payload"]
    (approval,) = payload["approvals"]
    assert approval["reviewers"] == {"role": None, "group": "legal"}
    assert approval["required_approvals"] == 2
    assert sorted(d["reviewer"] for d in approval["decisions"]) == ["rita", "sam"]
