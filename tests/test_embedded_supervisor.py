"""The embedded product keeps itself up (issue 29, item 8): ``cairn_up`` starts a child that
dies again, so the README tour's ``kill -9`` of the worker leaves the console answering and
a new worker appears; ``make run ADDR=…`` serves on that address and ``seed_demo`` prints
it."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

from tests.publishing import free_port
from tests.web_server import fetch_once_up
from tests.worker_fixtures import wait_for

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.worker


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "CAIRN_HOME": str(tmp_path), **extra}
    for inherited in ("DATABASE_URL", "DJANGO_DEBUG", "DJANGO_ALLOW_ASYNC_UNSAFE", "CAIRN_ENV"):
        env.pop(inherited, None)
    env["DJANGO_SETTINGS_MODULE"] = "cairn.settings"
    return env


def _pids(log: Path, name: str) -> list[int]:
    return [
        int(pid) for pid in re.findall(rf"^{name} started \(pid (\d+)\)", log.read_text(), re.M)
    ]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (dead, not yet reaped) is not a worker either.
    status = Path(f"/proc/{pid}/stat")
    return not status.exists() or status.read_text().split(") ")[-1][:1] != "Z"


def test_a_killed_worker_is_started_again_and_the_console_stays_up(tmp_path):
    env = _env(tmp_path, CAIRN_PUBLISHING_URL=f"http://127.0.0.1:{free_port()}")
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    addr = f"127.0.0.1:{free_port()}"
    log = tmp_path / "cairn_up.log"
    with open(log, "w") as out:
        up = subprocess.Popen(
            [sys.executable, "manage.py", "cairn_up", "--addr", addr, "--concurrency", "1"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        [worker] = wait_for(lambda: _pids(log, "worker"), what="the worker to start", timeout=120)
        assert fetch_once_up(f"http://{addr}/login/")[0] == 200
        os.kill(worker, signal.SIGKILL)  # the README tour's kill -9 of the worker
        again = wait_for(lambda: _pids(log, "worker")[1:], what="a new worker", timeout=120)
        assert again[0] != worker and _alive(again[0]) and not _alive(worker)
        assert "worker stopped (exit code -9); starting it again." in log.read_text()
        assert fetch_once_up(f"http://{addr}/login/")[0] == 200  # the console never went down
        assert up.poll() is None and len(_pids(log, "web")) == 1
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=60)
    assert not _alive(again[0])  # stopping cairn_up stops its children


@pytest.mark.django_db
def test_seed_demo_prints_the_address_it_is_given():
    out = io.StringIO()
    call_command("seed_demo", "--addr", "127.0.0.1:8011", stdout=out)
    assert "sign in at http://127.0.0.1:8011/ as:" in out.getvalue()


def test_make_run_passes_its_address_to_seed_demo_and_cairn_up():
    plan = subprocess.run(
        ["make", "-n", "run", "ADDR=127.0.0.1:8011", "STAMP=Makefile"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "manage.py seed_demo --addr 127.0.0.1:8011" in plan
    assert "manage.py cairn_up --addr 127.0.0.1:8011" in plan
