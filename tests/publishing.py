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
            "checkpoints.providers.publishing_service",
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
