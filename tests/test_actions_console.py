"""The console's action forms: reason, confirmation of what will happen, the version the
page loaded, refusals, permissions and htmx swaps."""

from __future__ import annotations

import pytest
from django.template import Context, Template
from django.test import Client

from checkpoints.models import ExternalOperation, Run, RunStatus
from runtime.services.leases import lease_acquire
from tenants.access import ConsoleAccess
from tenants.models import AuditEvent
from tenants.services import Actor, permissions_of
from tests.actions_support import advance, audit_events, operation, worker_run
from tests.publishing import free_port

pytestmark = pytest.mark.django_db


@pytest.fixture
def wrun(acme, bob):  # noqa: ANN001
    run = worker_run(acme, bob)
    return advance(advance(run, bob, "draft_answer"), bob, "review")


@pytest.fixture
def console(bob) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(bob)
    return client


def action_url(run, action: str) -> str:  # noqa: ANN001
    return f"/runs/{run.pk}/actions/{action}/"


def post(client, run, action: str, confirm: bool = False, **data):  # noqa: ANN001, ANN003, ANN201
    body = {"version": run.version, "reason": "because", **data}
    if confirm:
        body["confirm"] = "1"
    return client.post(action_url(run, action), body)


def test_the_run_page_offers_the_actions_with_the_version_it_shows(console, wrun):
    page = console.get(f"/runs/{wrun.pk}/").content.decode()
    for action in ("cancel", "retry", "fork"):
        assert f'data-action="{action}"' in page
    assert 'data-action="resume"' not in page  # waiting for approval: decide it instead
    assert 'data-action="grant_budget"' not in page
    assert f'<input type="hidden" name="version" value="{wrun.version}">' in page


def test_the_actions_panel_makes_no_queries_whatever_the_operations(acme, bob, wrun):
    operations = [operation(wrun, f"k{i}", "unknown") for i in range(5)]
    access = ConsoleAccess(
        tenant=acme, permissions=permissions_of(user=bob, tenant=acme), actor=Actor(user=bob)
    )
    template = Template("{% load console_actions %}{% actions_panel %}")
    context = Context({"run": wrun, "access": access, "operations": operations})
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        html = template.render(context)
    assert len(queries) == 0
    assert html.count("Record outcome…") == 5


def test_cancel_asks_for_confirmation_before_doing_anything(console, wrun):
    response = post(console, wrun, "cancel")
    html = response.content.decode()
    assert response.status_code == 200
    assert "What will happen" in html and "becomes cancelled" in html
    assert 'name="confirm" value="1"' in html
    wrun.refresh_from_db()
    assert wrun.status == RunStatus.WAITING_APPROVAL
    assert not audit_events(wrun, "run.cancel")


def test_confirmed_cancel_cancels_and_returns_to_the_run_page(console, wrun):
    response = post(console, wrun, "cancel", confirm=True, reason="customer withdrew")
    assert response.status_code == 302
    assert response["Location"] == f"/runs/{wrun.pk}/"
    wrun.refresh_from_db()
    assert wrun.status == RunStatus.CANCELLED
    (event,) = audit_events(wrun, "run.cancel")
    assert (event.actor_label, event.reason) == ("bob", "customer withdrew")
    page = console.get(response["Location"]).content.decode()
    assert "Cancelled." in page
    assert "No action applies" not in page  # a cancelled run can still be forked
    assert 'data-action="cancel"' not in page


def test_an_action_without_a_reason_is_refused_with_a_form_error(console, wrun):
    response = post(console, wrun, "cancel", confirm=True, reason="  ")
    assert "This field is required." in response.content.decode()
    wrun.refresh_from_db()
    assert wrun.status == RunStatus.WAITING_APPROVAL


# What each action's form needs besides the version and the reason, so that only the
# version can be what refuses it.
ACTION_DATA = {
    "cancel": {},
    "resume": {},
    "retry": {"step": "draft"},
    "fork": {"from_sequence": "1"},
    "grant_budget": {"attempts": "1"},
}


def written(run) -> tuple[int, int, int]:  # noqa: ANN001
    """What an action could write: runs (a fork), the run's checkpoints, its audit events."""
    return (
        Run.objects.count(),
        run.checkpoints.count(),
        AuditEvent.objects.filter(run_id=run.id).exclude(action="checkpoint.read").count(),
    )


