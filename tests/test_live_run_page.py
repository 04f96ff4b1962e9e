"""The live run page (issue 29, item 2, in part): the actions panel offers only what the
service accepts (each offer asks the function the service raises its refusal from), a
finished run's page stops polling, the polled snapshot answers 304 when nothing changed,
and once the run moved on the poll withdraws the page's (now stale) actions."""

from __future__ import annotations

import re

import pytest
from django.db import transaction
from django.test import Client

from cairn.errors import CairnError
from checkpoints.models import RunStatus
from console.actions import actions_available
from runtime.services.actions import resume_check, run_grant_budget
from runtime.services.cancel import run_cancel
from runtime.services.pause import run_pause
from runtime.services.retry import run_retry
from tenants.services import Actor
from tests.actions_support import advance, worker_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def console(bob) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(bob)
    return client


def spent(acme, bob, status: str = "failed"):  # noqa: ANN001, ANN201
    """A run whose token budget is used up, in ``status``."""
    run = worker_run(acme, bob, budget={"max_tokens": 10})
    return advance(
        run, bob, "draft_answer", envelope={"budgets": {"tokens_used": 10}}, status=status
    )


def offered(client, run) -> set[str]:  # noqa: ANN001
    page = client.get(f"/runs/{run.pk}/").content.decode()
    return set(re.findall(r'data-action="([a-z_]+)"', page))


def test_resume_is_not_offered_on_a_run_whose_budget_is_spent(console, acme, bob):
    run = spent(acme, bob)
    assert run.status == RunStatus.FAILED
    with pytest.raises(CairnError):
        resume_check(run)
    actions = offered(console, run)
    assert "resume" not in actions
    assert "retry" not in actions  # a retry is refused for the same reason
    assert "cancel" not in actions  # a failed run has nothing to cancel
    assert "grant_budget" in actions  # what the run needs


class _Undo(Exception):
    pass


def accepted(call) -> bool:  # noqa: ANN001
    """Whether the service accepts ``call`` (its writes are rolled back either way)."""
    try:
        with transaction.atomic():
            call()
            raise _Undo
    except _Undo:
        return True
    except CairnError:
        return False


@pytest.mark.parametrize("status", ["running", "failed", "paused_for_review", "waiting_retry"])
def test_every_action_the_panel_offers_the_service_accepts(acme, bob, status):
    actor = Actor(user=bob)
    fresh = worker_run(acme, bob, budget={"max_tokens": 10})
    runs = [spent(acme, bob, status), advance(fresh, bob, "draft_answer", status=status)]
    cancelled = worker_run(acme, bob)
    run_cancel(tenant=acme, run_id=cancelled.pk, reason="r", actor=actor)
    runs.append(type(cancelled).objects.get(pk=cancelled.pk))
    for run in runs:
        names = {name for name, _ in actions_available(run, [])["actions"]}
        calls = {
            "resume": lambda r=run: resume_check(r),
            "cancel": lambda r=run: run_cancel(tenant=acme, run_id=r.pk, reason="r", actor=actor),
            "retry": lambda r=run: run_retry(
                tenant=acme, run_id=r.pk, step="draft", reason="r", actor=actor
            ),
            "pause": lambda r=run: run_pause(tenant=acme, run_id=r.pk, reason="r", actor=actor),
            "grant_budget": lambda r=run: run_grant_budget(
                tenant=acme, run_id=r.pk, tokens=5, reason="r", actor=actor
            ),
        }
        for name, call in calls.items():
            assert accepted(call) == (name in names), (run.status, name)


