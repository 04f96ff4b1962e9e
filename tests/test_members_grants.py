"""Per-run grants: a reviewer of one run sees that run's approvals and the artifact under
review, and nothing else of the tenant, in the console and the API alike."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from approvals.models import ApprovalDecision
from runtime.services.runs import run_create
from tenants import roles
from tenants.grants import run_grant_create, run_grant_revoke, run_grant_to_member
from tenants.models import AuditEvent, RunGrant
from tenants.selectors import tenants_of
from tenants.services import Actor, member_set_role, permissions_of
from tests.approvals_support import ask, at_review, draft
from tests.factories import UserFactory


def another_run(acme, bob):  # noqa: ANN001, ANN201
    """A second run of the tenant, besides the ``run`` fixture's."""
    return run_create(
        tenant=acme,
        workflow_type="research",
        inputs={"question": "and this?"},
        execution="external",
        actor=Actor(user=bob),
    )


@pytest.fixture
def two_requests(acme, bob, run, workflow):  # noqa: ANN001
    """Run A (granted) and run B (not), each waiting for approval of its own draft."""
    other = another_run(acme, bob)
    drafts = draft(acme, "draft of A\n"), draft(acme, "draft of B\n")
    requests = []
    for each, artifact in zip((run, other), drafts, strict=True):
        requests.append(ask(at_review(each, artifact), artifact, bob))
    return requests


@pytest.fixture
def dave(acme, alice, run):  # noqa: ANN001
    """An outside reviewer: no role in acme, one run grant."""
    user = UserFactory(username="dave")
    run_grant_create(tenant=acme, run_id=run.pk, user=user, actor=Actor(user=alice))
    return user


@pytest.fixture
def dave_api(api_as, dave, acme):  # noqa: ANN001
    return api_as(dave, acme)


@pytest.fixture
def dave_web(dave) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(dave)
    return client


def test_a_grant_is_a_way_into_the_tenant_but_no_role(dave, acme):  # noqa: ANN001
    assert list(tenants_of(dave)) == [acme]
    assert permissions_of(user=dave, tenant=acme) == {roles.REVIEW_RUN}
    assert roles.role_of(permissions_of(user=dave, tenant=acme)) is None


def test_the_api_queue_and_lists_show_only_the_granted_runs_requests(dave_api, two_requests):  # noqa: ANN001
    granted, other = two_requests
    for query in ("", "?status=pending"):
        ids = [row["id"] for row in dave_api.get(f"/api/v1/approvals{query}").json()["results"]]
        assert ids == [str(granted.pk)]
    assert dave_api.get(f"/api/v1/approvals/{granted.pk}").status_code == 200
    assert dave_api.get(f"/api/v1/approvals/{other.pk}").status_code == 404


def test_the_artifact_under_review_is_readable_only_for_the_granted_run(
    dave_api, dave, acme, two_requests
):  # noqa: ANN001
    granted, other = two_requests
    response = dave_api.get(f"/api/v1/approvals/{granted.pk}/artifact")
    assert response.status_code == 200
    assert response.content == b"draft of A\n"
    assert AuditEvent.objects.filter(tenant=acme, actor=dave, action="artifact.read").count() == 1
    assert dave_api.get(f"/api/v1/approvals/{other.pk}/artifact").status_code == 404
    # The general artifact endpoints and the runs stay operator-only.
    assert dave_api.get(f"/api/v1/artifacts/{other.artifact_id}/content").status_code == 403
    assert dave_api.get(f"/api/v1/artifacts/{granted.artifact_id}/content").status_code == 403
    assert dave_api.get(f"/api/v1/runs/{granted.run_id}").status_code == 403
    assert dave_api.get("/api/v1/runs").status_code == 403
    assert AuditEvent.objects.filter(tenant=acme, actor=dave, action="artifact.read").count() == 1


def test_a_decision_on_another_runs_request_is_not_found_and_nothing_is_decided(
    dave_api, two_requests
):  # noqa: ANN001
    granted, other = two_requests
    body = {"decision": "approve", "artifact_sha256": other.artifact_sha256}
    assert (
        dave_api.post(f"/api/v1/approvals/{other.pk}/decision", body, format="json").status_code
        == 404
    )
    assert not ApprovalDecision.objects.filter(request=other).exists()
    body = {"decision": "approve", "artifact_sha256": granted.artifact_sha256}
    response = dave_api.post(f"/api/v1/approvals/{granted.pk}/decision", body, format="json")
    assert response.status_code == 200, response.json()
    assert ApprovalDecision.objects.get(request=granted).approver.username == "dave"


def test_the_console_shows_the_granted_review_and_nothing_else(dave_web, two_requests, run):  # noqa: ANN001
    granted, other = two_requests
    inbox = dave_web.get("/approvals/")
    assert inbox.status_code == 200
    assert str(granted.pk).encode() in inbox.content
    assert str(other.pk).encode() not in inbox.content
    review = dave_web.get(f"/approvals/{granted.pk}/")
    assert review.status_code == 200
    assert b"draft of A" in review.content
    assert dave_web.get(f"/approvals/{other.pk}/").status_code == 404
    assert dave_web.get(f"/approvals/{other.pk}/status").status_code == 404
    assert dave_web.get(f"/runs/{run.pk}/").status_code == 403
    assert dave_web.get("/runs/").status_code == 403
    assert dave_web.get("/members/").status_code == 403
    menu = dave_web.get("/", follow=True).content.decode()
    assert 'href="/approvals/"' in menu
    assert 'href="/runs/"' not in menu