@pytest.mark.parametrize("action", sorted(ACTION_DATA))
def test_a_stale_version_is_refused_before_confirmation(console, wrun, bob, action):
    seen = wrun.version
    moved = advance(wrun, bob, "review", status="paused_for_review")
    before = written(moved)
    response = console.post(
        action_url(moved, action),
        {"version": seen, "reason": "x", "confirm": "1", **ACTION_DATA[action]},
    )
    html = response.content.decode()
    assert f"you saw version {seen}, it is now at version {moved.version}" in html
    assert "Reload the run" in html
    version = moved.version
    moved.refresh_from_db()
    assert (moved.status, moved.version) == (RunStatus.PAUSED_FOR_REVIEW, version)
    assert written(moved) == before


def test_retry_confirms_the_move_then_appends_a_checkpoint(console, wrun):
    confirm = post(console, wrun, "retry", step="draft").content.decode()
    assert "Checkpoint #4 is appended" in confirm and "from state review to draft_answer" in confirm
    response = post(console, wrun, "retry", confirm=True, step="draft")
    assert response.status_code == 302
    wrun.refresh_from_db()
    assert (wrun.state, wrun.checkpoint_sequence, wrun.status) == ("draft_answer", 4, "running")


def test_retry_offers_only_the_workflows_steps(console, wrun):
    form = console.get(action_url(wrun, "retry")).content.decode()
    assert '<option value="draft">draft (state draft_answer)</option>' in form
    response = post(console, wrun, "retry", confirm=True, step="review")
    assert "Select a valid choice" in response.content.decode()
    wrun.refresh_from_db()
    assert wrun.state == "review"


def test_fork_confirmation_names_the_effects_that_may_happen_again(console, wrun, bob):
    run = advance(wrun, bob, "publish")
    operation(run, "pub-1", "confirmed")
    german = '{"question": "why?", "lang": "de"}'
    html = post(console, run, "fork", from_sequence=2, inputs=german).content
    html = html.decode()
    assert 'data-warning="pub-1"' in html
    assert "confirmed after checkpoint 2" in html
    assert "Inputs changed: lang." in html
    assert Run.objects.count() == 1
    response = post(console, run, "fork", confirm=True, from_sequence=2, inputs=german)
    fork = Run.objects.exclude(pk=run.pk).get()
    assert response["Location"] == f"/runs/{fork.pk}/"
    assert (fork.forked_from_run_id, fork.forked_from_checkpoint.sequence) == (run.pk, 2)
    page = console.get(response["Location"]).content.decode()
    assert "may happen again: pub-1" in page
    assert 'id="fork-parent"' in page


def test_fork_refuses_inputs_that_are_not_a_json_object(console, wrun):
    html = post(console, wrun, "fork", from_sequence=1, inputs="[1]").content.decode()
    assert "must be a JSON object" in html
    html = post(console, wrun, "fork", from_sequence=1, inputs="{nope").content.decode()
    assert "This is not JSON" in html
    html = post(console, wrun, "fork", from_sequence=1, inputs=f'{{"n": {2**60}}}').content.decode()
    assert "This cannot be stored: the inputs.n is an integer outside" in html
    assert Run.objects.filter(forked_from_run=wrun).count() == 0


def test_grant_budget_shows_the_limits_before_and_after(console, acme, bob):
    run = worker_run(acme, bob, budget={"max_attempts": 2})
    failed = advance(run, bob, "collect_sources", status="failed")
    html = post(console, failed, "grant_budget", attempts=3).content.decode()
    assert "Attempts: limit 2 → 5." in html and "stays failed until you resume it" in html
    post(console, failed, "grant_budget", confirm=True, attempts=3)
    failed.refresh_from_db()
    assert failed.budget_limits["max_attempts"] == 5
    empty = post(console, failed, "grant_budget").content.decode()
    assert "Name what to grant" in empty


