"""Bulk actions in the console (issue 29, item 3): the runs list's filter or ticks select the
runs, a dry run shows the count and each refusal's reason, the confirmation queues the work,
and the action's page shows its progress and, once finished, its refusals a page at a time."""

from __future__ import annotations

import pytest

from checkpoints.models import BulkAction, Run, RunStatus
from runtime.services.bulk import bulk_action_process
from runtime.services.cancel import run_cancel
from tenants.models import AuditEvent
from tenants.services import Actor
from tests.actions_support import worker_run

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_dispatch(settings):  # noqa: ANN001
    settings.CAIRN_DISPATCH_ON_COMMIT = False


@pytest.fixture
def web(client, bob):  # noqa: ANN001
    client.force_login(bob)
    return client


def test_the_runs_list_links_its_filter_and_ticks_to_a_bulk_action(web, acme, bob):
    run = worker_run(acme, bob)
    page = web.get("/runs/", {"status": "running"}).content.decode()
    assert 'href="/runs/bulk/?status=running"' in page
    assert f'name="run" value="{run.pk}" form="bulk-ticked"' in page
    assert "<script>" not in page


def test_a_bulk_cancel_by_the_lists_filter_from_dry_run_to_summary(web, acme, bob):
    running = [worker_run(acme, bob) for _ in range(3)]
    gone = worker_run(acme, bob)
    run_cancel(tenant=acme, run_id=gone.pk, reason="gone", actor=Actor(user=bob))
    Run.objects.filter(pk=gone.pk).update(status=RunStatus.CANCELLED)
    url = "/runs/bulk/?workflow_type=coded"

    form = web.get(url).content.decode()
    assert "<strong data-selected-count>4</strong> runs" in form
    assert "Workflow: coded" in form

    dry = web.post(url, {"action": "cancel", "reason": "incident 7"}).content.decode()
    assert "<span data-actionable>3</span> of 4 runs" in dry
    assert "The run is already cancelled; there is nothing to cancel." in dry
    assert not BulkAction.objects.exists()

    done = web.post(url, {"action": "cancel", "reason": "incident 7", "confirm": "1"})
    bulk = BulkAction.objects.get()
    assert done.status_code == 302 and done["Location"] == f"/runs/bulk/{bulk.pk}/"
    assert bulk.selection == {"filter": {"workflow_type": "coded"}}
    page = web.get(done["Location"]).content.decode()
    assert 'hx-get="/runs/bulk/' in page and "0 of 4 runs processed" in page

    bulk_action_process(bulk_action_id=bulk.pk)
    page = web.get(done["Location"]).content.decode()
    assert '<progress id="bulk-bar" max="4" value="4">' in page
    assert "hx-get" not in page.split('id="bulk-progress"')[1].split(">")[0]
    assert "Cancel: 3 of 4 runs done, 1 refused." in page
    assert "The run is already cancelled; there is nothing to cancel." in page
    assert Run.objects.filter(pk__in=[r.pk for r in running], status="cancelled").count() == 3
    assert AuditEvent.objects.filter(action="run.cancel", reason="incident 7").count() == 3


def test_ticked_runs_and_a_missing_reason(web, acme, bob):
    one, two, _ = (worker_run(acme, bob) for _ in range(3))
    url = f"/runs/bulk/?run={one.pk}&run={two.pk}"
    assert "<strong data-selected-count>2</strong>" in web.get(url).content.decode()
    refused = web.post(url, {"action": "pause", "reason": ""}).content.decode()
    assert 'aria-invalid="true"' in refused
    web.post(url, {"action": "pause", "reason": "hold", "confirm": "1"})
    bulk = BulkAction.objects.get()
    assert (bulk.total, bulk.selection) == (2, {"ticked": True})


def test_a_retry_without_a_step_is_refused_at_its_field(web, acme, bob):
    worker_run(acme, bob)
    page = web.post("/runs/bulk/", {"action": "retry", "reason": "again"}).content.decode()
    assert "Name the step a retry runs again." in page
    assert not BulkAction.objects.exists()


def test_a_selection_past_the_cap_says_so(web, acme, bob, settings):
    settings.CAIRN_BULK_ACTION_MAX_RUNS = 1
    worker_run(acme, bob)
    worker_run(acme, bob)
    response = web.get("/runs/bulk/")
    assert response.status_code == 400
    assert "The selection holds 2 runs; a bulk action takes at most 1" in response.content.decode()


def test_refusals_are_paginated_and_another_tenants_action_is_404(
    web, acme, bob, client, charlie, monkeypatch
):
    monkeypatch.setattr("console.views.bulk.REFUSALS_PER_PAGE", 2)
    runs = [worker_run(acme, bob) for _ in range(3)]
    ticks = "&".join(f"run={r.pk}" for r in runs)
    web.post(f"/runs/bulk/?{ticks}", {"action": "resume", "reason": "go", "confirm": "1"})
    bulk = bulk_action_process(bulk_action_id=BulkAction.objects.get().pk)
    assert bulk.refused == 3
    first = web.get(f"/runs/bulk/{bulk.pk}/").content.decode()
    assert first.count("The run is already running; there is nothing to resume.") == 2
    assert "Page 1 of 2" in first
    second = web.get(f"/runs/bulk/{bulk.pk}/", {"page": 2}).content.decode()
    assert second.count("The run is already running; there is nothing to resume.") == 1
    progress = web.get(f"/runs/bulk/{bulk.pk}/progress/").content.decode()
    assert 'data-status="finished"' in progress

    client.force_login(charlie)
    assert client.get(f"/runs/bulk/{bulk.pk}/").status_code == 404
    assert client.get(f"/runs/bulk/{bulk.pk}/progress/").status_code == 404


def test_past_bulk_actions_are_listed_newest_first_a_page_at_a_time(
    web, acme, bob, globex, charlie, monkeypatch
):
    from runtime.services.bulk import bulk_action_start

    monkeypatch.setattr("console.views.bulk.HISTORY_PER_PAGE", 2)
    run = worker_run(acme, bob)
    started = [
        bulk_action_start(
            tenant=acme,
            actor=Actor(user=bob),
            action=action,
            reason=f"why {action}",
            run_ids=[run.pk],
            selection={"ticked": True},
        )
        for action in ("pause", "unpause", "cancel")
    ]
    bulk_action_start(
        tenant=globex,
        actor=Actor(user=charlie),
        action="pause",
        reason="globex's own",
        run_ids=[worker_run(globex, charlie).pk],
        selection={"ticked": True},
    )
    first = web.get("/runs/bulk/history/").content.decode()
    rows = first.split('id="bulk-history"')[1]
    # Newest first, each linking to its page, with its counts, status and reason.
    assert rows.index(f"/runs/bulk/{started[2].pk}/") < rows.index(f"/runs/bulk/{started[1].pk}/")
    assert f"/runs/bulk/{started[0].pk}/" not in rows and "Page 1 of 2" in first
    assert "why cancel" in rows and "globex's own" not in first
    second = web.get("/runs/bulk/history/", {"page": 2}).content.decode()
    assert f"/runs/bulk/{started[0].pk}/" in second
    assert 'href="/runs/bulk/history/"' in web.get("/runs/").content.decode()
