"""The runs page: filters in the URL, keyset pages, counts, live rows, fixed query count."""

from __future__ import annotations

import base64
import json
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from checkpoints.models import Run, RunStatus
from tests.console_data import plain_run, story_run


@pytest.fixture
def bob_client(bob) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(bob)
    return client


def row_ids(html: str) -> list[str]:
    return re.findall(r'data-run-id="([0-9a-f-]{36})"', html)


def get(client: Client, **params) -> str:  # noqa: ANN003
    response = client.get(reverse("console:runs"), params)
    assert response.status_code == 200
    return response.content.decode()


def test_the_runs_page_lists_the_tenants_runs_newest_first(bob_client, bob, acme, workflow):  # noqa: ANN001
    first = plain_run(acme, bob, objective="first")
    second = plain_run(acme, bob, objective="second")
    html = get(bob_client)
    assert row_ids(html) == [str(second.pk), str(first.pk)]
    assert "{#" not in html and "{%" not in html  # no template syntax leaks into the page


def test_another_tenants_runs_are_never_listed(bob_client, bob, acme, workflow, charlie, globex):  # noqa: ANN001
    from checkpoints.services.workflows import workflow_register
    from tests.factories import SIMPLE_DEFINITION

    workflow_register(
        tenant=globex, workflow_type="research", version="1", definition=SIMPLE_DEFINITION
    )
    theirs = plain_run(globex, charlie, objective="secret-of-globex")
    html = get(bob_client)
    assert str(theirs.pk) not in html
    assert "secret-of-globex" not in html


def test_filters_narrow_the_list_and_live_in_the_url(bob_client, bob, acme, workflow):  # noqa: ANN001
    waiting = story_run(acme, bob, objective="needs-review")
    running = plain_run(acme, bob, objective="still-running")
    Run.objects.filter(pk=running.pk).update(restore_count=7)

    assert row_ids(get(bob_client, status="waiting_approval")) == [str(waiting.pk)]
    assert row_ids(get(bob_client, state="collect_sources")) == [str(running.pk)]
    assert row_ids(get(bob_client, restored_more_than=5)) == [str(running.pk)]
    assert row_ids(get(bob_client, stalled="on")) == [str(waiting.pk)]
    assert row_ids(get(bob_client, waiting_approval="on")) == [str(waiting.pk)]
    assert row_ids(get(bob_client, workflow_type="research", workflow_version="1")) == [
        str(running.pk),
        str(waiting.pk),
    ]
    assert row_ids(get(bob_client, workflow_version="2")) == []
    # The status chips keep the other filters (and drop the page cursor).
    html = get(bob_client, state="review")
    assert 'href="?state=review&amp;status=running"' in html


def test_search_finds_a_run_by_id_prefix_full_id_or_objective(bob_client, bob, acme, workflow):  # noqa: ANN001
    target = plain_run(acme, bob, objective="INV-2024-77")
    plain_run(acme, bob, objective="other")
    assert row_ids(get(bob_client, q="inv-2024")) == [str(target.pk)]
    assert row_ids(get(bob_client, q=str(target.pk))) == [str(target.pk)]
    assert row_ids(get(bob_client, q=str(target.pk).replace("-", "")[:8])) == [str(target.pk)]


def test_date_ranges_filter_on_whole_days(bob_client, bob, acme, workflow):  # noqa: ANN001
    old = plain_run(acme, bob)
    new = plain_run(acme, bob)
    Run.objects.filter(pk=old.pk).update(
        created_at=timezone.now() - timedelta(days=10),
        updated_at=timezone.now() - timedelta(days=9),
    )
    today = timezone.now().date()
    assert row_ids(get(bob_client, created_from=today.isoformat())) == [str(new.pk)]
    assert row_ids(get(bob_client, created_to=(today - timedelta(days=10)).isoformat())) == [
        str(old.pk)
    ]
    assert row_ids(get(bob_client, updated_to=(today - timedelta(days=5)).isoformat())) == [
        str(old.pk)
    ]


def test_the_first_and_last_days_of_the_calendar_are_ranges_like_any_other(
    bob_client, bob, acme, workflow
):  # noqa: ANN001
    """A range to 9999-12-31 once tried to start the day after it: a 500."""
    run = plain_run(acme, bob)
    for bounds in (
        {"created_to": "9999-12-31"},
        {"updated_to": "9999-12-31", "updated_from": "0001-01-01"},
        {"created_from": "0001-01-01"},
    ):
        assert row_ids(get(bob_client, **bounds)) == [str(run.pk)], bounds


