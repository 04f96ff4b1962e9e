"""Real rows of tenant acme in every URL of the project, and the clients that send to them:
the URL enumeration and the NUL tests walk the same rows."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from approvals.services.delegations import delegation_create
from checkpoints.models import Run
from checkpoints.services.artifacts import artifact_store
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from runtime.services.bulk import bulk_action_start
from tenants.grants import run_grant_create
from tenants.members import member_invite
from tenants.reviewer_groups import reviewer_group_create, reviewer_group_member_add
from tenants.services import Actor, token_issue
from tests.actions_support import operation
from tests.approvals_support import ask, at_review, draft
from tests.factories import UserFactory
from tests.security_support import Route

# Path parameters that name a row of a tenant (anything else is a name or a constant).
ROW_PARAMS = {
    "run_id",
    "sequence",
    "artifact_id",
    "approval_id",
    "key",
    "operation_id",
    "user_id",
    "token_id",
    "grant_id",
    "name",  # a reviewer group's name
    "delegation_id",
    "bulk_action_id",
}


@dataclass
class Acme:
    """Real rows of tenant acme to put into every path, and bodies valid enough that a
    refusal comes from the lookup, not from validation."""

    run: Run
    values: dict[str, object]
    route_values: dict[str, dict[str, object]]  # a route whose row is another (by name)
    bodies: dict[tuple[str, str], dict]
    queries: dict[tuple[str, str], str]
    row_ids: list[str]

    def url(self, route: Route) -> str:
        from django.urls import reverse

        values = {**self.values, **self.route_values.get(route.name, {})}
        kwargs = {param: values[param] for param in route.params}
        return reverse(route.name, kwargs=kwargs)


@pytest.fixture
def acme_rows(acme, alice, bob, carol, charlie, run) -> Acme:  # noqa: ANN001
    artifact = draft(acme, "acme's confidential draft\n")
    at_review(run, artifact)
    # The checkpoint under review cites a source, which its review page opens.
    source, _ = artifact_store(
        tenant=acme, data=b"acme's source", media_type="text/plain", kind="source"
    )
    run.refresh_from_db()
    cited = [
        {"id": str(a.id), "sha256": a.sha256, "name": n}
        for a, n in ((artifact, "draft"), (source, "source:s"))
    ]
    checkpoint_commit(
        tenant=acme,
        run_id=run.pk,
        request=CommitRequest(
            expected_version=run.version,
            state="review",
            step="",
            envelope={"evidence": {"artifacts": cited, "validators": []}},
            actor=Actor.system("test"),
        ),
    )
    approval = ask(run, artifact, bob)
    run.refresh_from_db()
    op = operation(run, "acme-publish-1", "pending")
    token, _ = token_issue(tenant=acme, user=bob, actor=Actor.system("test"))
    dave = UserFactory(username="dave")
    grant = run_grant_create(tenant=acme, run_id=run.pk, user=dave, actor=Actor(user=alice))
    UserFactory(username="nobody")
    invited = member_invite(tenant=acme, username="erin", role="reviewer", actor=Actor(user=alice))
    delegation = delegation_create(
        tenant=acme,
        delegate_username="alice",
        ends_at=timezone.now() + timedelta(days=1),
        actor=Actor(user=carol),
    )
    reviewer_group_create(tenant=acme, name="acme-legal-7", actor=Actor(user=alice))
    reviewer_group_member_add(
        tenant=acme, name="acme-legal-7", username="carol", actor=Actor(user=alice)
    )
    bulk = bulk_action_start(
        tenant=acme,
        actor=Actor(user=bob),
        action="pause",
        reason="r",
        run_ids=[run.pk],
        selection={"ticked": True},
    )
    values = {
        "bulk_action_id": bulk.pk,
        "run_id": run.pk,
        "sequence": 1,
        "artifact_id": artifact.pk,
        "approval_id": approval.pk,
        "key": op.idempotency_key,
        "operation_id": op.pk,
        "user_id": bob.pk,
        "token_id": token.pk,
        "grant_id": grant.pk,
        "workflow_type": "research",
        "version": "1",
        "action": "cancel",
        "uidb64": "MQ",
        "token": "set-password",
        "name": "acme-legal-7",
        "delegation_id": delegation.pk,
        "username": "carol",
        "invitation_id": invited.link_path.strip("/").split("/")[1],
    }
    bodies = {
        ("api:checkpoints", "POST"): {
            "expected_version": run.version,
            "state": "publish",
            "step": "publish",
            "envelope": {},
        },
        ("api:run-lease", "POST"): {
            "owner": "w",
            "ttl_seconds": 30,
            "expected_version": run.version,
        },
        ("api:run-operations", "POST"): {
            "idempotency_key": "k-2",
            "action": "publish",
            "target": "https://example.org",
            "request_fingerprint": "f" * 64,
        },
        ("api:run-operation-confirm", "POST"): {"provider_operation_id": "p-1"},
        ("api:run-operation-fail", "POST"): {"reason": "r"},
        ("api:run-operation-unknown", "POST"): {"reason": "r"},
        ("api:run-operation-job", "PUT"): {"job_id": "job-1"},
        ("api:webhook", "PUT"): {"url": "http://127.0.0.1:1/h"},
        ("api:run-resume", "POST"): {"expected_version": run.version},
        ("api:run-cancel", "POST"): {"reason": "r"},
        ("api:bulk-actions", "POST"): {
            "action": "pause",
            "reason": "r",
            "run_ids": [str(run.pk)],
            "dry_run": True,
        },
        ("console:bulk_new", "POST"): {"action": "pause", "reason": "r"},
        ("api:run-pause", "POST"): {"reason": "r"},
        ("api:run-retry", "POST"): {"step": "draft_answer", "reason": "r"},
        ("api:run-fork", "POST"): {"from_sequence": 1, "reason": "r"},
        ("api:run-grant-budget", "POST"): {"attempts": 1, "reason": "r"},
        ("approvals_api:run-approvals", "POST"): {
            "artifact_id": str(artifact.pk),
            "artifact_sha256": artifact.sha256,
            "action": "publish",
        },
        ("approvals_api:approval-decision", "POST"): {
            "decision": "approve",
            "artifact_sha256": artifact.sha256,
        },
        ("approvals:decide", "POST"): {
            "decision": "approve",
            "artifact_sha256": artifact.sha256,
        },
        ("tenants:set_role", "POST"): {"role": "admin"},
        ("console:tenant_switch", "POST"): {"tenant": str(acme.pk)},
        ("console:retention_hold", "POST"): {"on": "1", "run_id": str(run.pk), "reason": "x"},
    }
    queries = {
        ("api:run-lease", "DELETE"): "?owner=w",
        ("api:run-fork-preview", "GET"): "?from_sequence=1",
    }
    row_ids = [str(v) for k, v in values.items() if k in ROW_PARAMS - {"sequence", "user_id"}]
    route_values = {"approvals:source": {"artifact_id": source.pk}}
    row_ids.append(str(source.pk))
    return Acme(
        run=run,
        values=values,
        route_values=route_values,
        bodies=bodies,
        queries=queries,
        row_ids=row_ids,
    )


def send(client, route: Route, method: str, acme: Acme):  # noqa: ANN001, ANN201
    url = acme.url(route) + acme.queries.get((route.name, method), "")
    body = acme.bodies.get((route.name, method))
    call = getattr(client, method.lower())
    if method in ("GET", "DELETE"):
        return call(url)
    if route.is_api:
        return call(url, json.dumps(body or {}), content_type="application/json")
    return call(url, body or {})


def api_client(user, tenant) -> APIClient:  # noqa: ANN001
    _, secret = token_issue(tenant=tenant, user=user, actor=Actor.system("test"))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def web_client(user) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(user)
    return client