def test_withdrawing_the_grant_takes_the_run_away_at_once(
    dave_api, dave_web, alice, acme, dave, two_requests
):  # noqa: ANN001
    granted, _ = two_requests
    grant = RunGrant.objects.get(user=dave)
    run_grant_revoke(tenant=acme, grant_id=grant.pk, actor=Actor(user=alice))
    assert dave_api.get(f"/api/v1/approvals/{granted.pk}").status_code == 401
    assert dave_web.get(f"/approvals/{granted.pk}/").status_code == 403
    actions = list(
        AuditEvent.objects.filter(tenant=acme, action__startswith="grant.")
        .order_by("id")
        .values_list("action", "target", "run_id")
    )
    assert actions == [
        ("grant.created", "dave", granted.run_id),
        ("grant.revoked", "dave", granted.run_id),
    ]


def test_removing_a_member_withdraws_their_run_grants(acme, alice, bob, carol, run):  # noqa: ANN001
    run_grant_create(tenant=acme, run_id=run.pk, user=carol, actor=Actor(user=alice))
    member_set_role(tenant=acme, user=carol, role=None, actor=Actor(user=alice))
    assert not RunGrant.objects.filter(user=carol).exists()
    assert permissions_of(user=carol, tenant=acme) == frozenset()


def test_a_grant_names_a_run_of_the_tenant(globex, charlie, carol, run):  # noqa: ANN001
    from cairn.errors import NotFound

    with pytest.raises(NotFound):
        run_grant_create(tenant=globex, run_id=run.pk, user=carol, actor=Actor(user=charlie))
    assert not RunGrant.objects.exists()


def test_admins_grant_and_withdraw_from_the_members_page(alice, acme, carol, run):  # noqa: ANN001
    admin = Client()
    admin.force_login(alice)
    response = admin.post("/members/grants", {"username": "carol", "run": str(run.pk)})
    assert response.status_code == 302
    grant = RunGrant.objects.get(user__username="carol")
    assert grant.granted_by == alice
    page = admin.get("/members/").content.decode()
    assert f'id="grant-{grant.pk}"' in page
    wrong_run = admin.post("/members/grants", {"username": "carol", "run": "0" * 32})
    assert wrong_run.status_code == 400
    assert b'id="grant_run_error"' in wrong_run.content
    assert b"No such run" in wrong_run.content
    assert admin.post(f"/members/grants/{grant.pk}/revoke").status_code == 302
    assert not RunGrant.objects.exists()


def test_a_one_run_reviewer_may_be_granted_another_run(alice, acme, bob, dave, run):  # noqa: ANN001
    other = another_run(acme, bob)
    run_grant_to_member(tenant=acme, run_id=other.pk, username="dave", actor=Actor(user=alice))
    assert set(RunGrant.objects.filter(user=dave).values_list("run_id", flat=True)) == {
        run.pk,
        other.pk,
    }


def test_it_refuses_a_run_grant_to_anyone_but_a_member_without_saying_who_exists(
    alice, acme, charlie, run
):  # noqa: ANN001
    UserFactory(username="erin")  # an account of no tenant
    admin = Client()
    admin.force_login(alice)
    answers = []
    for username in ("charlie", "erin", "nobody"):  # globex's admin, no tenant, no account
        response = admin.post("/members/grants", {"username": username, "run": str(run.pk)})
        assert response.status_code == 400
        html = response.content.decode()
        error = re.search(r'<span class="error" id="grant_username_error">([^<]+)</span>', html)
        assert error, username
        answers.append(error.group(1))
        assert "globex" not in html
    assert len(set(answers)) == 1
    assert "No member of acme has that username" in answers[0]
    assert not RunGrant.objects.exists()
    assert not AuditEvent.objects.filter(action="grant.created").exists()


def test_the_grant_service_refuses_a_member_of_another_tenant_only(acme, alice, charlie, run):  # noqa: ANN001
    from cairn.errors import NotFound

    with pytest.raises(NotFound) as refused:
        run_grant_to_member(tenant=acme, run_id=run.pk, username="charlie", actor=Actor(user=alice))
    assert refused.value.fields == {"username": "not a member"}
    assert permissions_of(user=charlie, tenant=acme) == frozenset()


def test_an_invitation_can_make_a_reviewer_of_one_run(alice, acme, run):  # noqa: ANN001
    admin = Client()
    admin.force_login(alice)
    response = admin.post(
        "/members/invite", {"username": "frank", "role": "one_run", "run": str(run.pk)}
    )
    assert response.status_code == 200
    link = re.search(
        r'<code id="invite-link" class="secret">([^<]+)</code>', response.content.decode()
    )
    assert not RunGrant.objects.filter(user__username="frank").exists()
    passphrase = "frank's long passphrase"
    Client().post(link.group(1), {"new_password1": passphrase, "new_password2": passphrase})
    grant = RunGrant.objects.get(user__username="frank")
    assert grant.run_id == run.pk
    assert permissions_of(user=grant.user, tenant=acme) == {roles.REVIEW_RUN}
