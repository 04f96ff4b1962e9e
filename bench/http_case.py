"""Case 2: commits through the HTTP API on gunicorn, against the service call."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time

from bench import cairn_side
from bench.common import QUICK, ROOT, Measurement, payload, timed_threads

PORT = int(os.environ.get("BENCH_HTTP_PORT", "8791"))
CLIENTS = 8


def _server() -> subprocess.Popen:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "cairn.wsgi:application",
            "-k",
            "gthread",
            "-w",
            "4",
            "--threads",
            "2",
            "-b",
            f"127.0.0.1:{PORT}",
            "--keep-alive",
            "30",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env={**os.environ, "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost"},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=2)
            # Any answer proves the server is up; 401 is the cheapest one.
            conn.request("GET", "/api/v1/runs")
            if conn.getresponse().status == 401:
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


def http_case(tenant) -> list[Measurement]:  # noqa: ANN001
    from django.contrib.auth import get_user_model
    from django.db import connection

    from bench.common import time_each
    from tenants.services import Actor, member_set_role, token_issue

    user, _ = get_user_model().objects.get_or_create(username="bench-client")
    member_set_role(tenant=tenant, user=user, role="operator", actor=Actor.system("bench"))
    _, token = token_issue(tenant=tenant, user=user, actor=Actor.system("bench"))
    rounds, warmup = (60, 10) if QUICK else (300, 30)
    server = _server()
    results = []
    try:
        one = HttpCommitter(tenant, token, 2048)
        samples = time_each(one, rounds, warmup)
        results.append(
            Measurement(
                "http",
                "cairn-http",
                "2KB one client",
                samples=samples,
                throughput=1000 / (sum(samples) / len(samples)),
            )
        )
        committers = [HttpCommitter(tenant, token, 2048) for _ in range(CLIENTS)]
        latencies: list[list[float]] = [[] for _ in range(CLIENTS)]

        def client(index: int) -> None:
            try:
                latencies[index] = time_each(committers[index], rounds // 2, 0)
            finally:
                connection.close()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        elapsed = timed_threads(threads)
        flat = [x for row in latencies for x in row]
        results.append(
            Measurement(
                "http",
                "cairn-http",
                f"2KB {CLIENTS} keep-alive clients",
                samples=flat,
                throughput=len(flat) / elapsed,
                note="gunicorn gthread, 4 workers x 2 threads",
            )
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
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
