"""Escalation (issue 27, item 2, first half): an approval state may declare that a request
nobody decided before its expiry is raised again to another group, with the reason recorded,
and how the last level ends (the run fails, or it is held). The expiry sweep and the
worker's gate follow the same declaration (``after_expiry``)."""

from __future__ import annotations

import copy

import pytest
from django.test import Client

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.selectors import review_queue
from approvals.services import approval_expire_due, approval_gate
from cairn.errors import InvalidDefinition
from checkpoints.models import OutboxMessage, Run, RunStatus
from checkpoints.services.workflows import workflow_register
from runtime.services.runs import run_create
from tenants.models import AuditEvent
from tenants.reviewer_groups import reviewer_group_create, reviewer_group_member_add
from tenants.services import Actor, member_set_role
from tests.approvals_support import ask, at_review, draft, expire_now
from tests.factories import SIMPLE_DEFINITION, UserFactory

pytestmark = pytest.mark.django_db


def _member(username: str, tenant, role: str = "reviewer"):  # noqa: ANN001, ANN202
    user = UserFactory(username=username)
    member_set_role(tenant=tenant, user=user, role=role, actor=Actor.system("test"))
    return user


@pytest.fixture
def groups(acme, alice):  # noqa: ANN001
    """'legal' (rita) decides first; 'managers' (max) after one expiry."""
    people = {"rita": _member("rita", acme), "max": _member("max", acme)}
    for group, name in (("legal", "rita"), ("managers", "max")):
        reviewer_group_create(tenant=acme, name=group, actor=Actor(user=alice))
        reviewer_group_member_add(tenant=acme, name=group, username=name, actor=Actor(user=alice))
    return people


def _definition(then: str = "fail") -> dict:
    definition = copy.deepcopy(SIMPLE_DEFINITION)
    definition["approvals"] = {
        "review": {
            "action": "publish",
            "reviewers": {"group": "legal"},
            "escalation": {"to": [{"group": "managers"}], "then": then},
        }
    }
    return definition


def _request(acme, bob, then: str = "fail", execution: str = "external"):  # noqa: ANN001, ANN202
    workflow_register(
        tenant=acme,
        workflow_type=f"esc-{then}",
        version="1",
        definition=_definition(then),
        has_code=execution == "worker",
    )
    run = run_create(
        tenant=acme,
        workflow_type=f"esc-{then}",
        inputs={},
        execution=execution,
        actor=Actor(user=bob),
    )
    artifact = draft(acme)
    return ask(at_review(run, artifact), artifact, bob), artifact


@pytest.mark.parametrize(
    "escalation",
    [
        {"to": []},
        {"to": [{"group": "managers"}], "then": "retry"},
        {"to": [{"role": "operator"}]},
        {"to": [{"group": "managers"}], "after": 5},
        {"to": [{"group": "m"}] * 6},
    ],
)
def test_a_bad_escalation_is_refused_with_its_field(acme, escalation):  # noqa: ANN001
    definition = _definition()
    definition["approvals"]["review"]["escalation"] = escalation
    with pytest.raises(InvalidDefinition) as raised:
        workflow_register(tenant=acme, workflow_type="bad", version="1", definition=definition)
    assert "approvals.review.escalation" in raised.value.fields


def test_an_undecided_request_is_raised_again_to_the_next_group_with_the_reason(acme, bob, groups):  # noqa: ANN001
    first, _ = _request(acme, bob)
    assert [r.pk for r in review_queue(tenant=acme, user=groups["rita"])] == [first.pk]
    expire_now(first)
    approval_expire_due()
    second = ApprovalRequest.objects.get(run=first.run, status=ApprovalStatus.PENDING)
    assert (second.escalation_level, second.reviewer_group) == (1, "managers")
    assert second.status_reason.startswith(f"Escalated: approval request {first.pk} for ")
    assert "now for the reviewer group 'managers'" in second.status_reason
    assert list(review_queue(tenant=acme, user=groups["rita"])) == []
    assert [r.pk for r in review_queue(tenant=acme, user=groups["max"])] == [second.pk]
    event = AuditEvent.objects.get(action="approval.escalated", target=str(first.pk))
    assert "managers" in event.reason
    # The new group is told: an "escalated" notification is planned in the same transaction.
    assert OutboxMessage.objects.filter(
        kind="approval.notify", payload__request_id=str(second.pk), payload__event="escalated"
    ).exists()