def test_grant_budget_is_blocked_while_a_worker_holds_the_lease(console, acme, bob):
    run = worker_run(acme, bob, budget={"max_attempts": 3})
    lease_acquire(
        tenant=acme, run_id=run.id, owner="worker-a", ttl_seconds=60, expected_version=run.version
    )
    html = post(console, run, "grant_budget", attempts=2).content.decode()
    assert "A worker is running this run right now (worker-a holds its lease" in html
    assert "Grant the budget</button>" not in html  # nothing to confirm
    # Confirming anyway (a page opened before the worker took the lease) changes nothing.
    html = post(console, run, "grant_budget", confirm=True, attempts=2).content.decode()
    assert "grant again when it pauses, waits or fails" in html
    run.refresh_from_db()
    assert (run.version, run.budget_limits["max_attempts"]) == (1, 3)


def test_resume_is_blocked_while_the_budget_is_exhausted(console, acme, bob):
    run = worker_run(acme, bob, budget={"max_attempts": 1})
    failed = advance(
        run, bob, "collect_sources", envelope={"budgets": {"attempts_used": 1}}, status="failed"
    )
    html = post(console, failed, "resume").content.decode()
    assert "Grant more budget first" in html
    assert "Resume the run</button>" not in html


def test_the_confirmation_shows_the_refusals_of_the_action_before_anyone_confirms(
    console, acme, bob
):
    # Each of these was once described as if it would happen, then refused at the last click.
    run = worker_run(acme, bob, budget={"max_attempts": 3})
    cancelled = advance(run, bob, "draft_answer", status="failed")
    Run.objects.filter(pk=cancelled.pk).update(status=RunStatus.CANCELLED)
    cancelled.refresh_from_db()
    html = post(console, cancelled, "resume").content.decode()
    assert "The run is cancelled; it cannot be resumed." in html
    assert "Resume the run</button>" not in html

    failed = advance(worker_run(acme, bob, budget={"max_attempts": 3}), bob, "draft_answer")
    failed = advance(failed, bob, "draft_answer", status="failed")
    # Only the limits the run has are offered; a forged field is ignored, not granted.
    form = console.get(action_url(failed, "grant_budget")).content.decode()
    assert 'name="attempts"' in form and 'name="tokens"' not in form
    html = post(console, failed, "grant_budget", tokens=100).content.decode()
    assert "Name what to grant" in html
    assert "Grant the budget</button>" not in html

    finished = advance(
        advance(advance(worker_run(acme, bob), bob, "draft_answer"), bob, "review"), bob, "publish"
    )
    finished = advance(finished, bob, "done")
    # The form does not offer a terminal checkpoint (or one past the approval state), and
    # defaults to the newest one a fork may start from.
    form = console.get(action_url(finished, "fork")).content.decode()
    assert f'<option value="{finished.checkpoint_sequence}"' not in form
    assert '<option value="3" selected>' in form
    html = post(
        console, finished, "fork", from_sequence=finished.checkpoint_sequence
    ).content.decode()
    assert "Select a valid choice" in html
    assert "Create the fork</button>" not in html
    for row in (cancelled, failed, finished):
        before = row.version
        row.refresh_from_db()
        assert row.version == before
    assert not Run.objects.filter(forked_from_run=finished).exists()


def test_a_refusal_of_the_service_is_shown_as_a_sentence(console, wrun):
    operation(wrun, "pub-1", "unknown")
    html = post(console, wrun, "retry", confirm=True, step="draft").content.decode()
    assert "have no known outcome" in html or "outcome is not settled" in html
    wrun.refresh_from_db()
    assert wrun.state == "review"


def test_recording_an_outcome_finishes_a_waiting_cancel(console, wrun):
    operation(wrun, "pub-1", "pending")
    post(console, wrun, "cancel", confirm=True)
    wrun.refresh_from_db()
    assert wrun.status == RunStatus.CANCELLING
    page = console.get(f"/runs/{wrun.pk}/").content.decode()
    assert f"/runs/{wrun.pk}/operations/pub-1/outcome/" in page
    url = f"/runs/{wrun.pk}/operations/pub-1/outcome/"
    body = {"version": wrun.version, "reason": "seen on the site", "outcome": "confirmed"}
    missing_id = console.post(url, body).content.decode()
    assert "Give the provider" in missing_id
    confirm = console.post(url, {**body, "provider_operation_id": "pp-7"}).content.decode()
    assert "recorded as confirmed with provider id pp-7" in confirm
    assert "becomes cancelled" in confirm
    response = console.post(url, {**body, "provider_operation_id": "pp-7", "confirm": "1"})
    assert response.status_code == 302
    op = ExternalOperation.objects.get(idempotency_key="pub-1")
    wrun.refresh_from_db()
    assert (op.status, op.provider_operation_id, wrun.status) == ("confirmed", "pp-7", "cancelled")


