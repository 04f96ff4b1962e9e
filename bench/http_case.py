"""Case 2: commits through the HTTP API on the web server as deployed (gunicorn with
``cairn/gunicorn.py``), against the service call and against gunicorn's gthread workers
serving the same WSGI application (the server before); and a login and a commit answering
while 200 long-polls wait."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench import cairn_side
from bench.common import (
    BENCH_DB,
    QUICK,
    ROOT,
    Measurement,
    cpu_seconds,
    payload,
    timed_threads,
    vacuum_analyze,
)
from cairn import gunicorn as gunicorn_config

PORT = int(os.environ.get("BENCH_HTTP_PORT", "8791"))
CLIENTS = 8


# As deployed (docs/deployment.md): one process per core, each with cairn/gunicorn.py's
# threads. Four processes on two cores took 10-15% more CPU a commit than two, with no
# higher rate (alternating runs, 2026-12-07); gthread is given the same.
PROCESSES, THREADS = os.cpu_count() or 2, gunicorn_config.threads
WAITS = 200
GTHREAD_LOGIN_CUTOFF = 10.0
SERVERS = {
    # What make run and production start (cairn_up.web_command).
    "asgi": ["-c", "python:cairn.gunicorn", "cairn.asgi:application"],
    # The server before: gthread threads serving the WSGI application, each long-poll
    # holding one.
    "gthread": ["cairn.wsgi:application", "-k", "gthread"],
    # The floor: the same server and worker around an application that does nothing.
    "floor": ["-c", "python:cairn.gunicorn", "bench.noop_asgi:application"],
    # The hand-over to the thread pool alone: a WSGI application that does nothing, served
    # by cairn.asgi as Django is.
    "hop": ["-c", "python:cairn.gunicorn", "bench.noop_wsgi:application"],
}
FLOORS = ("floor", "hop")  # servers measured only empty (EMPTY, below)


def _server(kind: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            *SERVERS[kind],
            "-w",
            str(PROCESSES),
            "--threads",
            str(THREADS),
            "-b",
            f"127.0.0.1:{PORT}",
            "--keep-alive",
            "30",
            "--log-level",
            "warning",
            "--no-control-socket",
        ],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "CAIRN_WAITS_PER_TENANT": str(WAITS),
        },
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=2)
            # Any answer proves the server is up (Cairn's cheapest is a 401).
            conn.request("GET", "/api/v1/runs")
            conn.getresponse().read()
            return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("gunicorn did not start")


class HttpCommitter:
    def __init__(self, tenant, token: str, size: int) -> None:  # noqa: ANN001
        self.run = cairn_side.new_run(tenant)
        self.version = self.run.version
        self.conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.groups = cairn_side.groups(payload(size))
        self.path = f"/api/v1/runs/{self.run.id}/checkpoints"

    def __call__(self, _index: int = 0) -> None:
        body = json.dumps(
            {"expected_version": self.version, "state": "s", "step": "s", "envelope": self.groups}
        )
        self.conn.request("POST", self.path, body=body, headers=self.headers)
        response = self.conn.getresponse()
        data = response.read()
        if response.status != 201:
            raise RuntimeError(f"commit failed: {response.status} {data[:200]!r}")
        self.version = json.loads(data)["run_version"]


class Requester:
    """One keep-alive client sending the same body-less request again and again."""

    def __init__(self, method: str, path: str, expected: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
        self.method, self.path, self.expected = method, path, expected

    def __call__(self, _index: int = 0) -> None:
        self.conn.request(self.method, self.path)
        response = self.conn.getresponse()
        response.read()
        if response.status != self.expected:
            raise RuntimeError(f"{self.path} answered {response.status}, not {self.expected}")


def _get(path: str, token: str | None = None, timeout: float = 60) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def _cpu_by_part(server: int) -> dict[str, float]:
    """CPU seconds used so far by each part of an HTTP request's cost: the web server (its
    master and workers), PostgreSQL (every process of the cluster) and the bench's clients
    (this process). Counted rather than inferred from the rate: on a shared machine the
    rate moves with the neighbours, the CPU a request takes much less."""
    parts = {"web": cpu_seconds(server), "PostgreSQL": 0.0, "clients": cpu_seconds(os.getpid())}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone since the listing
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat.rsplit(")", 1)[1].split()
        if int(rest[1]) == server:
            parts["web"] += cpu_seconds(int(entry.name))
        elif name == "postgres" or name.startswith("postgres:"):
            parts["PostgreSQL"] += cpu_seconds(int(entry.name))
    return parts


def _cores_note(before: dict[str, float], after: dict[str, float], requests: int) -> str:
    spent = {part: 1000 * (after[part] - before[part]) / requests for part in before}
    each = ", ".join(f"{part} {ms:.2f}" for part, ms in spent.items())
    return f"CPU a request: {sum(spent.values()):.2f} ms ({each})"


def _one_and_eight(
    what: str,
    client_of: Callable[[], Callable[[int], None]],
    rounds: int,
    warmup: int,
    note: str,
    label: str = "",
    server: int | None = None,
) -> list[Measurement]:
    """``what`` from one keep-alive client (latency), then from CLIENTS at once (rate, and
    with ``server``'s pid the CPU each request took, by part); ``label`` ends each row's
    variant (the server, where it is not the deployed one)."""
    from django.db import connection

    from bench.common import time_each

    samples = time_each(client_of(), rounds, warmup)
    results = [
        Measurement(
            "http",
            "cairn-http",
            f"{what} one client{label}",
            samples=samples,
            throughput=1000 / (sum(samples) / len(samples)),
        )
    ]
    clients = [client_of() for _ in range(CLIENTS)]
    latencies: list[list[float]] = [[] for _ in range(CLIENTS)]

    def client(index: int) -> None:
        try:
            latencies[index] = time_each(clients[index], rounds // 2, 0)
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    before = _cpu_by_part(server) if server else {}
    elapsed = timed_threads(threads)
    flat = [x for row in latencies for x in row]
    if server:
        note = f"{note}; {_cores_note(before, _cpu_by_part(server), len(flat))}"
    results.append(
        Measurement(
            "http",
            "cairn-http",
            f"{what} {CLIENTS} keep-alive clients{label}",
            samples=flat,
            throughput=len(flat) / elapsed,
            note=note,
        )
    )
    return results


def _commits(
    kind: str, tenant, token: str, rounds: int, warmup: int, server: int
) -> list[Measurement]:  # noqa: ANN001
    label = "" if kind == "asgi" else f", {kind}"
    note = f"{kind}: gunicorn, {PROCESSES} processes x {THREADS} threads" + (
        " (cairn/gunicorn.py: uvicorn's worker, cairn.asgi)" if kind == "asgi" else ""
    )
    return _one_and_eight(
        "2KB", lambda: HttpCommitter(tenant, token, 2048), rounds, warmup, note, label, server
    )


# The do-nothing floors: each one's row name and the application it serves.
EMPTY = {
    "floor": ("empty request (an ASGI app that does nothing),", "bench/noop_asgi.py"),
    "hop": (
        "empty request (a WSGI app that does nothing, on cairn.asgi's thread pool),",
        "bench/noop_wsgi.py",
    ),
}


def _floors(kind: str, rounds: int, warmup: int, server: int) -> list[Measurement]:
    """What a request costs before any commit work: nothing at all behind the same server
    (``floor``), the hand-over to the thread pool alone (``hop``), and Cairn's cheapest
    answer, a 401 (Django and DRF, no statement)."""
    note = f"gunicorn with cairn/gunicorn.py, {PROCESSES} processes x {THREADS} threads"
    if kind in EMPTY:
        what, application = EMPTY[kind]
        return _one_and_eight(
            what,
            lambda: Requester("POST", "/", 204),
            rounds,
            warmup,
            f"{note}: {application}",
            server=server,
        )
    return _one_and_eight(
        "401 (no token: Django and DRF, no statement),",
        lambda: Requester("GET", "/api/v1/runs", 401),
        rounds,
        warmup,
        note + ", cairn.asgi",
        server=server,
    )


def _while_waiting(kind: str, tenant, token: str) -> list[Measurement]:  # noqa: ANN001
    """A login page and a commit, one after another, while WAITS long-polls (wait=30) sleep
    on 20 paused runs; then the runs are resumed and every poll must answer ``step``."""
    from runtime.services.pause import run_pause, run_unpause
    from tenants.services import Actor

    actor = Actor.system("bench")
    runs = [cairn_side.new_run(tenant) for _ in range(20)]
    for run in runs:
        run_pause(tenant=tenant, run_id=run.pk, reason="bench: waiting", actor=actor)
    answers: list[int] = []

    def poll(index: int) -> None:
        answers.append(_get(f"/api/v1/runs/{runs[index % 20].pk}/next?wait=30", token, 90))

    polls = [threading.Thread(target=poll, args=(i,)) for i in range(WAITS)]
    for thread in polls:
        thread.start()
    time.sleep(3)  # every poll is in
    label = "" if kind == "asgi" else f", {kind}"
    results = []
    if kind == "asgi":
        committer = HttpCommitter(tenant, token, 2048)
        logins, commits = [], []
        for _ in range(20):
            started = time.perf_counter()
            status = _get("/login/")
            logins.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            committer()
            commits.append((time.perf_counter() - started) * 1000)
            assert status == 200, status
        results.append(
            Measurement("http", "cairn-http", f"2KB commit, {WAITS} polls waiting", samples=commits)
        )
    else:
        # Every thread holds a wait and the login queues behind them: one try, cut off.
        started = time.perf_counter()
        try:
            _get("/login/", timeout=GTHREAD_LOGIN_CUTOFF)
        except TimeoutError:
            pass
        logins = [(time.perf_counter() - started) * 1000]
    early = len(answers)
    started = time.perf_counter()
    for run in runs:
        run_unpause(tenant=tenant, run_id=run.pk, actor=actor)
    for thread in polls:
        thread.join(timeout=120)
    woken = time.perf_counter() - started
    note = (
        f"{kind}: {WAITS} polls on 20 paused runs; {early} answered before the runs were "
        f"resumed, {answers.count(200)} answered 200 in all, {answers.count(429)} refused "
        f"429; all answered {woken:.2f} s after the 20 resumes began"
        + (
            f"; the login is one try, cut off at {GTHREAD_LOGIN_CUTOFF:.0f} s"
            if kind != "asgi"
            else ""
        )
    )
    results.insert(
        0,
        Measurement(
            "http",
            "cairn-http",
            f"login page, {WAITS} polls waiting{label}",
            samples=logins,
            note=note,
        ),
    )
    return results


def http_case(tenant) -> list[Measurement]:  # noqa: ANN001
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from bench.common import time_each
    from tenants.services import Actor, member_set_role, token_issue

    user, _ = get_user_model().objects.get_or_create(username="bench-client")
    member_set_role(tenant=tenant, user=user, role="operator", actor=Actor.system("bench"))
    _, token = token_issue(tenant=tenant, user=user, actor=Actor.system("bench"))
    rounds, warmup = (60, 10) if QUICK else (300, 30)
    # Production settings serve the login page's static files from the manifest: build it,
    # as a deploy does.
    call_command("collectstatic", interactive=False, verbosity=0)
    results = []
    for kind in SERVERS:
        vacuum_analyze(BENCH_DB)  # each server starts as autovacuum would leave the last one
        server = _server(kind)
        try:
            if kind not in FLOORS:
                results += _commits(kind, tenant, token, rounds, warmup, server.pid)
                results += _while_waiting(kind, tenant, token)
            if kind != "gthread":
                results += _floors(kind, rounds, warmup, server.pid)
        finally:
            server.terminate()
            server.wait(timeout=60)
    service = cairn_side.Committer(tenant, 2048)
    samples = time_each(service, rounds, warmup)
    results.append(
        Measurement(
            "http",
            "cairn-service",
            "2KB service call",
            samples=samples,
            throughput=1000 / (sum(samples) / len(samples)),
        )
    )
    return results
