"""``make run`` (``cairn_up``) serves the console and the API with the server
docs/deployment.md recommends for production: gunicorn with uvicorn's worker serving
``cairn.asgi``, configured by ``cairn/gunicorn.py``, never Django's development server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from uvicorn_worker import UvicornWorker

from cairn import gunicorn as config
from runtime.management.commands.cairn_up import web_command
from tests.publishing import free_port

ROOT = Path(__file__).resolve().parent.parent


def _children(pid: int) -> list[tuple[int, str]]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append((int(entry.name), cmdline))
    return found


def _get(url: str, deadline: float) -> tuple[int, dict]:
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310
                return answer.status, dict(answer.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def test_cairn_up_serves_with_the_recommended_gunicorn_not_the_development_server(tmp_path):
    env = {**os.environ, "CAIRN_HOME": str(tmp_path), "DJANGO_SETTINGS_MODULE": "cairn.settings"}
    for inherited in ("DATABASE_URL", "DJANGO_DEBUG", "CAIRN_ENV", "CELERY_BROKER_URL"):
        env.pop(inherited, None)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    port = free_port()
    up = subprocess.Popen(
        [sys.executable, "manage.py", "cairn_up", "--addr", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        status, headers = _get(f"http://127.0.0.1:{port}/login/", time.monotonic() + 90)
        assert status == 200
        # Django's development server names itself (WSGIServer); Cairn's worker sends none.
        assert "server" not in {name.lower() for name in headers}, headers
        commands = [cmd for _, cmd in _children(up.pid)]
        expected = " ".join(web_command(sys.executable, f"127.0.0.1:{port}"))
        assert expected.strip() in [c.strip() for c in commands], commands
        assert config.worker_class == "cairn.gunicorn.Worker"
        assert issubclass(config.Worker, UvicornWorker)
        assert not [c for c in commands if "runserver" in c], commands
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=60)
