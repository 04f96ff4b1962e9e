"""An audit event exists for every kind of change and every decrypting read, with actor,
tenant, run, address and time — whichever door (API or console) the person came through."""

from __future__ import annotations

import pytest
from django.test import Client

from checkpoints.models import Run
from retention.policies import PolicyInput, legal_hold_set, retention_policy_save
from tenants.grants import run_grant_create, run_grant_revoke
from tenants.models import AuditEvent
from tenants.services import Actor, member_set_role, token_issue, token_revoke
from tests.actions_support import advance, operation, worker_run
from tests.approvals_support import ask, at_review, draft

ADDRESS = "203.0.113.9"


def api_from(api_as, user, tenant):  # noqa: ANN001, ANN201
    api = api_as(user, tenant)
    api.defaults["REMOTE_ADDR"] = ADDRESS
    return api


def web_as(user) -> Client:  # noqa: ANN001
    client = Client(REMOTE_ADDR=ADDRESS)
    client.force_login(user)
    return client


def only_event(tenant, action: str, **match) -> AuditEvent:  # noqa: ANN001, ANN003
    (event,) = AuditEvent.objects.filter(tenant=tenant, action=action, **match)
    assert event.created_at is not None
    return event


@pytest.fixture
def wrun(acme, bob):  # noqa: ANN001
    run = worker_run(acme, bob)
    return advance(advance(run, bob, "draft_answer"), bob, "review")


@pytest.fixture
def reviewed(acme, bob, run):  # noqa: ANN001
    """An external run waiting for approval of a draft (asked by bob)."""
    artifact = draft(acme, "the draft under review\n")
    return ask(at_review(run, artifact), artifact, bob)


# --- operator actions ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("action", "body", "event"),
    [
        ("cancel", {"reason": "duplicate ticket"}, "run.cancel"),
        ("retry", {"step": "draft", "reason": "duplicate ticket"}, "run.retry"),
        # run.forked is the source run's event; run.fork is the new run's.
        ("fork", {"from_sequence": 1, "reason": "duplicate ticket"}, "run.forked"),
    ],
)
def test_each_operator_action_is_audited_with_actor_reason_and_address(
    api_as, acme, bob, wrun, action, body, event
):  # noqa: ANN001
    response = api_from(api_as, bob, acme).post(
        f"/api/v1/runs/{wrun.pk}/actions/{action}", body, format="json"
    )
    assert response.status_code in (200, 201), response.json()
    row = only_event(acme, event, run_id=wrun.pk)
    assert (row.actor, row.ip) == (bob, ADDRESS)
    assert "duplicate ticket" in row.reason


def test_a_budget_grant_is_audited(api_as, acme, bob):  # noqa: ANN001
    run = worker_run(acme, bob, budget={"max_attempts": 1})
    response = api_from(api_as, bob, acme).post(
        f"/api/v1/runs/{run.pk}/actions/grant_budget",
        {"attempts": 2, "reason": "flaky provider"},
        format="json",
    )
    assert response.status_code == 200, response.json()
    row = only_event(acme, "run.budget_grant", run_id=run.pk)
    assert (row.actor, row.ip, row.reason) == (bob, ADDRESS, "flaky provider")


def test_resume_is_audited(api_as, acme, bob, wrun):  # noqa: ANN001
    paused = advance(wrun, bob, "review", status="paused_for_review")
    response = api_from(api_as, bob, acme).post(
        f"/api/v1/runs/{paused.pk}/actions/resume",
        {"expected_version": paused.version, "reason": "fixed upstream"},
        format="json",
    )
    assert response.status_code == 200, response.json()
    row = only_event(acme, "run.resume", run_id=paused.pk)
    assert (row.actor, row.ip) == (bob, ADDRESS)


def test_a_refused_action_changes_nothing_and_records_no_action(api_as, acme, carol, wrun):  # noqa: ANN001
    response = api_from(api_as, carol, acme).post(
        f"/api/v1/runs/{wrun.pk}/actions/cancel", {"reason": "x"}, format="json"
    )
    assert response.status_code == 403
    assert not AuditEvent.objects.filter(action="run.cancel").exists()


