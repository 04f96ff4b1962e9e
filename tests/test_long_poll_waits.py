"""Long-polls wait on a notification, not in a polling loop, and hold no server thread while
they sleep, so waits cannot take the server from everybody else: ``GET /runs/{id}/next?wait=``
wakes when the run changes (the commit's transaction notifies: PostgreSQL ``NOTIFY``, in
process on SQLite), and each tenant may hold ``CAIRN_WAITS_PER_TENANT`` waits per web
process; past that it gets 429 with ``Retry-After``. Against the real server, as deployed
(gunicorn with ``cairn/gunicorn.py``)."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from email.message import Message
from pathlib import Path

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


def _get(url: str, *, token: str | None = None, timeout: float = 60) -> tuple[int, dict, Message]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            body = response.read()
            status, head = response.status, response.headers
    except urllib.error.HTTPError as exc:
        body, status, head = exc.read(), exc.code, exc.headers
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
    server = web_server(env={"CAIRN_WAITS_PER_TENANT": str(cap)})
    _, token = token_issue(tenant=acme, user=bob, actor=ACTOR)
    waiting = _paused_run(acme)
    moving = run_create(tenant=acme, workflow_type="research", execution="external", actor=ACTOR)
    url = f"{server.url}/api/v1/runs/{waiting.pk}/next?wait=20"
    with ThreadPoolExecutor(max_workers=waits) as pool:
        polls = [pool.submit(_get, url, token=token) for _ in range(waits)]
        time.sleep(1.0)  # every poll is in (or refused) by now
        login, commit = _a_login_and_a_commit_answer(server, moving, token)
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


def _a_login_and_a_commit_answer(server, run: Run, token: str) -> tuple[float, float]:  # noqa: ANN001
    """The login page and a commit to ``run`` answer, each within GENEROUS: their times."""
    started = time.monotonic()
    status, _, _ = _get(f"{server.url}/login/")
    login = time.monotonic() - started
    started = time.monotonic()
    committed = _post(
        f"{server.url}/api/v1/runs/{run.pk}/checkpoints",
        {"expected_version": run.version, "state": "draft_answer", "envelope": {}},
        token=token,
    )
    commit = time.monotonic() - started
    assert (status, committed) == (200, 201)
    assert login < GENEROUS and commit < GENEROUS, (login, commit)
    return login, commit


def _until_every_slot_is_held(probe: str, token: str) -> None:
    """Until a wait of one second (``probe``) is refused: the tenant's slots are all held."""
    deadline = time.monotonic() + 30
    while _get(probe, token=token)[0] != 429:
        assert time.monotonic() < deadline, "the waits never all got in"


def _until_connected(server, count: int) -> None:  # noqa: ANN001
    """Until the server's port has ``count`` established connections (/proc/net/tcp)."""
    port = f"{server.port:04X}"
    deadline = time.monotonic() + 30
    while True:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
        held = sum(
            1 for line in lines if line.split()[1].endswith(f":{port}") and line.split()[3] == "01"
        )
        if held >= count:
            return
        assert time.monotonic() < deadline, f"only {held} of {count} connections"
        time.sleep(0.2)


def _worker_threads(server) -> int:  # noqa: ANN001
    """Threads of the server's one worker process (gunicorn's arbiter forks it)."""
    children = Path(f"/proc/{server.process.pid}/task/{server.process.pid}/children")
    (worker,) = children.read_text().split()
    status = Path(f"/proc/{worker}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Threads:")).split()[1])


