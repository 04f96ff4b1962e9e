"""Defects the console walkthrough found (issue 29, item 7), each pinned by a test."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints.models import Run, RunStatus
from console.actions import actions_available
from runtime.registry import workflow_ensure_registered
from runtime.services.forks import run_fork
from tenants.services import Actor
from tests.approvals_support import ask, at_review, draft, expire_now, worker_run
from tests.runtime_support import advance, start

pytestmark = pytest.mark.django_db


def signed_in(user) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(user)
    return client


def waiting_demo_run(tenant) -> Run:  # noqa: ANN001
    """A run of the demo research workflow, driven by the worker loop to its approval
    state, with its approval request raised."""
    assert workflow_ensure_registered("research", "1")
    run = start(tenant, "research", question="How do cairns help navigation?")
    for _ in range(10):
        if ApprovalRequest.objects.filter(run=run).exists():
            break
        advance(run)
    run.refresh_from_db()
    assert (run.status, run.state) == (RunStatus.WAITING_APPROVAL, "request_approval")
    return run


def test_a_fork_from_the_approval_state_waits_for_its_own_approval(acme, bob, settings):
    settings.CAIRN_DISPATCH_ON_COMMIT = False
    source = waiting_demo_run(acme)
    result = run_fork(
        tenant=acme,
        run_id=source.pk,
        from_sequence=source.checkpoint_sequence,
        reason="ask again",
        actor=Actor(user=bob),
    )
    fork = result.run
    assert (fork.state, fork.status) == ("request_approval", RunStatus.WAITING_APPROVAL)
    # Waiting for an approval, the fork offers no budget grant (the server refuses one).
    offered = [name for name, _ in actions_available(fork, [])["actions"]]
    assert "grant_budget" not in offered
    # Its first command reaches the gate, which raises the fork's own request.
    advance(fork)
    fork.refresh_from_db()
    assert fork.status == RunStatus.WAITING_APPROVAL
    own = ApprovalRequest.objects.get(run=fork)
    assert own.status == ApprovalStatus.PENDING and own.run_version == fork.version


def test_the_parent_field_names_the_parent_whatever_is_compared(acme, bob, workflow):
    from tests.console_data import story_run

    run = story_run(acme, bob)
    html = signed_in(bob).get(f"/runs/{run.pk}/checkpoints/3/?against=1").content.decode()
    parent = re.search(r"<dt>Parent</dt><dd>(.*?)</dd>", html, re.S).group(1)
    assert "#2" in parent and "#1" not in parent
    assert re.search(r"<th scope=\"col\">#1</th>", html)  # the diff is against #1


def test_an_expired_request_says_so_and_links_to_its_renewal(acme, bob, carol, settings):
    artifact = draft(acme)
    run = at_review(worker_run(acme, bob), artifact)
    request = ask(run, artifact, bob)
    expire_now(request)  # past its expiry, not yet marked by the sweep
    html = signed_in(carol).get(f"/approvals/{request.pk}/").content.decode()
    assert "the request is pending" not in html
    assert "none: the request has expired" in html
    assert 'id="newer-request"' not in html
    assert "A new request is raised" in html

    from approvals.services import approval_expire_due

    approval_expire_due()
    fresh = ApprovalRequest.objects.get(run=run, status=ApprovalStatus.PENDING)
    html = signed_in(carol).get(f"/approvals/{request.pk}/").content.decode()
    assert "none: the request has expired" in html
    assert f'href="/approvals/{fresh.pk}/" id="newer-request"' in html


def test_an_empty_reject_reason_is_reported_at_the_field(acme, bob, carol):
    artifact = draft(acme)
    run = at_review(worker_run(acme, bob), artifact)
    request = ask(run, artifact, bob)
    response = signed_in(carol).post(
        f"/approvals/{request.pk}/decision",
        {"decision": "reject", "artifact_sha256": artifact.sha256, "comment": "  "},
    )
    assert response.status_code == 400
    html = response.content.decode()
    textarea = re.search(r"<textarea[^>]*>", html).group(0)
    assert 'aria-invalid="true"' in textarea and "autofocus" in textarea
    assert 'aria-describedby="id_comment_error' in textarea
    error = re.search(r'<p class="error" id="id_comment_error"[^>]*>(.*?)</p>', html, re.S)
    assert "Give a reason for the rejection" in error.group(1)
    request.refresh_from_db()
    assert request.status == ApprovalStatus.PENDING and not request.decisions.exists()


def test_the_ignored_filters_sentence_ends_cleanly(acme, bob, workflow):
    html = (
        signed_in(bob)
        .get("/runs/?created_from=yesterday&restored_more_than=-3&state=x")
        .content.decode()
    )
    sentence = re.search(r'id="filters-left-out">(.*?)</p>', html, re.S).group(1)
    assert "; ." not in sentence and ".)" not in sentence and "..)" not in sentence
    assert sentence.endswith(".") and not sentence.endswith("..")
    assert "Created from (Enter a valid date)" in sentence
    assert "; Restored more than (" in sentence


def test_the_run_timeline_pages_on_instead_of_stopping_at_200(acme, bob, run):
    from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit

    for index in range(205):
        run.refresh_from_db()
        checkpoint_commit(
            tenant=acme,
            run_id=run.pk,
            request=CommitRequest(
                expected_version=run.version,
                state="collect_sources",
                step=f"step{index}",
                envelope={},
                actor=Actor.system("t"),
            ),
        )
    client = signed_in(bob)
    html = client.get(f"/runs/{run.pk}/").content.decode()
    timeline = re.search(r'<table id="timeline">.*?</table>', html, re.S).group(0)
    assert timeline.count("<tr data-sequence=") == 200
    older = re.search(r'href="\?checkpoints_before=(\d+)#timeline-title" rel="next"', html)
    assert older.group(1) == "7"  # the page ends at #7; the next starts below it
    html = client.get(f"/runs/{run.pk}/?checkpoints_before=7").content.decode()
    timeline = re.search(r'<table id="timeline">.*?</table>', html, re.S).group(0)
    assert re.findall(r'<tr data-sequence="(\d+)"', timeline) == ["6", "5", "4", "3", "2", "1"]
    assert 'rel="next">Older checkpoints' not in html and "Newest checkpoints" in html
    # A cursor that is not a number is the first page, never a 500.
    assert client.get(f"/runs/{run.pk}/?checkpoints_before=x&audit_before=-1").status_code == 200


def test_the_review_queue_and_my_decisions_page_on(acme, bob, carol, monkeypatch):
    from approvals import views
    from tests.approvals_support import decide

    monkeypatch.setattr(views, "QUEUE_LIMIT", 2)
    monkeypatch.setattr(views, "HISTORY_LIMIT", 2)
    requests = []
    for _ in range(5):
        artifact = draft(acme, f"# Draft {len(requests)}\n")
        run = at_review(worker_run(acme, bob), artifact)
        requests.append(ask(run, artifact, bob))
    client = signed_in(carol)
    html = client.get("/approvals/").content.decode()
    assert html.count('data-approval-id="') == 2 and "Page 1 of 3 (5 requests" in html
    html = client.get("/approvals/?page=3").content.decode()
    assert html.count('data-approval-id="') == 1 and 'rel="prev"' in html
    # The queue's poll keeps the page it refreshes.
    assert 'hx-get="/approvals/?page=3"' in html
    for request in requests:
        decide(request, carol, "reject", comment="no")
    html = client.get("/approvals/mine/?page=2").content.decode()
    assert html.count('data-decision="') == 2 and "Page 2 of 3 (5 decisions" in html


def test_the_cancel_preview_names_the_approval_it_closes(acme, bob):
    from console.action_specs import ACTIONS

    artifact = draft(acme)
    run = at_review(worker_run(acme, bob), artifact)
    ask(run, artifact, bob)
    run.refresh_from_db()
    lines = ACTIONS["cancel"].summary(run, {}, None).lines
    assert any("Its pending approval request is closed" in line for line in lines)


def test_a_reviewer_may_open_only_the_sources_of_the_checkpoint_under_review(acme, bob, carol):
    artifact = draft(acme)
    run = at_review(worker_run(acme, bob), artifact)
    request = ask(run, artifact, bob)
    other = draft(acme, "not a source of this request")
    client = signed_in(carol)
    assert client.get(f"/approvals/{request.pk}/sources/{artifact.pk}/").status_code == 404
    assert client.get(f"/approvals/{request.pk}/sources/{other.pk}/").status_code == 404


def test_the_hold_form_asks_for_what_the_server_accepts(alice, acme):
    from retention.policies import RUN_PREFIX_MIN

    html = signed_in(alice).get("/retention/").content.decode()
    field = re.search(r'<input id="run-hold-id"[^>]*>', html).group(0)
    assert f'minlength="{RUN_PREFIX_MIN}"' in field
    assert f"at least {RUN_PREFIX_MIN} characters" in html
    pattern = re.search(r'pattern="([^"]*)"', field).group(1)
    assert re.fullmatch(pattern.replace("\\-", "-"), "d3f7126b")
    assert not re.fullmatch(pattern.replace("\\-", "-"), "d3f7126")
