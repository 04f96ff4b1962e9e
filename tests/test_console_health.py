"""The health page: status counts, stuck runs, looping runs, stalled operations, workers."""

from __future__ import annotations

import re
from datetime import timedelta
from unittest import mock

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from checkpoints.models import Run, WorkerHeartbeat
from tests.console_data import plain_run, story_run


def health(user, **params) -> str:  # noqa: ANN001, ANN003
    client = Client()
    client.force_login(user)
    response = client.get(reverse("console:health"), params)
    assert response.status_code == 200
    html = response.content.decode()
    assert "{#" not in html and "{%" not in html  # no template syntax leaks into the page
    return html


def test_health_shows_what_an_admin_watches(alice, bob, acme, workflow):  # noqa: ANN001
    story = story_run(acme, bob)
    # Checkpoints are immutable (a trigger on PostgreSQL), so the old one is made in the past.
    with mock.patch("django.utils.timezone.now", return_value=timezone.now() - timedelta(days=3)):
        old = plain_run(acme, bob)
    done = plain_run(acme, bob)
    Run.objects.filter(pk=done.pk).update(status="succeeded")
    Run.objects.filter(pk=story.pk).update(restore_count=9)
    WorkerHeartbeat.objects.create(worker_id="w-fresh", hostname="h1", last_seen_at=timezone.now())
    WorkerHeartbeat.objects.create(
        worker_id="w-gone", hostname="h2", last_seen_at=timezone.now() - timedelta(hours=1)
    )

    html = health(alice)
    assert re.search(r'data-status="running">1<', html)
    assert re.search(r'data-status="waiting_approval">1<', html)
    assert re.search(r'data-status="succeeded">1<', html)
    assert '<strong id="oldest-age">3' in html and "days" in html
    oldest = re.search(r'<ul id="oldest-runs">.*?</ul>', html, re.S).group(0)
    assert oldest.index(str(old.pk)[:8]) < oldest.index(str(story.pk)[:8])
    assert str(done.pk)[:8] not in oldest  # finished runs are not stuck
    assert '<strong id="restored-count">1<' in html
    assert '<strong id="stalled-count">1<' in html
    assert f"publish-{story.pk}" in html
    assert '<strong id="workers-recent">1<' in html
    assert "w-gone" in html and '<span class="badge badge-bad">dead</span>' in html
    assert 'id="workers-clock-off"' not in html  # no worker measured a clock off


def test_health_shows_a_worker_whose_clock_is_off_the_databases(alice, acme):  # noqa: ANN001
    WorkerHeartbeat.objects.create(
        worker_id="w-skewed", last_seen_at=timezone.now(), clock_offset_seconds=120.4
    )
    WorkerHeartbeat.objects.create(
        worker_id="w-right", last_seen_at=timezone.now(), clock_offset_seconds=0.01
    )
    html = health(alice)
    assert re.search(r'id="workers-clock-off">.*?<strong>1</strong>', html, re.S)
    row = re.search(r"<tr><td class=\"mono\">w-skewed</td>.*?</tr>", html, re.S).group(0)
    assert "120.4 s" in row and "clock off" in row
    row = re.search(r"<tr><td class=\"mono\">w-right</td>.*?</tr>", html, re.S).group(0)
    assert "0.0 s" in row and "clock off" not in row


def test_the_restore_threshold_is_adjustable(alice, bob, acme, workflow):  # noqa: ANN001
    run = plain_run(acme, bob)
    Run.objects.filter(pk=run.pk).update(restore_count=2)
    assert '<strong id="restored-count">0<' in health(alice)
    assert '<strong id="restored-count">1<' in health(alice, restored_more_than=1)
    assert '<strong id="restored-count">0<' in health(alice, restored_more_than="many")


def test_health_counts_only_the_current_tenant(alice, charlie, globex):  # noqa: ANN001
    from checkpoints.services.workflows import workflow_register
    from tests.factories import SIMPLE_DEFINITION

    workflow_register(
        tenant=globex, workflow_type="research", version="1", definition=SIMPLE_DEFINITION
    )
    plain_run(globex, charlie)
    html = health(alice)
    assert re.search(r'data-status="running">0<', html)


@pytest.mark.parametrize(("who", "status"), [("alice", 200), ("bob", 200), ("carol", 403)])
def test_operators_and_admins_open_health(request, who, status):  # noqa: ANN001
    client = Client()
    client.force_login(request.getfixturevalue(who))
    assert client.get(reverse("console:health")).status_code == status


def test_the_health_query_count_does_not_grow_with_runs(alice, bob, acme, workflow):  # noqa: ANN001
    client = Client()
    client.force_login(alice)

    def count() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(reverse("console:health")).status_code == 200
        return len(captured.captured_queries)

    story_run(acme, bob)
    few = count()
    for index in range(10):
        run = story_run(acme, bob, objective=f"x{index}")
        Run.objects.filter(pk=run.pk).update(restore_count=10)
        WorkerHeartbeat.objects.create(worker_id=f"w{index}", last_seen_at=timezone.now())
    assert count() == few


def test_the_health_page_refreshes_its_cards_and_costs_a_304_while_nothing_changed(
    alice,
    bob,
    acme,
    workflow,  # noqa: ANN001
):
    page = health(alice)
    assert 'id="health-live"' in page and 'hx-trigger="every' in page
    client = Client()
    client.force_login(alice)
    url = reverse("console:health") + "?restored_more_than=0"
    first = client.get(url, HTTP_HX_REQUEST="true")
    fragment = first.content.decode()
    # The cards alone (no layout), the page's filter carried into the next poll.
    assert fragment.lstrip().startswith('<div id="health-live"') and "<html" not in fragment
    assert "restored_more_than=0" in fragment
    again = client.get(url, HTTP_HX_REQUEST="true", HTTP_IF_NONE_MATCH=first["ETag"])
    assert (again.status_code, again.content) == (304, b"")
    story_run(acme, bob)
    moved = client.get(url, HTTP_HX_REQUEST="true", HTTP_IF_NONE_MATCH=first["ETag"])
    assert moved.status_code == 200 and moved["ETag"] != first["ETag"]
