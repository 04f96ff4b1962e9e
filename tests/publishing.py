"""The local publishing service as a real subprocess, for tests (import the fixture).

from tests.publishing import publishing_service  # noqa: F401
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A port nobody listens on (the "unreachable" fault mode)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PublishingService:
    def __init__(self, state_file: Path, *, timeout_sleep: float = 3.0, token_env: str = ""):
        self.state_file = state_file
        self.timeout_sleep = timeout_sleep
        self.token_env = token_env
        self.process: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *extra: str) -> PublishingService:
        command = [
            sys.executable,
            "-m",
            "runtime.providers.publishing_service",
            "--port",
            str(self.port),
            "--state-file",
            str(self.state_file),
            "--timeout-sleep",
            str(self.timeout_sleep),
            *(["--token-env", self.token_env] if self.token_env else []),
            *extra,
        ]
        self.process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=os.environ.copy()
        )
        line = self.process.stdout.readline()
        assert "listening on" in line, f"the publishing service did not start: {line!r}"
        self.port = int(line.rsplit(":", 1)[1])
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process is not None and self.process.stdout:
            self.process.stdout.close()
        self.process = None

    def restart(self, *extra: str) -> PublishingService:
        self.stop()
        return self.start(*extra)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/stats", timeout=10) as answer:
            return json.loads(answer.read())

    def faults(self, *perform: str, lookup: str = "", default: str | None = None) -> None:
        body: dict[str, Any] = {"perform": list(perform), "lookup": lookup}
        if default is not None:
            body["default"] = default
        self._post("/control/faults", body)

    def reset(self) -> None:
        self._post("/control/reset", {})


@pytest.fixture
def publishing_service(tmp_path):  # noqa: ANN001, ANN201
    """A running local publishing service with its own state file; stopped afterwards."""
    service = PublishingService(tmp_path / "publishing.json").start()
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture(autouse=True)
def _publishing_for_worker_tests(request):  # noqa: ANN001, ANN202
    """Tests that start workers get a publishing service, named by CAIRN_PUBLISHING_URL
    (workers inherit the environment) and in this process's settings."""
    if "worker_factory" not in request.fixturenames:
        return
    service = request.getfixturevalue("publishing_service")
    request.getfixturevalue("monkeypatch").setenv("CAIRN_PUBLISHING_URL", service.url)
    request.getfixturevalue("settings").CAIRN_PUBLISHING_URL = service.url


def effects_worker_env(service: PublishingService) -> dict[str, str]:
    """The environment of a worker that runs tests.effects_workflows against ``service``."""
    from tests.worker_fixtures import TEST_WORKFLOW_MODULES

    return {
        "CAIRN_PUBLISHING_URL": service.url,
        "CAIRN_PUBLISHING_TOKEN_REF": "",
        "CAIRN_PROVIDER_TIMEOUT_SECONDS": "2",
        "CAIRN_WORKFLOW_MODULES": f"{TEST_WORKFLOW_MODULES},tests.effects_workflows",
    }


def run_killed_at(
    boundary: str,
    *,
    tenant: Any,
    workflow_type: str,
    title: str,
    service: PublishingService,
    worker_factory: Any,
    tmp_path: Path,
) -> tuple[Any, Path, dict[str, str]]:
    """Create a run of ``workflow_type`` and let a worker take it until it is SIGKILLed at
    ``boundary`` (the crash matrix and the job tests share this setup, so they kill the same
    way). Returns the run, its count directory and the environment for the next worker."""
    from runtime.services.runs import run_create
    from tenants.services import Actor
    from tests.faults import CRASH_AT, CRASH_MARKER
    from tests.worker_fixtures import wait_for

    count_dir = tmp_path / "counts"
    count_dir.mkdir()
    marker = tmp_path / "crashed"
    env = effects_worker_env(service)
    run = run_create(
        tenant=tenant,
        workflow_type=workflow_type,
        inputs={"title": title, "count_dir": str(count_dir)},
        budget={"max_attempts": 10},
        actor=Actor.system("test"),
    )
    doomed = worker_factory(
        "doomed",
        env={**env, CRASH_AT: f"effect.{boundary}", CRASH_MARKER: str(marker)},
    )
    wait_for(lambda: marker.exists() and not doomed.alive, what=f"the worker to die at {boundary}")
    assert doomed.process.returncode == -9  # SIGKILL: no handler ran
    return run, count_dir, env


def rescue_with_a_new_worker(run: Any, *, worker_factory: Any, env: dict[str, str]) -> None:
    """Wait out the dead worker's lease, rescue the run (exactly it) and start a rescuer."""
    from django.utils import timezone

    from checkpoints.models import Run
    from runtime.rescue import runs_rescue
    from tests.worker_fixtures import wait_for

    wait_for(
        lambda: Run.objects.get(pk=run.pk).lease_expires_at < timezone.now(),
        what="the dead worker's lease to expire",
    )
    assert runs_rescue() == 1
    worker_factory("rescuer", env=env)