def test_a_side_effect_outcome_recorded_through_the_api_is_audited(api_as, acme, bob, wrun):  # noqa: ANN001
    operation(wrun, "pub-1", "pending")
    response = api_from(api_as, bob, acme).post(
        f"/api/v1/runs/{wrun.pk}/operations/pub-1/unknown",
        {"reason": "the provider timed out"},
        format="json",
    )
    assert response.status_code == 200, response.json()
    (row,) = AuditEvent.objects.filter(tenant=acme, run_id=wrun.pk, target="operation pub-1")
    assert (row.actor, row.ip, row.reason) == (bob, ADDRESS, "the provider timed out")
    assert (row.details["from"], row.details["to"]) == ("pending", "unknown")


# --- decisions -----------------------------------------------------------------------------
@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_each_decision_is_audited(api_as, acme, carol, reviewed, decision):  # noqa: ANN001
    response = api_from(api_as, carol, acme).post(
        f"/api/v1/approvals/{reviewed.pk}/decision",
        {"decision": decision, "artifact_sha256": reviewed.artifact_sha256, "comment": "ok"},
        format="json",
    )
    assert response.status_code == 200, response.json()
    row = only_event(acme, "approval.decision", run_id=reviewed.run_id)
    assert (row.actor, row.ip, row.target) == (carol, ADDRESS, str(reviewed.pk))
    assert decision in str(row.details)


# --- members, tokens, grants, retention ----------------------------------------------------
def test_role_changes_and_removals_are_audited(acme, alice, bob):  # noqa: ANN001
    actor = Actor(user=alice, ip=ADDRESS)
    member_set_role(tenant=acme, user=bob, role="reviewer", actor=actor, reason="moved team")
    member_set_role(tenant=acme, user=bob, role=None, actor=actor)
    changes = AuditEvent.objects.filter(tenant=acme, target="bob", actor=alice).order_by("id")
    assert [(e.action, e.details, e.ip) for e in changes] == [
        ("member.role_set", {"role": "reviewer"}, ADDRESS),
        ("member.removed", {"role": None}, ADDRESS),
    ]
    assert changes[0].reason == "moved team"


def test_token_changes_are_audited_without_the_secret(acme, alice, carol):  # noqa: ANN001
    token, secret = token_issue(
        tenant=acme, user=carol, actor=Actor(user=carol, ip=ADDRESS), name="ci"
    )
    token_revoke(token=token, actor=Actor(user=alice, ip=ADDRESS))
    issued = only_event(acme, "token.issued")
    revoked = only_event(acme, "token.revoked")
    assert (issued.actor, revoked.actor) == (carol, alice)
    assert token.prefix in issued.target and token.prefix in revoked.target
    assert secret not in str(list(AuditEvent.objects.values()))


def test_run_grants_are_audited(acme, alice, carol, run):  # noqa: ANN001
    grant = run_grant_create(tenant=acme, run_id=run.pk, user=carol, actor=Actor(user=alice))
    run_grant_revoke(tenant=acme, grant_id=grant.pk, actor=Actor(user=alice))
    assert only_event(acme, "grant.created").run_id == run.pk
    assert only_event(acme, "grant.revoked").run_id == run.pk


def test_retention_changes_are_audited(acme, alice, run):  # noqa: ANN001
    actor = Actor(user=alice, ip=ADDRESS)
    retention_policy_save(tenant=acme, data=PolicyInput(intermediate_days=30), actor=actor)
    legal_hold_set(tenant=acme, on=True, actor=actor, run_id=run.pk, reason="litigation")
    policy = only_event(acme, "retention.policy_set")
    assert (policy.actor, policy.ip) == (alice, ADDRESS)
    assert policy.details["after"]["intermediate_days"] == 30
    hold = only_event(acme, "retention.legal_hold_on")
    assert (hold.run_id, hold.reason) == (run.pk, "litigation")


