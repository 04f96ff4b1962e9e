"""Runners are told, not polling: ``GET /runs/{id}/next?wait=`` answers as soon as the next
command is due (a decision, a retry coming due, an operator's resume), and signed webhooks
deliver the same events from the outbox, retried with backoff."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
from django.utils import timezone
from standardwebhooks import Webhook

from checkpoints.models import Run, RunStatus, WebhookDelivery
from runtime.services.actions import run_resume
from runtime.services.webhooks import webhooks_deliver
from runtime.status import run_pause_for_review
from tenants.services import Actor, token_issue
from tests.approvals_support import ask, at_review, decide, draft


def _token(user, tenant) -> str:  # noqa: ANN001
    return token_issue(tenant=tenant, user=user, actor=Actor.system("test"))[1]


def _get(url: str, token: str) -> tuple[int, dict]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=40) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


class _Waiter(threading.Thread):
    """One long-poll request in the background; ``elapsed`` is how long it took."""

    def __init__(self, url: str, token: str) -> None:
        super().__init__(daemon=True)
        self.url, self.token = url, token
        self.answer: tuple[int, dict] | None = None
        self.elapsed = 0.0

    def run(self) -> None:
        started = time.monotonic()
        self.answer = _get(self.url, self.token)
        self.elapsed = time.monotonic() - started


def _wait_started(waiter: _Waiter) -> None:
    waiter.start()
    time.sleep(0.8)  # the request is in the server, waiting
    assert waiter.answer is None, waiter.answer


@pytest.mark.django_db(transaction=True)
def test_the_long_poll_answers_as_soon_as_a_reviewer_approves(live_server, run, bob, carol, acme):
    artifact = draft(acme)
    run = at_review(run, artifact)
    token = _token(bob, acme)
    url = f"{live_server.url}/api/v1/runs/{run.id}/next"
    status, now = _get(url + "?wait=0", token)
    assert (status, now["due"], now["command"]) == (200, False, "wait")
    request = ask(run, artifact, bob)
    waiter = _Waiter(url + "?wait=20", token)
    _wait_started(waiter)
    decide(request, carol)
    waiter.join(timeout=25)
    status, answer = waiter.answer
    assert status == 200, answer
    assert answer["due"] is True and answer["command"] == "approval_decided"
    assert answer["approval_request_id"] == str(request.pk)
    assert waiter.elapsed < 5  # told within a moment of the decision, not at the timeout


@pytest.mark.django_db(transaction=True)
def test_the_long_poll_answers_when_a_retry_comes_due(live_server, run, bob, acme):
    due_at = timezone.now() + timedelta(seconds=2)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.WAITING_RETRY, next_eligible_at=due_at)
    started = time.monotonic()
    status, answer = _get(f"{live_server.url}/api/v1/runs/{run.id}/next?wait=20", _token(bob, acme))
    elapsed = time.monotonic() - started
    assert (status, answer["due"], answer["command"]) == (200, True, "retry")
    assert 1.0 < elapsed < 6


@pytest.mark.django_db(transaction=True)
def test_the_long_poll_answers_when_an_operator_resumes_a_paused_run(live_server, run, bob, acme):
    assert run_pause_for_review(
        run_id=run.pk, expected_version=run.version, reason="look at it", actor=Actor.system("t")
    )
    run.refresh_from_db()
    token = _token(bob, acme)
    waiter = _Waiter(f"{live_server.url}/api/v1/runs/{run.id}/next?wait=20", token)
    _wait_started(waiter)
    run_resume(tenant=acme, run_id=run.pk, expected_version=run.version, actor=Actor(user=bob))
    waiter.join(timeout=25)
    status, answer = waiter.answer
    assert (status, answer["due"], answer["command"]) == (200, True, "step")
    assert waiter.elapsed < 5


@pytest.mark.django_db(transaction=True)
def test_the_long_poll_gives_up_after_the_wait_with_due_false(live_server, run, bob, acme):
    artifact = draft(acme)
    run = at_review(run, artifact)
    started = time.monotonic()
    status, answer = _get(f"{live_server.url}/api/v1/runs/{run.id}/next?wait=1", _token(bob, acme))
    assert (status, answer["due"], answer["command"]) == (200, False, "wait")
    assert 0.9 < time.monotonic() - started < 4


@pytest.mark.django_db
@pytest.mark.parametrize("wait", ["31", "-1", "abc", "1.5"])
def test_a_wait_outside_0_to_30_seconds_is_a_400(api_as, run, bob, acme, wait):  # noqa: ANN001
    answer = api_as(bob, acme).get(f"/api/v1/runs/{run.id}/next", {"wait": wait})
    assert answer.status_code == 400
    assert answer.json()["code"] == "invalid_request"


@pytest.mark.django_db
def test_another_tenants_run_has_no_next_command(api_as, run, charlie, globex):  # noqa: ANN001
    answer = api_as(charlie, globex).get(f"/api/v1/runs/{run.id}/next", {"wait": "0"})
    assert answer.status_code == 404


# --- webhooks ---------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_a_decision_is_delivered_signed_and_retried_with_backoff(
    api_as, run, alice, bob, carol, acme, receivers
):
    receiver = receivers(fail_first=1)
    put = api_as(alice, acme).put("/api/v1/webhook", {"url": receiver.url}, format="json")
    assert put.status_code == 200, put.json()
    signer = Webhook(put.json()["secret"])
    artifact = draft(acme)
    run = at_review(run, artifact)
    decide(ask(run, artifact, bob), carol)
    # The receiver fails the first post; the others go out meanwhile.
    assert webhooks_deliver() == 2
    failed = WebhookDelivery.objects.get(delivered_at__isnull=True)
    assert failed.attempts == 1 and "503" in failed.last_error
    assert 1 <= (failed.next_attempt_at - timezone.now()).total_seconds() <= 3  # backoff
    assert webhooks_deliver() == 0  # not before its backoff has passed
    WebhookDelivery.objects.update(next_attempt_at=timezone.now())  # the backoff passes
    assert webhooks_deliver() == 1
    kinds = [json.loads(body)["kind"] for body in receiver.bodies]
    assert kinds == ["run.checkpointed", "run.checkpointed", "approval.decided", "run.checkpointed"]
    assert receiver.bodies[0] == receiver.bodies[3]  # the retry is the same delivery
    for _, _, headers, body in receiver.seen:
        assert signer.verify(body, headers)["run_id"] == str(run.id)
        assert headers["X-Cairn-Event"] == json.loads(body)["kind"]
    assert webhooks_deliver() == 0  # delivered once each
    assert WebhookDelivery.objects.filter(delivered_at__isnull=True).count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body",
    [
        {"url": "ftp://x"},
        {"url": "http://127.0.0.1:1/h", "secret_ref": "whsec-the-secret-itself"},
        {"url": "http://127.0.0.1:1/h", "secret_ref": "env:DJANGO_SECRET_KEY"},
        {"url": "http://127.0.0.1:1/h", "signing_secret": "whsec_abc"},
        {"secret_ref": "env:X"},
    ],
)
def test_a_webhook_needs_an_http_url_and_at_most_a_registered_secret_reference(
    api_as, alice, acme, body
):  # noqa: ANN001
    answer = api_as(alice, acme).put("/api/v1/webhook", body, format="json")
    assert answer.status_code == 400
    assert answer.json()["code"] == "invalid_request"


@pytest.mark.django_db
def test_only_an_admin_sets_the_webhook(api_as, bob, acme):  # noqa: ANN001
    answer = api_as(bob, acme).put(
        "/api/v1/webhook", {"url": "http://127.0.0.1:1/h"}, format="json"
    )
    assert answer.status_code == 403


@pytest.mark.django_db
def test_the_openapi_document_shows_the_runner_routes_and_codes(client):  # noqa: ANN001
    import yaml

    document = yaml.safe_load(client.get("/api/v1/schema").content)
    paths = document["paths"]
    assert "get" in paths["/api/v1/runs/{run_id}/next"]
    assert "wait" in {p["name"] for p in paths["/api/v1/runs/{run_id}/next"]["get"]["parameters"]}
    assert "put" in paths["/api/v1/runs/{run_id}/operations/{key}/job"]
    assert {"get", "put", "delete"} <= set(paths["/api/v1/webhook"])
    commit = paths["/api/v1/runs/{run_id}/checkpoints"]["post"]
    for code in ("approval_required", "budget_exhausted", "illegal_transition", "approval_stale"):
        assert code in commit["description"], code
    body = document["components"]["schemas"]["CheckpointCommitRequest"]["properties"]
    assert "code_version" in body