def test_after_the_last_level_the_run_fails_as_the_workflow_says(acme, bob, groups):  # noqa: ANN001
    first, _ = _request(acme, bob, then="fail")
    expire_now(first)
    approval_expire_due()
    second = ApprovalRequest.objects.get(run=first.run, status=ApprovalStatus.PENDING)
    expire_now(second)
    approval_expire_due()
    run = Run.objects.get(pk=first.run_id)
    assert run.status == RunStatus.FAILED
    assert "No decision on 'publish' after escalation" in run.status_reason
    assert not ApprovalRequest.objects.filter(run=run, status=ApprovalStatus.PENDING).exists()
    assert AuditEvent.objects.filter(action="approval.escalation_ended").exists()


def test_after_the_last_level_the_run_is_held_when_the_workflow_says_hold(acme, bob, groups):  # noqa: ANN001
    first, _ = _request(acme, bob, then="hold")
    expire_now(first)
    approval_expire_due()
    second = ApprovalRequest.objects.get(run=first.run, status=ApprovalStatus.PENDING)
    expire_now(second)
    approval_expire_due()
    run = Run.objects.get(pk=first.run_id)
    assert run.status == RunStatus.WAITING_APPROVAL
    assert "the run is held" in run.status_reason
    assert not ApprovalRequest.objects.filter(run=run, status=ApprovalStatus.PENDING).exists()


def test_the_workers_gate_escalates_and_ends_the_same_way(acme, bob, groups):  # noqa: ANN001
    first, artifact = _request(acme, bob, then="fail", execution="worker")
    run = Run.objects.get(pk=first.run_id)

    def gate():  # noqa: ANN202
        return approval_gate(
            run=run,
            action="publish",
            artifact_id=artifact.id,
            artifact_sha256=artifact.sha256,
            actor=Actor.system("gate"),
        )

    expire_now(first)
    verdict = gate()
    assert verdict.outcome == "waiting"
    assert (verdict.request.escalation_level, verdict.request.reviewer_group) == (1, "managers")
    expire_now(verdict.request)
    ended = gate()
    assert ended.outcome == "rejected"
    assert "No decision on 'publish' after escalation" in ended.reason
    assert gate().outcome == "rejected"  # and stays so: nothing is raised again


def test_the_api_and_the_review_page_show_the_escalation(api_as, acme, bob, groups):  # noqa: ANN001
    first, _ = _request(acme, bob)
    expire_now(first)
    approval_expire_due()
    second = ApprovalRequest.objects.get(run=first.run, status=ApprovalStatus.PENDING)
    body = api_as(groups["max"], acme).get(f"/api/v1/approvals/{second.pk}").json()
    assert body["escalation_level"] == 1
    assert body["reviewers"] == {"role": None, "group": "managers"}
    assert body["status_reason"].startswith("Escalated:")
    queue = api_as(groups["max"], acme).get("/api/v1/approvals").json()["results"]
    assert [r["id"] for r in queue] == [str(second.pk)]
    client = Client()
    client.force_login(groups["max"])
    page = client.get(f"/approvals/{second.pk}/").content.decode()
    assert 'id="escalation"' in page and "Escalated: approval request" in page
    assert 'value="approve"' in page


def test_a_python_workflow_declares_its_escalation():
    from runtime import Workflow

    wf = Workflow("escalating-py", version="1", register=False)

    @wf.step("draft", next="review")
    def write(ctx):  # noqa: ANN001, ANN202
        return {}

    wf.approval(
        "review",
        next="done",
        reviewers={"group": "legal"},
        escalation={"to": [{"group": "managers"}], "then": "hold"},
    )
    wf.terminal("done")
    declared = wf.definition()["approvals"]["review"]
    assert declared["escalation"] == {"to": [{"group": "managers"}], "then": "hold"}