def test_an_invalid_filter_is_shown_and_ignored(bob_client, bob, acme, workflow):  # noqa: ANN001
    run = plain_run(acme, bob)
    html = get(
        bob_client, restored_more_than="lots", created_from="2024-05-02", created_to="2024-05-01"
    )
    assert "Enter a whole number." in html
    assert "The end of the range is before its start." in html
    assert str(run.pk) in html or row_ids(html) == []
    # Each invalid field points at its message, and the message is there to point at.
    described = re.findall(r'aria-describedby="([^"]+)"', html)
    assert described
    ids = set(re.findall(r'\bid="([^"]+)"', html))
    for references in described:
        for target in references.split():
            assert target in ids, target


def test_counts_per_status_ignore_the_status_filter(bob_client, bob, acme, workflow):  # noqa: ANN001
    story_run(acme, bob)
    plain_run(acme, bob)
    plain_run(acme, bob)
    page_html = get(bob_client, status="running")
    # The page asks for its counts separately, with the same filters.
    load = re.search(r'id="status-counts" hx-get="([^"]+)" hx-trigger="load, every', page_html)
    assert load and "status=running" in load.group(1)
    response = bob_client.get(load.group(1).replace("&amp;", "&"), HTTP_HX_REQUEST="true")
    html = response.content.decode()
    # The counts keep refreshing themselves (status chips stay current), with the filters.
    assert "<html" not in html and 'hx-trigger="every ' in html and "status=running" in html
    running = re.search(r'data-status="running"[^>]*>Running <span class="count">(\d+)', html)
    waiting = re.search(
        r'data-status="waiting_approval"[^>]*>Waiting Approval <span class="count">(\d+)', html
    )
    assert (running.group(1), waiting.group(1)) == ("2", "1")
    assert 'aria-current="true">Running' in html


def test_counts_follow_the_other_filters(bob_client, bob, acme, workflow):  # noqa: ANN001
    story_run(acme, bob, objective="match-me")
    plain_run(acme, bob, objective="match-me too")
    plain_run(acme, bob, objective="nope")
    response = bob_client.get(reverse("console:run_counts"), {"q": "match-me"})
    html = response.content.decode()
    assert re.search(r'>All <span class="count">2<', html)


@pytest.mark.parametrize(
    "sort", ["-created", "created", "-updated", "updated", "-restores", "restores"]
)
def test_keyset_pages_walk_every_run_once_in_order_both_ways(
    bob_client,
    bob,
    acme,
    workflow,
    settings,
    monkeypatch,
    sort,  # noqa: ANN001
):
    from console.views import runs as runs_view

    monkeypatch.setattr(runs_view, "PAGE_SIZE", 3)
    made = [plain_run(acme, bob) for _ in range(8)]
    # Ties on the sort key must still page cleanly (the primary key breaks them).
    for index, run in enumerate(made):
        Run.objects.filter(pk=run.pk).update(restore_count=index % 3)
    seen, pages, cursor = [], [], None
    while True:
        params = {"sort": sort, **({"cursor": cursor} if cursor else {})}
        html = get(bob_client, **params)
        ids = row_ids(html)
        pages.append((cursor, ids))
        seen += ids
        match = re.search(r'href="\?[^"]*cursor=([\w-]+)[^"]*" rel="next"', html)
        if not match:
            break
        cursor = match.group(1)
    assert sorted(seen) == sorted(str(r.pk) for r in made)
    assert len(seen) == len(set(seen)) == 8
    field = {"created": "created_at", "updated": "updated_at", "restores": "restore_count"}[
        sort.lstrip("-")
    ]
    expected = list(
        Run.objects.filter(tenant=acme)
        .order_by(
            f"{sort[0] if sort[0] == '-' else ''}{field}", f"{'-' if sort[0] == '-' else ''}pk"
        )
        .values_list("pk", flat=True)
    )
    assert seen == [str(pk) for pk in expected]
    # Back from the last page by its "previous" link gives the page before it.
    html = get(bob_client, sort=sort, cursor=pages[-1][0])
    previous = re.search(r'href="\?[^"]*cursor=([\w-]+)[^"]*" rel="prev"', html).group(1)
    assert row_ids(get(bob_client, sort=sort, cursor=previous)) == pages[-2][1]