def test_a_finished_runs_page_does_not_poll(console, acme, bob):
    running = worker_run(acme, bob)
    page = console.get(f"/runs/{running.pk}/").content.decode()
    assert 'data-polling="on"' in page and 'hx-trigger="every' in page
    run_cancel(tenant=acme, run_id=running.pk, reason="r", actor=Actor(user=bob))
    done = type(running).objects.get(pk=running.pk)
    page = console.get(f"/runs/{done.pk}/").content.decode()
    assert 'data-polling="off"' in page
    assert 'hx-trigger="every' not in page
    # The poll that sees the run finish returns a snapshot that polls no more.
    fragment = console.get(f"/runs/{done.pk}/snapshot/?seen={running.version}").content
    assert b'data-polling="off"' in fragment and b"hx-trigger" not in fragment


def test_the_snapshot_answers_304_while_nothing_changed(console, acme, bob):
    run = worker_run(acme, bob)
    url = f"/runs/{run.pk}/snapshot/?seen={run.version}"
    first = console.get(url)
    assert first.status_code == 200 and first["ETag"]
    assert first["Cache-Control"] == "private, no-cache"
    again = console.get(url, headers={"If-None-Match": first["ETag"]})
    assert (again.status_code, again.content) == (304, b"")
    assert again["ETag"] == first["ETag"]
    advance(run, bob, "draft_answer")
    moved = console.get(url, headers={"If-None-Match": first["ETag"]})
    assert moved.status_code == 200 and moved["ETag"] != first["ETag"]


def test_once_the_run_moved_the_poll_brings_every_card_up_to_date(console, acme, bob):
    run = worker_run(acme, bob)
    loaded = run.version
    assert "cancel" in offered(console, run)
    failed = advance(run, bob, "draft_answer", status="failed")
    fragment = console.get(f"/runs/{run.pk}/snapshot/?seen={loaded}").content.decode()
    # The actions the run allows now (Cancel gone from a failed run), out of band…
    assert (
        'id="run-actions" class="card" aria-labelledby="run-actions-title" hx-swap-oob="true"'
        in fragment
    )
    assert 'data-action="cancel"' not in fragment and 'data-action="resume"' in fragment
    assert f'data-field="action-version">{failed.version}<' in fragment
    # …and every card below: the state machine, the timeline with the new checkpoint, the
    # approvals and the audit trail.
    assert '<div id="run-live" hx-swap-oob="true">' in fragment
    assert f'data-sequence="{failed.checkpoint_sequence}"' in fragment
    for card in ('id="machine-title"', 'id="timeline"', 'id="run-approvals"', 'id="audit"'):
        assert card in fragment, card
    assert f"moved on from version {loaded} to {failed.version}" in fragment
    # The next poll compares with the version the page now shows.
    assert f"seen={failed.version}" in fragment and f"seen={loaded}" not in fragment
    # Not moved: the panels are left alone (an open form in them survives the poll).
    still = console.get(f"/runs/{run.pk}/snapshot/?seen={failed.version}").content.decode()
    assert 'id="run-actions"' not in still and 'id="run-live"' not in still


def test_the_poll_keeps_the_pages_of_checkpoints_the_page_shows(console, acme, bob):
    run = worker_run(acme, bob)
    loaded = run.version
    advance(run, bob, "draft_answer")
    url = f"/runs/{run.pk}/snapshot/?seen={loaded}&checkpoints_before=2"
    fragment = console.get(url).content.decode()
    assert 'data-sequence="1"' in fragment and 'data-sequence="2"' not in fragment
    assert "checkpoints_before=2" in fragment  # the next poll asks for the same page


def test_the_runs_lists_polled_rows_and_counts_answer_304_while_nothing_changed(console, acme, bob):
    run = worker_run(acme, bob)
    tags = {}
    for url in (f"/runs/rows/?ids={run.pk}", "/runs/counts/"):
        first = console.get(url)
        assert first.status_code == 200 and first["ETag"], url
        again = console.get(url, headers={"If-None-Match": first["ETag"]})
        assert (again.status_code, again.content) == (304, b""), url
        tags[url] = first["ETag"]
    advance(run, bob, "draft_answer", status="failed")
    for url, tag in tags.items():
        assert console.get(url, headers={"If-None-Match": tag}).status_code == 200, url