def test_two_hundred_waits_hold_no_thread_while_a_login_and_a_commit_answer(
    web_server,  # noqa: F811
    acme,
    bob,
    workflow,
):  # noqa: ANN001
    waits, threads = 200, 4
    server = web_server(threads=threads, env={"CAIRN_WAITS_PER_TENANT": str(waits)})
    _, token = token_issue(tenant=acme, user=bob, actor=ACTOR)
    runs = [_paused_run(acme) for _ in range(20)]
    moving = run_create(tenant=acme, workflow_type="research", execution="external", actor=ACTOR)
    assert _get(f"{server.url}/login/")[0] == 200  # the pool's threads are up
    idle_threads = _worker_threads(server)
    with ThreadPoolExecutor(max_workers=waits) as pool:
        polls = [
            pool.submit(
                _get, f"{server.url}/api/v1/runs/{runs[i % 20].pk}/next?wait=25", token=token
            )
            for i in range(waits)
        ]
        _until_connected(server, waits)
        time.sleep(1.0)  # each view's first look (a few ms) is over by now
        assert not [p.result() for p in polls if p.done()], "a wait answered before its run moved"
        # Two hundred waits sleep on the event loop: the worker has no more threads than its
        # pool and its listener (gthread would need one per wait, and the login below would
        # queue behind them).
        assert _worker_threads(server) <= idle_threads + threads, (
            _worker_threads(server),
            idle_threads,
        )
        login, commit = _a_login_and_a_commit_answer(server, moving, token)
        assert sum(not p.done() for p in polls) == waits
        started = time.monotonic()
        for run in runs:
            assert (
                _post(
                    f"{server.url}/api/v1/runs/{run.pk}/actions/resume",
                    {"expected_version": run.version},
                    token=token,
                )
                == 200
            )
        answers = [p.result(timeout=30) for p in polls]
    woke = time.monotonic() - started
    print(f"{waits} waits: login {login:.3f}s, commit {commit:.3f}s, all woken in {woke:.3f}s")
    assert {(status, body["command"]) for status, body, _ in answers} == {(200, "step")}
    assert woke < 2 * GENEROUS, woke


def test_a_client_that_leaves_frees_its_wait_at_once(web_server, acme, bob, workflow):  # noqa: ANN001, F811
    server = web_server(env={"CAIRN_WAITS_PER_TENANT": "1"})
    _, token = token_issue(tenant=acme, user=bob, actor=ACTOR)
    run = _paused_run(acme)
    path = f"/api/v1/runs/{run.pk}/next?wait=25"
    probe = f"{server.url}{path}".replace("wait=25", "wait=1")
    assert _get(probe, token=token)[0] == 200  # the process listens for changes from now on
    leaving = socket.create_connection((server.host, server.port))
    leaving.sendall(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    )
    time.sleep(1.0)  # its view's first look is over: it holds the tenant's one slot
    _until_every_slot_is_held(probe, token)
    leaving.close()
    time.sleep(0.5)
    status, body, _ = _get(probe, token=token)
    assert (status, body.get("command")) == (200, "wait"), body


def test_a_wait_sleeps_on_a_notification_rather_than_reading_the_run_again_and_again(acme):  # noqa: ANN001
    run_create(tenant=acme, workflow_type="research", execution="external", actor=ACTOR)
    run = _paused_run(acme)
    with CaptureQueriesContext(connection) as queries:
        answer = run_wait_next(tenant=acme, run_id=run.pk, wait_seconds=2)
    assert answer.command == "wait" and not answer.due
    # One read to start and one when the wait is over; a polling loop would read ten times.
    assert len(queries) <= 3, [q["sql"][:60] for q in queries.captured_queries]


@pytest.mark.parametrize("spelling", [lambda pk: pk, lambda pk: str(pk).upper()])
def test_a_wait_wakes_when_the_run_moves_in_this_process(acme, spelling):  # noqa: ANN001
    # However the caller spells the run's id (a UUID, or a string in capitals), the wait is
    # subscribed under the id the change is announced with.
    run = _paused_run(acme)
    answers = []

    def wait() -> None:
        try:
            answers.append(run_wait_next(tenant=acme, run_id=spelling(run.pk), wait_seconds=20))
        finally:
            connection.close()  # this thread's own connection

    waiter = threading.Thread(target=wait)
    from runtime.services.actions import run_resume

    started = time.monotonic()
    waiter.start()
    # Well before the first re-check (a second after the wait began on SQLite), so only the
    # change's own wake-up can answer within half a second of it.
    time.sleep(0.2)
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
