"""A real web server process for tests that need one: the server ``make run`` and production
start (gunicorn with ``cairn/gunicorn.py`` serving ``cairn.asgi``), one process, on the
test database, keys and media root (Django's test client neither chunks a body nor dies
mid-request). ``web_server(env={...})`` starts one; every server is killed when the test
ends. Use with ``@pytest.mark.django_db(transaction=True)`` so the server sees the rows."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from runtime.management.commands.cairn_up import web_command
from tests.publishing import free_port
from tests.worker_fixtures import REPO, database_env


@dataclass
class WebServer:
    host: str
    port: int
    process: subprocess.Popen
    log_path: Path
    _log: object = field(repr=False, default=None)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL to the whole group (arbiter and worker): no handler runs, nothing is
        cleaned up, as when the machine loses power mid-request."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)


def _wait_listening(server: WebServer, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail(f"the web server exited: {server.log()[-3000:]}")
        try:
            with socket.create_connection((server.host, server.port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"the web server did not listen within {timeout}s: {server.log()[-3000:]}")


@pytest.fixture
def web_server(tmp_path: Path) -> Iterator[Callable[..., WebServer]]:
    started: list[WebServer] = []

    def start(
        env: dict[str, str] | None = None,
        database: bool = True,
        threads: int | None = None,
    ) -> WebServer:
        """``env`` is added to the environment (an empty value removes the variable);
        ``database=False`` leaves the test database out of it; ``threads`` sizes the
        process's thread pool (``cairn/gunicorn.py``'s by default)."""
        port = free_port()
        log_path = tmp_path / f"gunicorn-{len(started)}.log"
        full_env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "CAIRN_MEDIA_ROOT": str(django_settings.MEDIA_ROOT),
            **(database_env() if database else {}),
            **(env or {}),
        }
        full_env = {name: value for name, value in full_env.items() if value != ""}
        log = open(log_path, "w")  # noqa: SIM115 - closed when the server is reaped
        # --no-control-socket: there is one per user otherwise, shared by parallel servers.
        command = [
            *web_command(sys.executable, f"127.0.0.1:{port}"),
            "--workers",
            "1",
            *(["--threads", str(threads)] if threads else []),
            "--no-control-socket",
        ]
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: kill() reaches the worker too
        )
        server = WebServer("127.0.0.1", port, process, log_path, log)
        started.append(server)
        _wait_listening(server)
        return server

    yield start
    for server in started:
        server.kill()
        server._log.close()
        print(f"--- web server log (tail) ---\n{server.log()[-4000:]}")


def fetch_once_up(url: str) -> tuple[int, str]:
    """GET ``url`` once the server answers (a condition wait bounded at 60 s): its status and
    body, an error status included."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
