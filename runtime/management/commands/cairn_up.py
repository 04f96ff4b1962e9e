"""Start the whole embedded product: web server, Celery worker with the beat scheduler, and
the local publishing service the demo publishes to, and keep them up: a child that dies is
started again (``Supervisor``). The web server is the one production runs
(docs/deployment.md): gunicorn with ``cairn/gunicorn.py``, never Django's development server.
"""

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
        parser.add_argument("--addr", default=os.environ.get("CAIRN_ADDR") or "127.0.0.1:8000")
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
        supervisor = Supervisor(commands, out=self.stdout, err=self.stderr)
        supervisor.start_all()
        self.stdout.write(f"Cairn is up on http://{addr}/ (Ctrl-C stops everything).")
        self.stdout.flush()
        signal.signal(signal.SIGTERM, _stop)
        try:
            supervisor.watch()
        except KeyboardInterrupt:
            pass
        finally:
            supervisor.stop_all()


# A child that dies is started again after RESTART_DELAY seconds; one that dies more than
# MAX_RESTARTS times within RESTART_WINDOW seconds is broken, not unlucky: everything stops.
RESTART_DELAY = 1.0
MAX_RESTARTS = 5
RESTART_WINDOW = 60.0


class Supervisor:
    """The embedded product's children (web, worker with the beat, the local publishing
    service), each restarted when it dies: a ``kill -9`` of the worker (the README's tour)
    leaves the console up and a new worker takes over the runs (their leases are rescued as
    for any dead worker). Each child leads its own process group, so stopping it stops its
    children too (the worker's pool processes)."""

    def __init__(self, commands: dict[str, list[str]], *, out, err) -> None:  # noqa: ANN001
        self.commands = commands
        self.out, self.err = out, err
        self.processes: dict[str, subprocess.Popen] = {}
        self.deaths: dict[str, list[float]] = {name: [] for name in commands}

    def start(self, name: str) -> None:
        process = subprocess.Popen(self.commands[name], start_new_session=True)
        self.processes[name] = process
        self.out.write(f"{name} started (pid {process.pid}).")
        self.out.flush()

    def start_all(self) -> None:
        for name in self.commands:
            self.start(name)

    def watch(self) -> None:
        """Until Ctrl-C (or SIGTERM): restart each child that dies; stop everything when one
        keeps dying."""
        while True:
            time.sleep(0.5)
            for name, process in list(self.processes.items()):
                code = process.poll()
                if code is None:
                    continue
                # Whatever is left of its group (pool children) goes with it.
                _signal_group(process, signal.SIGKILL)
                now = time.monotonic()
                recent = [t for t in self.deaths[name] if now - t < RESTART_WINDOW] + [now]
                self.deaths[name] = recent
                if len(recent) > MAX_RESTARTS:
                    self.err.write(
                        f"{name} stopped {len(recent)} times within {RESTART_WINDOW:.0f} s "
                        f"(exit code {code}); shutting everything down."
                    )
                    return
                self.err.write(f"{name} stopped (exit code {code}); starting it again.")
                self.err.flush()
                time.sleep(RESTART_DELAY)
                self.start(name)

    def stop_all(self) -> None:
        processes = list(self.processes.values())
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)  # the leader stops its own children
        deadline = time.monotonic() + 10
        for process in processes:
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
        "cairn.asgi:application",
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
