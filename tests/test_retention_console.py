"""The console's retention page: admins only, a preview before saving, legal holds."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from checkpoints.models import Checkpoint, Run, RunStatus
from retention.models import RetentionPolicy
from retention.services import retention_apply
from tenants.models import AuditEvent, Tenant
from tests.retention_support import build

pytestmark = pytest.mark.django_db

PAGE = reverse("console:retention")
PREVIEW = reverse("console:retention_preview")
HOLD = reverse("console:retention_hold")


def signed_in(user) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(user)
    return client


def figure(html: str, name: str) -> int:
    return int(re.search(rf'id="preview-{name}"[^>]*>(\d+)<', html).group(1))


@pytest.fixture
def finished(acme, bob, workflow):  # noqa: ANN001, ANN201
    return [build(acme, bob, status=RunStatus.SUCCEEDED) for _ in range(2)]


def test_only_an_admin_opens_the_page(alice, bob, carol, charlie):
    assert signed_in(alice).get(PAGE).status_code == 200
    for user in (bob, carol):
        assert signed_in(user).get(PAGE).status_code == 403
        assert signed_in(user).post(PREVIEW, {"intermediate_days": "1"}).status_code == 403
        assert signed_in(user).post(HOLD, {"on": "1"}).status_code == 403
    assert not Tenant.objects.get(slug="acme").legal_hold


def test_the_preview_shows_what_would_go_before_anything_is_saved(alice, finished):
    client = signed_in(alice)
    response = client.post(
        PREVIEW, {"workflow_type": "", "intermediate_days": "30"}, HTTP_HX_REQUEST="true"
    )
    html = response.content.decode()
    assert response.status_code == 200 and '<div id="retention-preview"' in html
    assert "<html" not in html  # a partial for htmx
    assert figure(html, "checkpoints") == 2 * 5
    assert figure(html, "runs-compacted") == 2
    assert int(re.search(r'data-bytes="(\d+)"', html).group(1)) > 0
    assert not RetentionPolicy.objects.exists()
    assert Checkpoint.objects.count() == 2 * 8


def test_the_preview_explains_a_contradiction_instead_of_counting(alice, finished):
    html = (
        signed_in(alice)
        .post(PREVIEW, {"intermediate_days": "30", "run_expiry_days": "7"})
        .content.decode()
    )
    assert 'id="preview-problem"' in html and "cannot expire" in html
    html = signed_in(alice).post(PREVIEW, {"intermediate_days": "soon"}).content.decode()
    assert "a whole number of days" in html


def test_saving_a_policy_from_the_page_then_the_job_enforces_it(alice, finished):
    client = signed_in(alice)
    response = client.post(PAGE, {"workflow_type": "", "intermediate_days": "30"}, follow=True)
    html = response.content.decode()
    assert response.status_code == 200 and "saved" in html
    assert RetentionPolicy.objects.get().intermediate_days == 30
    assert figure(html, "checkpoints") == 10  # the saved policy's preview on the page
    retention_apply()
    assert Checkpoint.objects.count() == 2 * 3
    assert AuditEvent.objects.filter(action="retention.policy_set", actor=alice).exists()


def test_an_invalid_policy_is_shown_back_with_its_errors_and_not_saved(alice):
    response = signed_in(alice).post(PAGE, {"intermediate_days": "30", "failed_run_days": "3"})
    assert response.status_code == 422
    html = response.content.decode()
    assert 'id="policy-errors"' in html and 'value="3"' in html
    assert not RetentionPolicy.objects.exists()


def test_the_legal_hold_toggles_for_the_tenant_and_a_run(alice, acme, finished):
    client = signed_in(alice)
    client.post(HOLD, {"on": "1", "reason": "litigation"})
    assert Tenant.objects.get(pk=acme.pk).legal_hold
    assert "On legal hold" in client.get(PAGE).content.decode()
    client.post(HOLD, {"on": "0"})
    assert not Tenant.objects.get(pk=acme.pk).legal_hold
    run = finished[0].run
    client.post(HOLD, {"on": "1", "run_id": str(run.pk)})
    assert Run.objects.get(pk=run.pk).legal_hold
    html = client.get(PAGE).content.decode()
    assert str(run.pk)[:8] in re.search(r'<ul id="held-runs">.*?</ul>', html, re.S).group(0)
    hold = AuditEvent.objects.get(action="retention.legal_hold_on", target="tenant")
    assert hold.reason == "litigation" and hold.actor == alice


def test_a_hold_on_another_tenants_run_is_refused(alice, globex, charlie, workflow):
    from checkpoints.services.workflows import workflow_register
    from tests.factories import SIMPLE_DEFINITION

    workflow_register(
        tenant=globex, workflow_type="research", version="1", definition=SIMPLE_DEFINITION
    )
    theirs = build(globex, charlie, status=RunStatus.SUCCEEDED, length=2).run
    response = signed_in(alice).post(HOLD, {"on": "1", "run_id": str(theirs.pk)}, follow=True)
    assert "No such run" in response.content.decode()
    assert not Run.objects.get(pk=theirs.pk).legal_hold
