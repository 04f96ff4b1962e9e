"""Real Celery workers for tests: subprocesses on the test database and a test broker.

``broker`` points this process's Celery app at a per-test broker: the broker URL in
``CAIRN_TEST_BROKER_URL`` when it is set (CI's RabbitMQ pass: ``amqp://…``, each test on a
queue of its own), else Redis when ``CAIRN_TEST_REDIS_URL`` is set (CI's PostgreSQL pass),
else the embedded filesystem transport in a temp dir.
``worker_factory(name=...)`` starts ``celery -A cairn worker --pool solo`` with the same
database, keys, media root and broker; every worker is killed when the test ends.
Use them with ``@pytest.mark.django_db(transaction=True)`` so the worker sees committed rows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import kombu.pools
import pytest
from django.conf import settings as django_settings
from django.db import connection

REPO = Path(__file__).resolve().parent.parent
TEST_WORKFLOW_MODULES = "runtime.demo,tests.runtime_workflows"


def wait_for(
    predicate: Callable[[], object],
    *,
    what: str,
    timeout: float = 60.0,
    detail: Callable[[], str] | None = None,
) -> object:
    """Poll until ``predicate()`` is truthy; fail the test naming ``what`` otherwise (and
    what ``detail()`` says of the state then, when given). This is a condition wait, not a
    timing assertion: the timeout only bounds a broken run."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            said = f"\n{detail()}" if detail is not None else ""
            pytest.fail(f"timed out waiting for {what}{said}")
        time.sleep(0.05)


@dataclass
class Broker:
    url: str
    env: dict[str, str]


def _reset_producer_pools(app) -> None:  # noqa: ANN001
    # Celery's app.pool is kombu's global pool for the broker URL: closing it alone leaves
    # the closed pool registered, and the next test on the same URL (Redis) fails to
    # publish. reset() closes every pool and forgets them.
    kombu.pools.reset()
    app._pool = None
    amqp = app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None


def test_broker_url() -> str:
    """The broker the worker tests run on: '' for the embedded filesystem transport."""
    return os.environ.get("CAIRN_TEST_BROKER_URL") or os.environ.get("CAIRN_TEST_REDIS_URL", "")


def broker_leftovers_clear(broker: Broker) -> None:
    """No message of an earlier test on a shared Redis, queued or held (RabbitMQ needs
    nothing: each test has a queue of its own).

    A held message is one a worker took and was killed before acknowledging (most worker
    tests end by SIGKILL). kombu keeps it in its ``unacked`` hash and gives it back to the
    queue once the visibility timeout has passed, an hour later, to whichever worker then
    looks: a later CI run's, in the middle of some test (tests/test_broker_leftovers.py).
    """
    if not broker.url.startswith(("redis://", "rediss://")):
        return
    from cairn.celery import app

    with app.connection_for_write() as conn:
        channel = conn.default_channel
        channel.queue_purge("celery")
        channel.client.delete(
            channel.unacked_key, channel.unacked_index_key, channel.unacked_mutex_key
        )


@pytest.fixture
def broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Broker]:
    from cairn.celery import app

    remote_url = test_broker_url()
    queue = ""
    if remote_url.startswith(("redis://", "rediss://")):
        url, options = remote_url, {"visibility_timeout": 3600}
        env = {"CELERY_BROKER_URL": url}
    elif remote_url:
        # A shared RabbitMQ: a queue per test, so parallel suites never take each other's
        # messages (Redis gets that from a database number per suite).
        url, options = remote_url, {}
        queue = f"cairn-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        env = {"CELERY_BROKER_URL": url, "CAIRN_TASK_QUEUE": queue}
    else:
        folder = tmp_path / "broker"
        for sub in ("out", "processed", "control"):
            (folder / sub).mkdir(parents=True)
        url = "filesystem://"
        options = {
            "data_folder_in": str(folder / "out"),
            "data_folder_out": str(folder / "out"),
            "processed_folder": str(folder / "processed"),
            # Without it kombu writes its exchange table into ./control of the cwd.
            "control_folder": str(folder / "control"),
            "store_processed": False,
        }
        env = {"CELERY_BROKER_URL": url, "CAIRN_BROKER_DIR": str(folder)}
    saved = (
        app.conf.broker_url,
        app.conf.broker_transport_options,
        app.conf.task_default_queue,
        app.conf.broker_transport,
    )
    # Celery reads CELERY_BROKER_URL from the environment before its configuration.
    monkeypatch.setenv("CELERY_BROKER_URL", url)
    app.conf.broker_url, app.conf.broker_transport_options = url, options
    # The test process publishes as a deployment's processes do: on the filesystem, whole
    # messages only (cairn.broker), as the workers it starts read them.
    app.conf.broker_transport = "cairn.broker:Transport" if url == "filesystem://" else None
    if queue:
        app.conf.task_default_queue = queue
    _reset_producer_pools(app)
    broker = Broker(url=url, env=env)
    broker_leftovers_clear(broker)
    try:
        yield broker
    finally:
        _reset_producer_pools(app)
        if queue:
            with app.connection_for_write() as conn:
                conn.default_channel.queue_delete(queue)
            _reset_producer_pools(app)
        app.conf.broker_url, app.conf.broker_transport_options = saved[:2]
        app.conf.task_default_queue, app.conf.broker_transport = saved[2:]


