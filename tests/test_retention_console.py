"""The console's retention page: admins only, a preview before saving, legal holds."""

from __future__ import annotations

import re
import uuid

import pytest
from django.test import Client
from django.urls import reverse

from cairn.errors import InvalidRequest, NotFound
from checkpoints.models import Checkpoint, Run, RunStatus
from checkpoints.services.workflows import workflow_register
from retention.models import RetentionPolicy
from retention.policies import PolicyInput, legal_hold_set, retention_policy_save
from retention.services import retention_apply
from tenants.models import AuditEvent, Tenant
from tenants.services import Actor
from tests.factories import SIMPLE_DEFINITION
from tests.retention_support import build

pytestmark = pytest.mark.django_db

PAGE = reverse("console:retention")
PREVIEW = reverse("console:retention_preview")
HOLD = reverse("console:retention_hold")
REMOVE = reverse("console:retention_remove")
ACTOR = Actor.system("test")


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
    client.post(HOLD, {"scope": "tenant", "on": "1", "reason": "litigation"})
    assert Tenant.objects.get(pk=acme.pk).legal_hold
    assert "On legal hold" in client.get(PAGE).content.decode()
    client.post(HOLD, {"scope": "tenant", "on": "0", "reason": "settled", "confirm": "1"})
    assert not Tenant.objects.get(pk=acme.pk).legal_hold
    run = finished[0].run
    client.post(HOLD, {"scope": "run", "on": "1", "run_id": str(run.pk), "reason": "subpoena"})
    assert Run.objects.get(pk=run.pk).legal_hold
    html = client.get(PAGE).content.decode()
    assert str(run.pk)[:8] in re.search(r'<ul id="held-runs">.*?</ul>', html, re.S).group(0)
    hold = AuditEvent.objects.get(action="retention.legal_hold_on", target="tenant")
    assert hold.reason == "litigation" and hold.actor == alice


def test_a_hold_on_another_tenants_run_is_refused(alice, globex, charlie, workflow):
    workflow_register(
        tenant=globex, workflow_type="research", version="1", definition=SIMPLE_DEFINITION
    )
    theirs = build(globex, charlie, status=RunStatus.SUCCEEDED, length=2).run
    response = signed_in(alice).post(
        HOLD, {"scope": "run", "on": "1", "run_id": str(theirs.pk), "reason": "x"}
    )
    assert response.status_code == 404 and "No such run" in response.content.decode()
    assert not Run.objects.get(pk=theirs.pk).legal_hold


# --- legal holds: the tenant and a run are distinct requests ---------------------------------
def hold_events() -> int:
    return AuditEvent.objects.filter(action__startswith="retention.legal_hold").count()


def run_hold_error(html: str) -> str:
    return re.search(r'<p class="error" id="err-run-hold-id"[^>]*>(.*?)</p>', html, re.S).group(1)


@pytest.mark.parametrize("typed", ["", "   ", "\t"])
def test_a_blank_run_id_is_refused_and_never_holds_the_tenant(alice, acme, typed):
    client = signed_in(alice)
    for body in (
        {"scope": "run", "on": "1", "run_id": typed, "reason": "x"},
        {"on": "1", "run_id": typed},  # a request without a scope is a run's, not the tenant's
        {"on": "1"},
    ):
        response = client.post(HOLD, body)
        html = response.content.decode()
        assert response.status_code == 422
        assert run_hold_error(html) == "Enter a run id."
        assert 'aria-invalid="true" aria-describedby="err-run-hold-id"' in html
        assert "The tenant is on legal hold" not in html
    assert not Tenant.objects.get(pk=acme.pk).legal_hold
    assert hold_events() == 0


def test_the_tenant_hold_is_its_own_form_with_an_explicit_scope(alice, acme):
    html = signed_in(alice).get(PAGE).content.decode()
    tenant_form = re.search(r'<form[^>]*id="tenant-hold-form".*?</form>', html, re.S).group(0)
    run_form = re.search(r'<form[^>]*id="run-hold-form".*?</form>', html, re.S).group(0)
    assert 'name="scope" value="tenant"' in tenant_form and 'name="run_id"' not in tenant_form
    assert 'name="scope" value="run"' in run_form
    response = signed_in(alice).post(
        HOLD, {"scope": "tenant", "on": "1", "reason": "audit"}, follow=True
    )
    assert "The tenant is on legal hold." in response.content.decode()
    assert Tenant.objects.get(pk=acme.pk).legal_hold