def test_a_garbled_cursor_starts_at_the_first_page(bob_client, bob, acme, workflow):  # noqa: ANN001
    run = plain_run(acme, bob)
    assert row_ids(get(bob_client, cursor="not-a-cursor!")) == [str(run.pk)]


@pytest.mark.parametrize(
    ("sort", "position"),
    [
        ("-created", ["n", "2026-01-01T00:00:00+00:00", "not-a-uuid"]),
        ("-created", ["n", "2026-01-01T00:00:00", "00000000-0000-0000-0000-000000000000"]),
        ("-created", ["n", 5, "00000000-0000-0000-0000-000000000000"]),
        ("restores", ["n", 2**70, "00000000-0000-0000-0000-000000000000"]),
        ("restores", ["n", True, "00000000-0000-0000-0000-000000000000"]),
        ("restores", ["n", 0, 12]),
    ],
)
def test_a_hand_made_cursor_starts_at_the_first_page(
    bob_client, bob, acme, workflow, sort, position
):  # noqa: ANN001, E501
    run = plain_run(acme, bob)
    cursor = base64.urlsafe_b64encode(json.dumps(position).encode()).decode().rstrip("=")
    assert row_ids(get(bob_client, sort=sort, cursor=cursor)) == [str(run.pk)]


def test_the_rows_poll_refreshes_the_visible_rows_in_place(bob_client, bob, acme, workflow):  # noqa: ANN001
    first = plain_run(acme, bob)
    second = plain_run(acme, bob)
    html = get(bob_client)
    poll = re.search(r'hx-get="([^"]+)" hx-trigger="every (\d+)s" hx-swap="outerHTML"', html)
    assert poll, "the rows must poll"
    Run.objects.filter(pk=first.pk).update(status=RunStatus.FAILED, state="done")
    response = bob_client.get(poll.group(1).replace("&amp;", "&"), HTTP_HX_REQUEST="true")
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<tbody id="run-rows"')
    assert "<html" not in fragment
    assert row_ids(fragment) == [str(second.pk), str(first.pk)]
    assert "badge-failed" in fragment


def test_the_rows_poll_never_returns_another_tenants_run(bob_client, charlie, globex):  # noqa: ANN001
    from checkpoints.services.workflows import workflow_register
    from tests.factories import SIMPLE_DEFINITION

    workflow_register(
        tenant=globex, workflow_type="research", version="1", definition=SIMPLE_DEFINITION
    )
    theirs = plain_run(globex, charlie)
    response = bob_client.get(reverse("console:run_rows"), {"ids": f"{theirs.pk},junk"})
    assert response.status_code == 200
    assert row_ids(response.content.decode()) == []


# charlie is an admin too, of globex: he sees globex's runs page (acme's runs never).
@pytest.mark.parametrize(
    ("who", "status"), [("alice", 200), ("bob", 200), ("carol", 403), ("charlie", 200)]
)
def test_who_may_see_the_runs(request, who, status):  # noqa: ANN001
    client = Client()
    client.force_login(request.getfixturevalue(who))
    assert client.get(reverse("console:runs")).status_code == status
    assert client.get(reverse("console:run_rows")).status_code == status
    assert client.get(reverse("console:run_counts")).status_code == status


def _queries(client: Client, url: str, params: dict) -> int:  # noqa: ANN001
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url, params).status_code == 200
    return len(captured.captured_queries)


def test_the_runs_page_query_count_does_not_grow_with_rows(bob_client, bob, acme, workflow):  # noqa: ANN001
    story_run(acme, bob)
    url, counts = reverse("console:runs"), reverse("console:run_counts")
    filters = {"stalled": "on", "waiting_approval": "on", "q": "ticket", "sort": "-updated"}

    def measure() -> tuple[int, ...]:
        return tuple(_queries(bob_client, u, p) for u in (url, counts) for p in ({}, filters))

    few = measure()
    for index in range(25):
        story_run(acme, bob, objective=f"ticket-{index + 2}")
    many = measure()
    assert few == many
    html = get(bob_client, **filters)
    assert len(row_ids(html)) == 26


def test_the_rows_poll_query_count_does_not_grow_with_rows(bob_client, bob, acme, workflow):  # noqa: ANN001
    runs = [story_run(acme, bob, objective=f"t{index}") for index in range(12)]
    url = reverse("console:run_rows")
    few = _queries(bob_client, url, {"ids": ",".join(str(r.pk) for r in runs[:2])})
    many = _queries(bob_client, url, {"ids": ",".join(str(r.pk) for r in runs)})
    assert few == many
