"""The demo provider's publication, seen on its operation (issue 29, item 8): the run's
side effects link each idempotency key to a page with the provider's id and answer (the
publication the local publishing service made) and what was sent; the read is audited,
and another run's or tenant's operation is a 404."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from checkpoints.models import ExternalOperation, Run
from runtime.executor import run_advance
from runtime.services.runs import run_create
from tenants.models import AuditEvent
from tenants.services import Actor
from tests.effects_workflows import effects_demo


@pytest.fixture
def published_run(acme, settings, publishing_service, tmp_path) -> Run:  # noqa: ANN001
    settings.CAIRN_PUBLISHING_URL = publishing_service.url
    assert effects_demo.workflow_type == "effects_demo"
    counts = tmp_path / "counts"
    counts.mkdir()
    run = run_create(
        tenant=acme,
        workflow_type="effects_demo",
        inputs={"title": "Why build cairns?", "count_dir": str(counts)},
        budget={"max_attempts": 10},
        actor=Actor.system("test"),
    )
    run_advance(run_id=run.pk, expected_version=run.version, owner="test-worker")
    run.refresh_from_db()
    assert run.status == "succeeded", run.status_reason
    return run


def test_an_operator_opens_the_publication_from_the_runs_side_effects(
    live_server,
    page,
    login,
    bob,
    acme,
    published_run,
    publishing_service,  # noqa: ANN001
):
    operation = ExternalOperation.objects.get(run=published_run)
    publication_url = publishing_service.stats()  # what the provider itself holds
    login(page, bob)
    page.goto(f"{live_server.url}/runs/{published_run.pk}/")
    page.locator("#operations").get_by_role("link", name=operation.idempotency_key).click()
    expect(page.locator('[data-field="provider-id"]')).to_have_text(operation.provider_operation_id)
    result = page.locator("#operation-result")
    expect(result).to_contain_text(operation.provider_operation_id)
    expect(result).to_contain_text('"status": "published"')
    expect(page.locator("#operation-request")).to_be_visible()
    assert publication_url["ids"][operation.idempotency_key] == operation.provider_operation_id
    assert AuditEvent.objects.filter(
        tenant=acme, action="operation.read", target=operation.idempotency_key
    ).exists()


def test_another_runs_or_tenants_operation_is_not_found(
    client,
    bob,
    charlie,
    acme,
    globex,
    published_run,  # noqa: ANN001
):
    operation = ExternalOperation.objects.get(run=published_run)
    client.force_login(bob)
    url = f"/runs/{published_run.pk}/operations/{operation.pk}/"
    assert client.get(url).status_code == 200
    other = run_create(
        tenant=acme,
        workflow_type="effects_demo",
        inputs={"title": "x", "count_dir": "/tmp"},
        actor=Actor.system("test"),
    )
    assert client.get(f"/runs/{other.pk}/operations/{operation.pk}/").status_code == 404
    client.force_login(charlie)
    assert client.get(url).status_code in (403, 404)
    assert not AuditEvent.objects.filter(tenant=globex, action="operation.read").exists()