def test_a_run_id_that_is_not_a_uuid_is_refused_with_a_sentence(alice, acme, finished):
    response = signed_in(alice).post(HOLD, {"scope": "run", "on": "1", "run_id": "abc123"})
    html = response.content.decode()
    assert response.status_code == 422
    assert "at least 8 characters" in run_hold_error(html) and 'value="abc123"' in html
    assert not Run.objects.filter(legal_hold=True).exists() and hold_events() == 0
    with pytest.raises(InvalidRequest):  # the service, too, refuses rather than failing
        legal_hold_set(tenant=acme, run_id="abc123", on=True, actor=ACTOR)
    with pytest.raises(InvalidRequest):
        legal_hold_set(tenant=acme, run_id="  ", on=True, actor=ACTOR)
    assert not Tenant.objects.get(pk=acme.pk).legal_hold


def test_another_tenants_run_gets_the_same_answer_as_a_run_that_does_not_exist(
    alice, acme, globex, charlie, workflow
):
    workflow_register(
        tenant=globex, workflow_type="research", version="1", definition=SIMPLE_DEFINITION
    )
    theirs = build(globex, charlie, status=RunStatus.SUCCEEDED, length=2).run
    client = signed_in(alice)
    answers = []
    for run_id in (str(theirs.pk), str(uuid.uuid4())):
        response = client.post(HOLD, {"scope": "run", "on": "1", "run_id": run_id, "reason": "x"})
        answers.append((response.status_code, run_hold_error(response.content.decode())))
    assert answers[0] == answers[1] == (404, "No such run in this tenant.")
    assert not Run.objects.filter(legal_hold=True).exists() and hold_events() == 0
    with pytest.raises(NotFound):
        legal_hold_set(tenant=acme, run_id=theirs.pk, on=True, actor=ACTOR)


def test_releasing_a_run_that_is_gone_says_so_by_the_held_runs(alice, finished):
    response = signed_in(alice).post(
        HOLD,
        {"scope": "run", "on": "0", "run_id": str(uuid.uuid4()), "confirm": "1", "reason": "x"},
    )
    html = response.content.decode()
    assert response.status_code == 404
    assert re.search(r'id="release-error"[^>]*>No such run in this tenant\.<', html)


def test_a_hold_form_the_page_does_not_understand_changes_nothing(alice, acme, finished):
    client = signed_in(alice)
    run_id = str(finished[0].run.pk)
    for body, shown in (
        ({"scope": "everything", "on": "1", "run_id": run_id}, "page-error"),
        ({"scope": "run", "on": "yes", "run_id": run_id}, "page-error"),
        ({"scope": "tenant"}, "tenant-hold-error"),
    ):
        response = client.post(HOLD, body)
        html = response.content.decode()
        assert response.status_code == 422
        assert re.search(rf'id="{shown}" role="alert">The legal hold form was not understood', html)
    assert not Tenant.objects.get(pk=acme.pk).legal_hold
    assert not Run.objects.filter(legal_hold=True).exists() and hold_events() == 0


def test_a_refused_post_renders_links_that_lead_back_to_the_page(alice, acme, workflow):
    save(acme, "research", intermediate_days=5)
    html = signed_in(alice).post(HOLD, {"scope": "run", "on": "1", "run_id": ""}).content.decode()
    assert f'href="{PAGE}?workflow_type=research"' in html


# --- the scope of the policy form ----------------------------------------------------------------
def save(tenant, workflow_type: str, **periods) -> RetentionPolicy:  # noqa: ANN001
    return retention_policy_save(
        tenant=tenant, data=PolicyInput(workflow_type=workflow_type, **periods), actor=ACTOR
    )


@pytest.fixture
def ext(acme):  # noqa: ANN001
    workflow_register(tenant=acme, workflow_type="ext", version="1", definition=SIMPLE_DEFINITION)
    return "ext"


def policy_form(html: str) -> str:
    return re.search(r'<form[^>]*id="policy-form".*?</form>', html, re.S).group(0)


def test_choosing_a_scope_loads_its_saved_values_with_a_get(alice, acme, workflow, ext):
    save(acme, "", intermediate_days=30)
    save(acme, "ext", intermediate_days=7, run_expiry_days=90)
    client = signed_in(alice)
    html = client.get(PAGE, {"workflow_type": "ext"}).content.decode()
    scope_form = re.search(r'<form[^>]*id="scope-form".*?</form>', html, re.S).group(0)
    assert 'method="get"' in scope_form and 'hx-get="' in scope_form
    assert 'hx-trigger="change"' in scope_form and 'type="submit"' in scope_form
    assert '<option value="ext" selected>' in scope_form
    # The select is not part of the form that saves: that one carries the page's own scope.
    form = policy_form(html)
    assert "<select" not in form
    assert '<input type="hidden" name="workflow_type" value="ext">' in form
    assert 'id="policy-intermediate_days" name="intermediate_days"' in form
    assert re.search(r'name="intermediate_days"[^>]*value="7"', form)
    # Choosing the default (what the select's GET asks for) shows the default's values.
    html = client.get(PAGE, {"workflow_type": ""}, HTTP_HX_REQUEST="true").content.decode()
    assert "all workflows (default)</h2>" in html
    form = policy_form(html)
    assert '<input type="hidden" name="workflow_type" value="">' in form
    assert re.search(r'name="intermediate_days"[^>]*value="30"', form)
    assert re.search(r'name="run_expiry_days"[^>]*value=""', form)