def database_env() -> dict[str, str]:
    """Environment that points a subprocess at this test run's database."""
    params = connection.settings_dict
    if connection.vendor == "sqlite":
        return {"CAIRN_SQLITE_PATH": str(params["NAME"])}
    user = quote(params.get("USER") or "", safe="")
    password = quote(params.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = params.get("HOST") or "127.0.0.1"
    port = params.get("PORT") or "5432"
    return {"DATABASE_URL": f"postgres://{auth}{host}:{port}/{params['NAME']}"}


@dataclass
class Worker:
    name: str
    process: subprocess.Popen
    log_path: Path
    _log: object = field(repr=False, default=None)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: no shutdown handler runs, the lease stays held until it expires."""
        if self.alive:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        """At the end of a test nothing a worker does matters any more: kill the group."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)


WORKER_LEASE_SECONDS = 2


@pytest.fixture
def worker_factory(
    transactional_db, broker: Broker, tmp_path: Path, settings
) -> Iterator[Callable[..., Worker]]:  # noqa: ANN001
    """worker_factory(name="w1", env={...}, wrap=[...]) → a running worker subprocess;
    ``wrap`` is a command the worker runs under (``["faketime", "-f", "+120s"]``)."""
    settings.CAIRN_LEASE_SECONDS = WORKER_LEASE_SECONDS  # the rescue sweep in this process
    started: list[Worker] = []

    def start(
        name: str = "w1", env: dict[str, str] | None = None, wrap: Sequence[str] = ()
    ) -> Worker:
        log_path = tmp_path / f"worker-{name}-{len(started)}.log"
        full_env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "CAIRN_MEDIA_ROOT": str(django_settings.MEDIA_ROOT),
            "CAIRN_LEASE_SECONDS": str(WORKER_LEASE_SECONDS),
            "CAIRN_WORKFLOW_MODULES": TEST_WORKFLOW_MODULES,
            "CAIRN_LOG_LEVEL": "INFO",
            **broker.env,
            **database_env(),
            **(env or {}),
        }
        full_env.pop("DJANGO_DEBUG", None)
        log = open(log_path, "w")  # noqa: SIM115 - closed when the worker is reaped
        process = subprocess.Popen(
            [
                *wrap,
                sys.executable,
                "-m",
                "celery",
                "-A",
                "cairn",
                "worker",
                "--pool",
                "solo",
                # The prefetch window is concurrency × multiplier; left alone, concurrency is
                # the CPU count, so a busy solo worker would hold a second command it cannot
                # run (RabbitMQ pushes it; Redis leaves it queued) while another worker idles.
                "--concurrency",
                "1",
                "--loglevel",
                "INFO",
                "--hostname",
                # The test process's pid too: suites sharing one RabbitMQ must not share a
                # node name (its pidbox queue is exclusive to one connection).
                f"{name}-{len(started)}-{os.getpid()}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            cwd=REPO,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: kill() reaches every child
        )
        worker = Worker(name=name, process=process, log_path=log_path, _log=log)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
        worker._log.close()
        # Shown by pytest only when the test failed.
        print(f"--- worker {worker.name} log (tail) ---\n{worker.log()[-4000:]}")