def test_a_reserved_operation_of_a_cancelling_run_gets_an_outcome_form(console, wrun, settings):
    settings.CAIRN_PUBLISHING_URL = f"http://127.0.0.1:{free_port()}"  # nobody answers
    reserved = operation(wrun, "pub-1", "reserved")
    reserved.provider = "publishing"
    reserved.save(update_fields=["provider"])
    post(console, wrun, "cancel", confirm=True)
    wrun.refresh_from_db()
    reserved.refresh_from_db()
    assert (wrun.status, reserved.status) == (RunStatus.CANCELLING, "reserved")
    url = f"/runs/{wrun.pk}/operations/pub-1/outcome/"
    assert url in console.get(f"/runs/{wrun.pk}/").content.decode()
    body = {"version": wrun.version, "reason": "the worker stopped first", "outcome": "failed"}
    confirm = console.post(url, body).content.decode()
    assert "It is only reserved: Cairn has no record that it was sent" in confirm
    assert "becomes cancelled" in confirm
    assert console.post(url, {**body, "confirm": "1"}).status_code == 302
    reserved.refresh_from_db()
    wrun.refresh_from_db()
    assert (reserved.status, wrun.status) == ("failed", "cancelled")
    (event,) = audit_events(wrun, "operation.outcome_recorded")
    assert event.details["from"] == "reserved"


def test_htmx_gets_the_form_as_a_fragment_and_a_client_redirect_at_the_end(console, wrun):
    fragment = console.get(
        action_url(wrun, "cancel") + f"?version={wrun.version}", HTTP_HX_REQUEST="true"
    )
    html = fragment.content.decode()
    assert "<html" not in html and 'class="action-body card"' in html
    assert 'hx-target="closest .action-body"' in html
    done = console.post(
        action_url(wrun, "cancel"),
        {"version": wrun.version, "reason": "x", "confirm": "1"},
        HTTP_HX_REQUEST="true",
    )
    assert done.status_code == 200
    assert done["HX-Redirect"] == f"/runs/{wrun.pk}/"


@pytest.mark.parametrize("action", sorted(ACTION_DATA))
def test_a_reviewer_may_not_open_or_post_an_action(carol, wrun, action):
    client = Client()
    client.force_login(carol)
    before = written(wrun)
    assert client.get(action_url(wrun, action)).status_code == 403
    body = {"version": wrun.version, "reason": "x", "confirm": "1", **ACTION_DATA[action]}
    assert client.post(action_url(wrun, action), body).status_code == 403
    version = wrun.version
    wrun.refresh_from_db()
    assert (wrun.status, wrun.version) == (RunStatus.WAITING_APPROVAL, version)
    assert written(wrun) == before


@pytest.mark.parametrize("action", sorted(ACTION_DATA))
def test_another_tenants_run_is_not_found(charlie, wrun, action):
    client = Client()
    client.force_login(charlie)
    before = written(wrun)
    assert client.get(action_url(wrun, action)).status_code == 404
    body = {"version": wrun.version, "reason": "x", "confirm": "1", **ACTION_DATA[action]}
    assert client.post(action_url(wrun, action), body).status_code == 404
    assert client.get(f"/runs/{wrun.pk}/operations/x/outcome/").status_code == 404
    version = wrun.version
    wrun.refresh_from_db()
    assert (wrun.status, wrun.version) == (RunStatus.WAITING_APPROVAL, version)
    assert written(wrun) == before


def test_an_unknown_action_is_not_found(console, wrun):
    assert console.get(action_url(wrun, "explode")).status_code == 404


def test_signed_out_visitors_are_sent_to_sign_in(client, wrun):
    response = client.get(action_url(wrun, "cancel"))
    assert response.status_code == 302 and "/login/" in response["Location"]
