"""Delegation (issue 27, item 2, second half): a reviewer lets another reviewer decide in
their place for a period. Audited, shown on both queues, the delegate's decision is the
delegator's one vote, and it never lets anyone approve their own run."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalStatus, Delegation
from approvals.selectors import review_queue
from approvals.services.delegations import delegation_create, delegation_revoke
from approvals.services.standing import quorum_progress
from cairn.errors import AlreadyDecided, InvalidRequest, ReviewNotAllowed
from tenants.models import AuditEvent
from tenants.reviewer_groups import reviewer_group_create, reviewer_group_member_add
from tenants.services import Actor, member_set_role
from tests.approvals_support import decide, legal_request
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def _member(username: str, tenant, role: str):  # noqa: ANN001, ANN202
    user = UserFactory(username=username)
    member_set_role(tenant=tenant, user=user, role=role, actor=Actor.system("test"))
    return user


@pytest.fixture
def rita(acme):  # noqa: ANN001
    return _member("rita", acme, "reviewer")


@pytest.fixture
def sam(acme):  # noqa: ANN001
    return _member("sam", acme, "reviewer")


@pytest.fixture
def legal(acme, alice, rita, sam):  # noqa: ANN001
    admin = Actor(user=alice)
    reviewer_group_create(tenant=acme, name="legal", actor=admin)
    for user in (rita, sam):
        reviewer_group_member_add(tenant=acme, name="legal", username=user.username, actor=admin)


@pytest.fixture
def pending(acme, bob, legal):  # noqa: ANN001
    return legal_request(acme, bob, bob)


def delegate(tenant, frm, to, days: float = 1):  # noqa: ANN001, ANN201
    return delegation_create(
        tenant=tenant,
        delegate_username=to.username,
        ends_at=timezone.now() + timedelta(days=days),
        reason="on holiday",
        actor=Actor(user=frm),
    )


def test_a_delegate_decides_what_the_delegator_may_as_their_one_vote(
    acme, pending, rita, sam, carol
):  # noqa: ANN001
    assert list(review_queue(tenant=acme, user=carol)) == []
    delegate(acme, rita, carol)
    assert [r.pk for r in review_queue(tenant=acme, user=carol)] == [pending.pk]
    decide(pending, carol)
    row = ApprovalDecision.objects.get(request=pending)
    assert (row.approver, row.on_behalf_of) == (carol, rita)
    progress = quorum_progress(pending)
    assert progress.approved == 1 and "carol (for rita) approved at" in str(progress)
    # rita's vote is in: she cannot add a second one, and rita's queue no longer shows it.
    with pytest.raises(AlreadyDecided):
        decide(pending, rita)
    assert list(review_queue(tenant=acme, user=rita)) == []
    decide(pending, sam)
    pending.refresh_from_db()
    assert pending.status == ApprovalStatus.APPROVED


def test_a_delegation_never_approves_the_delegators_own_run(acme, legal, rita, carol, alice):  # noqa: ANN001
    # rita started the run (four eyes keeps it from her), then delegated to carol.
    request = legal_request(acme, rita, alice)
    delegate(acme, rita, carol)
    assert list(review_queue(tenant=acme, user=carol)) == []
    with pytest.raises(ReviewNotAllowed):
        decide(request, carol)


def test_an_ended_or_revoked_delegation_lets_no_one_decide(acme, pending, rita, carol):  # noqa: ANN001
    given = delegate(acme, rita, carol)
    Delegation.objects.filter(pk=given.pk).update(ends_at=timezone.now() - timedelta(seconds=1))
    assert list(review_queue(tenant=acme, user=carol)) == []
    again = delegate(acme, rita, carol)
    delegation_revoke(tenant=acme, delegation_id=again.pk, actor=Actor(user=rita))
    assert list(review_queue(tenant=acme, user=carol)) == []
    with pytest.raises(ReviewNotAllowed):
        decide(pending, carol)
    actions = list(
        AuditEvent.objects.filter(action__startswith="delegation.")
        .order_by("id")
        .values_list("action", flat=True)
    )
    assert actions == ["delegation.created", "delegation.created", "delegation.revoked"]


def test_a_delegation_needs_a_reviewer_of_the_tenant_and_a_sensible_period(
    acme, rita, bob, charlie
):  # noqa: ANN001
    for to, days in ((bob, 1), (charlie, 1), (rita, 1)):  # an operator, an outsider, herself
        with pytest.raises(InvalidRequest) as raised:
            delegate(acme, rita, to, days)
        assert raised.value.fields["delegate"]
    with pytest.raises(InvalidRequest) as raised:
        delegate(acme, rita, _member("tess", acme, "reviewer"), 91)
    assert "90 days" in raised.value.fields["ends_at"]
    with pytest.raises(ReviewNotAllowed):
        delegate(acme, bob, rita)


def test_delegations_through_the_api(api_as, acme, pending, rita, carol, globex, charlie):  # noqa: ANN001
    as_rita, as_carol = api_as(rita, acme), api_as(carol, acme)
    ends = (timezone.now() + timedelta(days=2)).isoformat()
    made = as_rita.post(
        "/api/v1/account/delegations",
        {"delegate": "carol", "ends_at": ends, "reason": "holiday"},
        format="json",
    )
    assert made.status_code == 201, made.content
    body = made.json()
    assert (body["delegator"], body["delegate"]) == ("rita", "carol")
    # Shown on both sides.
    assert [d["id"] for d in as_carol.get("/api/v1/account/delegations").json()["results"]] == [
        body["id"]
    ]
    assert len(as_rita.get("/api/v1/account/delegations").json()["results"]) == 1
    queued = as_carol.get("/api/v1/approvals").json()["results"]
    assert [r["id"] for r in queued] == [str(pending.pk)]
    answer = as_carol.post(
        f"/api/v1/approvals/{pending.pk}/decision",
        {"decision": "approve", "artifact_sha256": pending.artifact_sha256},
        format="json",
    )
    assert answer.status_code == 200
    assert answer.json()["decision"]["on_behalf_of"] == "rita"
    bad = as_rita.post(
        "/api/v1/account/delegations", {"delegate": "nobody", "ends_at": ends}, format="json"
    )
    assert bad.status_code == 400 and bad.json()["fields"]["delegate"]
    outsider = api_as(charlie, globex)
    assert outsider.delete(f"/api/v1/account/delegations/{body['id']}").status_code == 404
    ended = as_carol.delete(f"/api/v1/account/delegations/{body['id']}")
    assert ended.status_code == 200 and ended.json()["revoked_at"]


def test_delegations_in_the_console_show_on_both_queues(acme, pending, rita, carol):  # noqa: ANN001
    as_rita, as_carol = Client(), Client()
    as_rita.force_login(rita)
    as_carol.force_login(carol)
    ends = (timezone.now() + timedelta(days=1)).strftime("%Y-%m-%d %H:%M")
    made = as_rita.post(
        "/approvals/delegations/", {"delegate": "carol", "ends_at": ends, "reason": "away"}
    )
    assert made.status_code == 302
    assert "You delegated your reviews to carol" in as_rita.get("/approvals/").content.decode()
    inbox = as_carol.get("/approvals/").content.decode()
    assert "You decide for rita" in inbox and str(pending.pk) in inbox
    refused = as_rita.post("/approvals/delegations/", {"delegate": "rita", "ends_at": ends})
    assert refused.status_code == 400
    (row,) = Delegation.objects.all()
    assert as_carol.post(f"/approvals/delegations/{row.pk}/end").status_code == 302
    assert str(pending.pk) not in as_carol.get("/approvals/").content.decode()
