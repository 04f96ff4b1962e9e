"""Long-polls wait on a notification, not in a polling loop, and one tenant's waits cannot
take the server from everybody else: ``GET /runs/{id}/next?wait=`` wakes when the run
changes (the commit's transaction notifies: PostgreSQL ``NOTIFY``, in process on SQLite)
and each tenant may hold ``CAIRN_WAITS_PER_TENANT`` waits per web process; past that it gets
429 with ``Retry-After``. Against a real gunicorn, as deployed."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints.models import Run
from checkpoints.services import changes
from runtime.services.runner import run_wait_next
from runtime.services.runs import run_create
from runtime.status import run_pause_for_review
from tenants.services import Actor, token_issue
from tests.web_server import web_server  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

GENEROUS = 3.0  # seconds: far above what an idle thread answers in, far below a wait
ACTOR = Actor.system("test")


def _paused_run(tenant) -> Run:  # noqa: ANN001
    run = run_create(tenant=tenant, workflow_type="research", execution="external", actor=ACTOR)
    assert run_pause_for_review(
        run_id=run.pk, expected_version=run.version, reason="held", actor=ACTOR
    )
    run.refresh_from_db()
    return run


def _get(url: str, *, token: str | None = None, timeout: float = 60) -> tuple[int, dict, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            body = response.read()
            status, head = response.status, dict(response.headers)
    except urllib.error.HTTPError as exc:
        body, status, head = exc.read(), exc.code, dict(exc.headers)
    try:
        return status, json.loads(body or b"{}"), head
    except ValueError:
        return status, {}, head


def _post(url: str, body: dict, *, token: str) -> int:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_many_waits_from_one_token_leave_the_server_to_everybody_else(
    web_server,  # noqa: F811
    acme,
    bob,
    workflow,
):  # noqa: ANN001
    cap, waits = 4, 12
    server = web_server(threads=8, env={"CAIRN_WAITS_PER_TENANT": str(cap)})
    _, token = token_issue(tenant=acme, user=bob, actor=ACTOR)
    waiting = _paused_run(acme)
    moving = run_create(tenant=acme, workflow_type="research", execution="external", actor=ACTOR)
    url = f"{server.url}/api/v1/runs/{waiting.pk}/next?wait=20"
    with ThreadPoolExecutor(max_workers=waits) as pool:
        polls = [pool.submit(_get, url, token=token) for _ in range(waits)]
        time.sleep(1.0)  # every poll is in (or refused) by now
        started = time.monotonic()
        status, _, _ = _get(f"{server.url}/login/")
        login = time.monotonic() - started
        started = time.monotonic()
        committed = _post(
            f"{server.url}/api/v1/runs/{moving.pk}/checkpoints",
            {"expected_version": moving.version, "state": "draft_answer", "envelope": {}},
            token=token,
        )
        commit = time.monotonic() - started
        assert (status, committed) == (200, 201)
        assert login < GENEROUS and commit < GENEROUS, (login, commit)
        refused = [p.result() for p in polls if p.done() and p.result()[0] == 429]
        assert len(refused) == waits - cap, [p.result()[0] for p in polls if p.done()]
        for _, body, head in refused:
            assert body["code"] == "too_many_waits" and int(head["Retry-After"]) >= 1, body
        # The waits that were let in are still waiting, and all answer once the run moves.
        assert sum(not p.done() for p in polls) == cap
        resumed = _post(
            f"{server.url}/api/v1/runs/{waiting.pk}/actions/resume",
            {"expected_version": waiting.version},
            token=token,
        )
        assert resumed == 200
        started = time.monotonic()
        answers = [p.result(timeout=30) for p in polls if p.result(timeout=30)[0] == 200]
    woke = time.monotonic() - started
    print(f"login {login:.3f}s, commit {commit:.3f}s, {cap} waits woken in {woke:.3f}s")
    assert len(answers) == cap and {a[1]["command"] for a in answers} == {"step"}
    assert woke < GENEROUS, woke


def test_a_wait_sleeps_on_a_notification_rather_than_reading_the_run_again_and_again(acme):  # noqa: ANN001
    run_create(tenant=acme, workflow_type="research", execution="external", actor=ACTOR)
    run = _paused_run(acme)
    with CaptureQueriesContext(connection) as queries:
        answer = run_wait_next(tenant=acme, run_id=run.pk, wait_seconds=2)
    assert answer.command == "wait" and not answer.due
    # One read to start and one when the wait is over; a polling loop would read ten times.
    assert len(queries) <= 3, [q["sql"][:60] for q in queries.captured_queries]


def test_a_wait_wakes_when_the_run_moves_in_this_process(acme):  # noqa: ANN001
    run = _paused_run(acme)
    answers = []

    def wait() -> None:
        try:
            answers.append(run_wait_next(tenant=acme, run_id=run.pk, wait_seconds=20))
        finally:
            connection.close()  # this thread's own connection

    waiter = threading.Thread(target=wait)
    from runtime.services.actions import run_resume

    started = time.monotonic()
    waiter.start()
    time.sleep(0.5)
    run_resume(tenant=acme, run_id=run.pk, expected_version=run.version, actor=ACTOR)
    resumed = time.monotonic()
    waiter.join(timeout=30)
    assert answers and answers[0].command == "step", answers
    assert time.monotonic() - started < GENEROUS
    # Woken by the change, not found by a re-check (a second apart on SQLite, ten on
    # PostgreSQL, whose notification comes through this process's listening connection).
    assert time.monotonic() - resumed < 0.5
    if connection.vendor == "postgresql":
        assert changes._listener.listening.is_set()


def test_a_wait_wakes_when_an_operator_lifts_a_pause(acme):  # noqa: ANN001
    # A pause moves no version (a step in flight still commits), so it announces the change
    # itself, as every writer of what `next` answers must: else its runner sleeps on.
    from runtime.services.pause import run_pause, run_unpause

    run = run_create(tenant=acme, workflow_type="research", execution="external", actor=ACTOR)
    run_pause(tenant=acme, run_id=run.pk, reason="hold it", actor=ACTOR)
    answers = []

    def wait() -> None:
        try:
            answers.append(run_wait_next(tenant=acme, run_id=run.pk, wait_seconds=20))
        finally:
            connection.close()

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.5)
    run_unpause(tenant=acme, run_id=run.pk, actor=ACTOR)
    lifted = time.monotonic()
    waiter.join(timeout=30)
    assert answers and answers[0].command == "step", answers
    assert time.monotonic() - lifted < 0.5
