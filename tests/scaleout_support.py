"""Helpers for the scale-out tests: free ports, subprocesses on their own settings, waits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.publishing import free_port  # noqa: F401 - re-exported for the scale-out tests

REPO = Path(__file__).resolve().parent.parent


def _run(args: list[str], *, env: dict[str, str], timeout: float, what: str) -> str:
    """``python <args>`` in a subprocess on ``env``; its stdout, or the test fails with its
    output under ``what``."""
    done = subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        pytest.fail(f"{what} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def manage(*args: str, env: dict[str, str], timeout: float = 300) -> str:
    """``manage.py <args>`` in a subprocess on ``env``; fails the test with its output."""
    return _run(["manage.py", *args], env=env, timeout=timeout, what=f"manage.py {' '.join(args)}")


def python(code: str, *, env: dict[str, str], timeout: float = 120) -> str:
    """Run ``code`` after django.setup() in a subprocess; its stdout."""
    prelude = "import django; django.setup()\n"
    return _run(["-c", prelude + code], env=env, timeout=timeout, what="subprocess")


def wait_http(url: str, *, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):  # noqa: S310 - loopback
                return
        except urllib.error.HTTPError:
            return  # the server answers, which is all this waits for
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"nothing answered at {url}")
            time.sleep(0.2)


@contextmanager
def process(args: list[str], *, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    """A subprocess in its own process group, killed (whole group) when the block ends."""
    handle = open(log, "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        args,
        cwd=REPO,
        env=env,
        stdout=handle,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
        handle.close()
        print(f"--- {args[2:4]} log (tail) ---\n{log.read_text(errors='replace')[-3000:]}")


def gunicorn(
    port: int, *, workers: int = 2, threads: int | None = 10, extra: Sequence[str] = ()
) -> list[str]:
    """The command line of a gunicorn serving cairn.wsgi on 127.0.0.1:``port``: gthread
    workers with ``threads`` threads each, or gunicorn's sync workers when ``threads`` is
    None; ``extra`` is appended."""
    args = [
        sys.executable,
        "-m",
        "gunicorn",
        "cairn.wsgi:application",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(workers),
    ]
    if threads is not None:
        args += ["--threads", str(threads), "--worker-class", "gthread"]
    return [*args, "--timeout", "120", *extra]


def json_request(
    url: str, *, token: str, body: dict | None = None, method: str | None = None
) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url,
        data=data,
        method=method or ("POST" if data is not None else "GET"),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
            raw = response.read()
            return response.status, json.loads(raw) if raw else {}
    except urllib.error.HTTPError as error:
        raw = error.read()
        try:
            return error.code, json.loads(raw)
        except ValueError:
            return error.code, {"raw": raw.decode(errors="replace")[:2000]}