def test_saving_writes_the_scope_the_form_was_loaded_for(alice, acme, workflow, ext):
    save(acme, "", intermediate_days=30)
    client = signed_in(alice)
    form = policy_form(client.get(PAGE, {"workflow_type": "ext"}).content.decode())
    scope = re.search(r'name="workflow_type" value="([^"]*)"', form).group(1)
    client.post(PAGE, {"workflow_type": scope, "intermediate_days": "3"})
    assert RetentionPolicy.objects.get(tenant=acme, workflow_type="").intermediate_days == 30
    assert RetentionPolicy.objects.get(tenant=acme, workflow_type="ext").intermediate_days == 3


def test_after_saving_the_page_shows_the_saved_scope_even_with_odd_characters(alice, acme):
    workflow_register(tenant=acme, workflow_type="r&d#1", version="1", definition=SIMPLE_DEFINITION)
    response = signed_in(alice).post(
        PAGE, {"workflow_type": "r&d#1", "intermediate_days": "4"}, follow=True
    )
    html = response.content.decode()
    assert '<input type="hidden" name="workflow_type" value="r&amp;d#1">' in policy_form(html)
    assert re.search(r'name="intermediate_days"[^>]*value="4"', html)


def test_an_unknown_scope_in_the_address_shows_the_default_and_says_so(alice, acme, workflow):
    save(acme, "", intermediate_days=30)
    response = signed_in(alice).get(PAGE, {"workflow_type": "ghost"})
    html = response.content.decode()
    assert response.status_code == 404
    assert re.search(r'id="scope-error"[^>]*>There is no workflow of type', html)
    assert '<input type="hidden" name="workflow_type" value="">' in policy_form(html)
    assert "all workflows (default)</h2>" in html


# --- policies only for the tenant's workflow types --------------------------------------------
def test_a_policy_for_a_workflow_type_the_tenant_does_not_have_is_refused(
    alice, acme, globex, workflow
):
    workflow_register(
        tenant=globex, workflow_type="billing", version="1", definition=SIMPLE_DEFINITION
    )
    client = signed_in(alice)
    for workflow_type in ("ghost", "billing"):  # nowhere, and only in another tenant
        response = client.post(PAGE, {"workflow_type": workflow_type, "intermediate_days": "3"})
        html = response.content.decode()
        assert response.status_code == 422
        errors = re.search(r'<ul class="error" id="policy-errors".*?</ul>', html, re.S).group(0)
        assert f"There is no workflow of type \u201c{workflow_type}\u201d in this tenant" in errors
        preview = client.post(
            PREVIEW,
            {"workflow_type": workflow_type, "intermediate_days": "3"},
            HTTP_HX_REQUEST="true",
        )
        assert preview.status_code == 422
        assert "There is no workflow of type" in preview.content.decode()
    assert not RetentionPolicy.objects.exists()
    assert not AuditEvent.objects.filter(action="retention.policy_set").exists()
    with pytest.raises(InvalidRequest):
        save(acme, "billing", intermediate_days=3)
    save(acme, "research", intermediate_days=3)  # a type the tenant has is accepted


def test_a_refused_preview_answers_its_partial_with_a_4xx(alice, finished):
    client = signed_in(alice)
    for body in (
        {"intermediate_days": "30", "run_expiry_days": "7"},
        {"intermediate_days": "soon"},
    ):
        response = client.post(PREVIEW, body, HTTP_HX_REQUEST="true")
        html = response.content.decode()
        assert response.status_code == 422
        assert html.lstrip().startswith('<div id="retention-preview"') and "<html" not in html
        assert 'id="preview-problem"' in html


# --- removing --------------------------------------------------------------------------------
def test_removing_a_policy_that_does_not_exist_says_so(alice, acme, workflow):
    save(acme, "research", intermediate_days=5)
    client = signed_in(alice)
    response = client.post(REMOVE, {"workflow_type": "", "confirm": "1"})
    html = response.content.decode()
    assert response.status_code == 404
    assert re.search(r'id="remove-error"[^>]*>There is no saved policy for the default', html)
    assert RetentionPolicy.objects.filter(workflow_type="research").exists()
    assert not AuditEvent.objects.filter(action="retention.policy_removed").exists()
    response = client.post(REMOVE, {"workflow_type": "research", "confirm": "1"}, follow=True)
    assert "Policy for research removed." in response.content.decode()
    assert not RetentionPolicy.objects.exists()
