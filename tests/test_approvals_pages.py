"""Reviewer pages: the queue, the review page (escaped rendering, hash, diff, time left) and
the decision form, whose refusals are shown, never swallowed."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from approvals.models import ApprovalDecision, ApprovalStatus
from checkpoints.models import RunStatus
from tests.approvals_support import ask, at_review, draft, expire_now, move

pytestmark = pytest.mark.django_db


@pytest.fixture
def artifact(acme):  # noqa: ANN001
    return draft(acme)


@pytest.fixture
def waiting(run, artifact):  # noqa: ANN001
    return at_review(run, artifact)


@pytest.fixture
def pending(waiting, artifact, bob):  # noqa: ANN001
    return ask(waiting, artifact, bob)


def signed_in(user) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(user)
    return client


def post_decision(client, request, decision="approve", sha=None, comment=""):  # noqa: ANN001, ANN201
    return client.post(
        f"/approvals/{request.pk}/decision",
        {
            "decision": decision,
            "artifact_sha256": request.artifact_sha256 if sha is None else sha,
            "comment": comment,
        },
    )


def refusal_text(response) -> str:  # noqa: ANN001
    match = re.search(
        r'<div class="refusal card" role="alert"[^>]*>(.*?)</div>', response.text, re.S
    )
    assert match, "the page shows no refusal"
    return match.group(1)


# --- access ---------------------------------------------------------------------------------
def test_the_queue_needs_sign_in_and_the_review_role(pending, bob):
    assert Client().get("/approvals/").status_code == 302
    assert signed_in(bob).get("/approvals/").status_code == 403


def test_the_queue_lists_the_pending_request_with_its_hash(pending, carol):
    response = signed_in(carol).get("/approvals/")
    assert response.status_code == 200
    assert pending.artifact_sha256 in response.text
    assert f"/approvals/{pending.pk}/" in response.text


def test_an_htmx_refresh_of_the_queue_returns_only_the_queue(pending, carol):
    response = signed_in(carol).get("/approvals/", headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert "<html" not in response.text and 'id="approval-queue"' in response.text


def test_another_tenants_request_is_404_on_every_page(pending, charlie):
    client = signed_in(charlie)
    assert client.get(f"/approvals/{pending.pk}/").status_code == 404
    assert client.get(f"/approvals/{pending.pk}/status").status_code == 404
    assert post_decision(client, pending).status_code == 404
    assert not ApprovalDecision.objects.exists()


# --- the review page ----------------------------------------------------------------------------
def test_the_review_page_shows_the_artifact_its_hash_size_and_time_left(pending, carol, artifact):
    response = signed_in(carol).get(f"/approvals/{pending.pk}/")
    assert response.status_code == 200
    text = response.text
    assert artifact.sha256 in text and f"{artifact.size} bytes" in text
    assert "<h3>Cairns</h3>" in text and "<li>above the tree line</li>" in text  # markdown
    assert re.search(r"data-time-left>\s*23 h 5\d min", text)
    hidden = re.search(r'name="artifact_sha256" value="([0-9a-f]{64})"', text)
    assert hidden and hidden.group(1) == artifact.sha256  # the form posts what it displayed
    assert not re.search(r"<script(?![^>]*\bsrc=)", text)  # CSP: no inline scripts


def test_the_artifact_is_escaped_never_trusted_as_html(waiting, bob, carol):
    hostile = draft(
        waiting.tenant,
        "# Hi <img src=x onerror=alert(1)>\n\n"
        '<script>alert("x")</script> **bold** [a](javascript:x)\n',
    )
    request = ask(waiting, hostile, bob)
    text = signed_in(carol).get(f"/approvals/{request.pk}/").text
    assert "<script>alert" not in text and "<img src=x" not in text
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in text
    assert "<strong>bold</strong>" in text and 'href="javascript' not in text


def test_a_json_artifact_is_pretty_printed_and_escaped(waiting, bob, carol):
    data = {"claim": "<b>cairns</b>", "cite": 1}
    request = ask(waiting, draft(waiting.tenant, json.dumps(data), "application/json"), bob)
    text = signed_in(carol).get(f"/approvals/{request.pk}/").text
    assert "  &quot;claim&quot;: &quot;&lt;b&gt;cairns&lt;/b&gt;&quot;," in text


def test_the_review_page_diffs_against_the_previous_requests_artifact(waiting, bob, carol):
    first = draft(waiting.tenant, "line one\nline two\n", "text/plain")
    ask(waiting, first, bob)
    second = draft(waiting.tenant, "line one\nline 2, rewritten\n", "text/plain")
    request = ask(waiting, second, bob)
    text = signed_in(carol).get(f"/approvals/{request.pk}/").text
    assert '<span class="diff-del">-line two</span>' in text
    assert '<span class="diff-add">+line 2, rewritten</span>' in text
    assert first.sha256[:12] in text


def test_the_status_line_says_when_the_request_expired_while_the_page_was_open(pending, carol):
    expire_now(pending)
    response = signed_in(carol).get(f"/approvals/{pending.pk}/status")
    assert response.status_code == 200 and "<html" not in response.text
    assert "expired" in response.text


# --- deciding ---------------------------------------------------------------------------------
def test_a_reviewer_approves_on_the_page(pending, carol):
    client = signed_in(carol)
    response = post_decision(client, pending, comment="fine")
    assert response.status_code == 302 and response["Location"] == f"/approvals/{pending.pk}/"
    pending.refresh_from_db()
    assert pending.status == ApprovalStatus.APPROVED
    page = client.get(response["Location"]).text
    assert "Approved. The run continues with exactly this artifact." in page
    assert 'name="decision"' not in page  # no form for a decided request


def test_a_reviewer_rejects_on_the_page_and_the_run_fails_with_the_comment(pending, carol):
    response = post_decision(signed_in(carol), pending, "reject", comment="Unsourced claim.")
    assert response.status_code == 302
    run = pending.run
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "Unsourced claim." in run.status_reason


def test_the_page_refuses_an_expired_request_with_a_clear_message(pending, carol):
    expire_now(pending)
    response = post_decision(signed_in(carol), pending)
    assert response.status_code == 409
    assert "expired" in refusal_text(response) and 'data-code="approval_expired"' in response.text
    assert not ApprovalDecision.objects.exists()


def test_the_page_refuses_a_stale_version_with_a_clear_message(pending, carol):
    move(pending.run, "review")
    response = post_decision(signed_in(carol), pending)
    assert response.status_code == 409
    assert "moved on" in refusal_text(response)
    assert not ApprovalDecision.objects.exists()


def test_the_page_refuses_a_hash_it_did_not_display(pending, carol):
    response = post_decision(signed_in(carol), pending, sha="1" * 64)
    assert response.status_code == 409
    assert "not the one under review" in refusal_text(response)
    # The re-rendered form carries the hash of the bytes now shown, not the posted one.
    assert f'value="{pending.artifact_sha256}"' in response.text
    assert not ApprovalDecision.objects.exists()


def test_the_page_refuses_self_approval(waiting, artifact, alice):
    request = ask(waiting, artifact, alice)
    client = signed_in(alice)
    assert "someone else has to decide" in client.get(f"/approvals/{request.pk}/").text
    response = post_decision(client, request)
    assert response.status_code == 409
    assert "someone else has to decide" in refusal_text(response)
    assert not ApprovalDecision.objects.exists()


def test_the_page_refuses_a_double_decision(waiting, artifact, bob, carol):
    request = ask(waiting, artifact, bob, required_approvals=2)
    client = signed_in(carol)
    assert post_decision(client, request).status_code == 302
    response = post_decision(client, request, "reject", comment="changed my mind")
    assert response.status_code == 409
    assert "already decided" in refusal_text(response)
    assert ApprovalDecision.objects.filter(request=request).count() == 1


def test_an_incomplete_form_is_refused_not_recorded(pending, carol):
    response = signed_in(carol).post(f"/approvals/{pending.pk}/decision", {"comment": "x"})
    assert response.status_code == 400
    assert "incomplete" in refusal_text(response)
    assert not ApprovalDecision.objects.exists()


def test_an_operator_cannot_post_a_decision(pending, bob):
    assert post_decision(signed_in(bob), pending).status_code == 403


def test_the_run_page_lists_the_runs_requests_and_links_reviewers_to_them(pending, alice, bob):
    review_link = f'href="/approvals/{pending.pk}/"'
    as_admin = signed_in(alice).get(f"/runs/{pending.run_id}/")
    assert as_admin.status_code == 200
    assert pending.artifact_sha256[:12] in as_admin.text and review_link in as_admin.text
    as_operator = signed_in(bob).get(f"/runs/{pending.run_id}/")
    assert pending.artifact_sha256[:12] in as_operator.text
    assert review_link not in as_operator.text  # the review page is not theirs


def test_the_queue_query_count_does_not_grow_with_the_queue(waiting, artifact, bob, carol):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = signed_in(carol)
    ask(waiting, artifact, bob, action="publish")
    with CaptureQueriesContext(connection) as one:
        assert client.get("/approvals/").status_code == 200
    for index in range(6):
        ask(waiting, draft(waiting.tenant, f"# Draft {index}\n"), bob, action=f"send-{index}")
    with CaptureQueriesContext(connection) as seven:
        response = client.get("/approvals/")
    assert response.text.count('data-approval-id="') == 7
    assert len(seven) == len(one)
