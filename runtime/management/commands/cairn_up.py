"""Start the whole embedded product: web server, Celery worker with the beat scheduler, and
the local publishing service the demo publishes to. The web server is the one production
runs (docs/deployment.md): gunicorn with ``cairn/gunicorn.py``, never Django's development
server."""

import os
import signal
import subprocess
import sys
import time
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Run the web server, a Celery worker and the scheduler together until Ctrl-C."

    def add_arguments(self, parser):
        parser.add_argument("--addr", default="127.0.0.1:8000")
        parser.add_argument("--concurrency", type=int, default=2)

    def handle(self, *args, addr, concurrency, **options):
        # Workers run only workflows whose definitions are stored: store them first.
        call_command("sync_workflows", stdout=self.stdout, stderr=self.stderr)
        python = sys.executable
        commands = {
            "web": web_command(python, addr),
            "worker": [
                python,
                "-m",
                "celery",
                "-A",
                "cairn",
                "worker",
                "--beat",
                "--schedule",
                str(settings.CAIRN_HOME / "celerybeat-schedule"),
                "--loglevel",
                "INFO",
                "--concurrency",
                str(concurrency),
                "--hostname",
                f"cairn-embedded-{os.getpid()}@%h",
            ],
        }
        publishing = _local_publishing_command(python)
        if publishing:
            commands["publishing"] = publishing
        # Each child leads its own process group, so stopping it stops its children too
        # (the worker's pool processes).
        processes = {
            name: subprocess.Popen(cmd, start_new_session=True) for name, cmd in commands.items()
        }
        self.stdout.write(f"Cairn is up on http://{addr}/ (Ctrl-C stops everything).")
        signal.signal(signal.SIGTERM, _stop)
        try:
            while all(p.poll() is None for p in processes.values()):
                time.sleep(0.5)
            stopped = [n for n, p in processes.items() if p.poll() is not None]
            self.stderr.write(f"{', '.join(stopped)} stopped; shutting the rest down.")
        except KeyboardInterrupt:
            pass
        finally:
            for process in processes.values():
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)  # the leader stops its own children
            deadline = time.monotonic() + 10
            for process in processes.values():
                try:
                    process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
                # Whatever is left of the group (a pool child that ignored SIGTERM) goes now.
                _signal_group(process, signal.SIGKILL)


def web_command(python: str, addr: str) -> list[str]:
    """The web process, as docs/deployment.md runs it in production, bound to ``addr``."""
    return [
        python,
        "-m",
        "gunicorn",
        "--config",
        "python:cairn.gunicorn",
        "--bind",
        addr,
        "cairn.wsgi:application",
    ]


def _local_publishing_command(python: str) -> list[str] | None:
    """The demo's publish step writes to the local publishing service when
    CAIRN_PUBLISHING_URL points at this machine: start that service too. Its publications
    persist in CAIRN_HOME/publishing.json; its token, if any, is the same secret reference."""
    url = urlsplit(settings.CAIRN_PUBLISHING_URL)
    if url.scheme != "http" or url.hostname not in ("127.0.0.1", "localhost") or not url.port:
        return None
    command = [
        python,
        "-m",
        "runtime.providers.publishing_service",
        "--port",
        str(url.port),
        "--state-file",
        str(settings.CAIRN_HOME / "publishing.json"),
    ]
    scheme, _, name = settings.CAIRN_PUBLISHING_TOKEN_REF.partition(":")
    if scheme == "env" and name:
        command += ["--token-env", name]
    return command


def _stop(signum, frame):  # noqa: ANN001
    # SIGTERM (e.g. from a process manager) shuts down as cleanly as Ctrl-C.
    raise KeyboardInterrupt


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