# --- decrypting reads ----------------------------------------------------------------------
def test_reading_an_envelope_through_the_api_is_audited(api_as, acme, bob, run):  # noqa: ANN001
    api = api_from(api_as, bob, acme)
    assert api.get(f"/api/v1/runs/{run.pk}/checkpoints").status_code == 200
    assert not AuditEvent.objects.filter(action="checkpoint.read").exists()  # no decryption
    assert api.get(f"/api/v1/runs/{run.pk}/checkpoints/1").status_code == 200
    row = only_event(acme, "checkpoint.read", run_id=run.pk)
    assert (row.actor, row.ip, row.target) == (bob, ADDRESS, "checkpoint 1")


def test_reading_artifact_content_through_the_api_is_audited(api_as, acme, bob):  # noqa: ANN001
    api = api_from(api_as, bob, acme)
    stored = api.post("/api/v1/artifacts", b"secret draft", content_type="text/plain").json()
    assert api.get(f"/api/v1/artifacts/{stored['id']}").status_code == 200
    assert not AuditEvent.objects.filter(action="artifact.read").exists()  # metadata only
    assert api.get(f"/api/v1/artifacts/{stored['id']}/content").content == b"secret draft"
    row = only_event(acme, "artifact.read", target=stored["id"])
    assert (row.actor, row.ip) == (bob, ADDRESS)


def test_reading_the_artifact_under_review_is_audited_under_its_run(api_as, acme, carol, reviewed):  # noqa: ANN001
    api = api_from(api_as, carol, acme)
    assert api.get(f"/api/v1/approvals/{reviewed.pk}/artifact").status_code == 200
    row = only_event(acme, "artifact.read", actor=carol)
    assert (row.run_id, row.target, row.ip) == (
        reviewed.run_id,
        str(reviewed.artifact_id),
        ADDRESS,
    )


def test_the_review_page_audits_the_artifact_it_shows(acme, carol, reviewed):  # noqa: ANN001
    page = web_as(carol).get(f"/approvals/{reviewed.pk}/")
    assert page.status_code == 200
    assert b"the draft under review" in page.content
    row = only_event(acme, "artifact.read", actor=carol)
    assert (row.run_id, row.ip) == (reviewed.run_id, ADDRESS)


def test_the_console_run_page_audits_its_envelope_read(acme, bob, run):  # noqa: ANN001
    assert web_as(bob).get(f"/runs/{run.pk}/").status_code == 200
    row = only_event(acme, "checkpoint.read", run_id=run.pk)
    assert (row.actor, row.ip) == (bob, ADDRESS)


def test_the_console_checkpoint_page_audits_both_envelopes_it_decrypts(acme, bob, reviewed):  # noqa: ANN001
    run = Run.objects.get(pk=reviewed.run_id)
    assert (
        web_as(bob).get(f"/runs/{run.pk}/checkpoints/{run.checkpoint_sequence}/").status_code == 200
    )
    targets = set(
        AuditEvent.objects.filter(tenant=acme, action="checkpoint.read", actor=bob).values_list(
            "target", flat=True
        )
    )
    sequence = run.checkpoint_sequence
    assert targets == {f"checkpoint {sequence}", f"checkpoint {sequence - 1}"}


def test_the_console_artifact_page_audits_its_read_under_the_run(acme, bob, reviewed):  # noqa: ANN001
    url = f"/runs/{reviewed.run_id}/artifacts/{reviewed.artifact_id}/"
    page = web_as(bob).get(url)
    assert page.status_code == 200
    assert b"the draft under review" in page.content
    row = only_event(acme, "artifact.read", actor=bob)
    assert (row.run_id, row.ip) == (reviewed.run_id, ADDRESS)


def test_a_read_refused_for_another_tenant_leaves_no_trace_in_either(
    api_as, acme, globex, charlie, run
):  # noqa: ANN001
    api = api_from(api_as, charlie, globex)
    assert api.get(f"/api/v1/runs/{run.pk}/checkpoints/1").status_code == 404
    assert not AuditEvent.objects.filter(action="checkpoint.read").exists()
