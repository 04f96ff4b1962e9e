"""A multi-machine rehearsal: a web process, a scheduler and two workers, each a "machine"
with its own CAIRN_HOME and nothing on disk in common, sharing only what docs/deployment.md
says must be shared (PostgreSQL, a real broker, the S3 bucket, the keys).

The demo research run is started and approved over HTTP; its publish call is held by the
publishing service (a recorded publication whose answer never comes in time), and the worker
making it is killed with SIGKILL. The other worker takes the run over, reconciles the
publication, and the run succeeds with exactly one publication. Every artifact is then read
from the web process, from a new process on each worker machine, and from this one.

Runs in CI on the PostgreSQL passes: once with Redis, once with RabbitMQ.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints.models import Artifact, ExternalOperation, Run, RunStatus
from runtime.management.commands.cairn_up import web_command
from tenants.services import Actor, token_issue
from tests.publishing import PublishingService
from tests.scaleout_support import free_port, json_request, process, python, wait_http
from tests.worker_fixtures import database_env, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.worker]

# Variables a machine of the test run would otherwise inherit and share with the others.
LOCAL_STATE = ("CAIRN_HOME", "CAIRN_MEDIA_ROOT", "CAIRN_SQLITE_PATH", "CAIRN_KEY_FILE")
LOCAL_STATE += ("CAIRN_BROKER_DIR", "CAIRN_SECRETS_DIR", "DJANGO_SETTINGS_MODULE")

READ_ALL = """
import hashlib, json
from checkpoints.models import Artifact
from checkpoints.services.artifacts import artifact_content
print(json.dumps({str(a.pk): hashlib.sha256(artifact_content(a)).hexdigest()
                  for a in Artifact.objects.all()}))
"""


def machine_env(home: Path, shared: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LOCAL_STATE}
    home.mkdir(parents=True)
    return {**env, "DJANGO_SETTINGS_MODULE": "cairn.settings", "CAIRN_HOME": str(home), **shared}


def celery(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "cairn", *args, "--loglevel", "INFO"]


def worker_args(name: str) -> list[str]:
    return celery(
        "worker", "--pool", "solo", "--hostname", f"{name}@%h", "--without-gossip",
        "--without-mingle", "--without-heartbeat",
    )  # fmt: skip


@pytest.fixture
def slow_publishing(tmp_path):  # noqa: ANN001, ANN201
    """The publishing service; a 'timeout' fault holds its answer for a minute."""
    service = PublishingService(tmp_path / "publishing.json", timeout_sleep=60).start()
    try:
        yield service
    finally:
        service.stop()


def test_two_worker_machines_a_web_machine_and_a_kill_publish_once_and_read_everything(
    postgres_only, acme, alice, bob, carol, broker, s3_storage, slow_publishing, tmp_path
):
    assert not broker.url.startswith("filesystem"), (
        "the rehearsal needs a real broker: set CAIRN_TEST_REDIS_URL or CAIRN_TEST_BROKER_URL"
    )
    shared = {
        **database_env(),
        **broker.env,
        **s3_storage.env,
        "CAIRN_ENCRYPTION_KEYS": os.environ["CAIRN_ENCRYPTION_KEYS"],
        "DJANGO_SECRET_KEY": "rehearsal-secret-key-shared-by-the-web-processes-" + "x" * 20,
        "CAIRN_PUBLISHING_URL": slow_publishing.url,
        # A self-hosted provider on an internal address is allowed by name, as a deployment
        # would list it (cairn.outbound refuses internal destinations otherwise).
        "CAIRN_OUTBOUND_ALLOWED_INTERNAL": urlsplit(slow_publishing.url).netloc,
        "CAIRN_PROVIDER_TIMEOUT_SECONDS": "45",
        "CAIRN_LEASE_SECONDS": "2",
        "CAIRN_LOG_LEVEL": "INFO",
    }
    homes = {name: tmp_path / f"machine-{name}" for name in ("web", "w1", "w2")}
    envs = {name: machine_env(home, shared) for name, home in homes.items()}
    _, operator = token_issue(tenant=acme, user=bob, actor=Actor.system("test"))
    _, reviewer = token_issue(tenant=acme, user=carol, actor=Actor.system("test"))
    _, admin = token_issue(tenant=acme, user=alice, actor=Actor.system("test"))
    port = free_port()
    base = f"http://127.0.0.1:{port}/api/v1"

    with ExitStack() as stack:
        start = stack.enter_context
        # The web machine runs what docs/deployment.md recommends (cairn/gunicorn.py).
        web = [*web_command(sys.executable, f"127.0.0.1:{port}"), "--no-control-socket"]
        start(process(web, env=envs["web"], log=tmp_path / "web.log"))
        beat_schedule = str(homes["web"] / "celerybeat-schedule")
        start(
            process(celery("beat", "-s", beat_schedule), env=envs["web"], log=tmp_path / "beat.log")
        )
        workers = {
            name: start(process(worker_args(name), env=envs[name], log=tmp_path / f"{name}.log"))
            for name in ("w1", "w2")
        }
        wait_http(f"{base}/runs")

        status, created = json_request(
            f"{base}/runs",
            token=operator,
            body={
                "workflow_type": "research",
                "inputs": {"question": "Why do hikers build cairns?"},
                "budget": {"max_attempts": 20, "max_tokens": 100000, "max_cost": 10.0},
            },
        )
        assert status == 201, created
        run = Run.objects.get(pk=created["id"])
        request = wait_for(
            lambda: ApprovalRequest.objects.filter(run=run, status=ApprovalStatus.PENDING).first(),
            what="the run to ask for approval",
            timeout=180,
        )

        slow_publishing.faults("timeout")  # the publication is recorded; the answer is late
        status, decided = json_request(
            f"{base}/approvals/{request.pk}/decision",
            token=reviewer,
            body={"decision": "approve", "artifact_sha256": request.artifact_sha256},
        )
        assert status == 200, decided
        wait_for(
            lambda: slow_publishing.stats()["publications"] == 1,
            what="the publish call to reach the provider",
            timeout=120,
        )
        run.refresh_from_db()
        owner_pid = int(run.lease_owner.split(":")[1])
        killed = next(name for name, proc in workers.items() if proc.pid == owner_pid)
        os.killpg(workers[killed].pid, signal.SIGKILL)
        workers[killed].wait(timeout=30)

        wait_for(
            lambda: Run.objects.filter(pk=run.pk, status=RunStatus.SUCCEEDED).exists(),
            what="the surviving worker to finish the run",
            timeout=180,
        )
        survivor = next(name for name in workers if name != killed)
        assert workers[survivor].poll() is None

        # Every artifact, from the web process (over HTTP) …
        artifacts = {str(a.pk): a.sha256 for a in Artifact.objects.filter(tenant=acme)}
        assert len(artifacts) >= 2  # the sources and the draft, at least
        for artifact_id, sha256 in artifacts.items():
            status, _ = json_request(f"{base}/artifacts/{artifact_id}", token=admin)
            assert status == 200
            content = _get_bytes(f"{base}/artifacts/{artifact_id}/content", token=admin)
            assert hashlib.sha256(content).hexdigest() == sha256
        # … from a new process on each worker machine, the killed one's included …
        for name in ("w1", "w2"):
            seen = json.loads(python(READ_ALL, env=envs[name]).strip().splitlines()[-1])
            assert seen == artifacts, name
    # … and from this process.
    from checkpoints.services.artifacts import artifact_content

    for artifact in Artifact.objects.filter(tenant=acme):
        assert hashlib.sha256(artifact_content(artifact)).hexdigest() == artifact.sha256

    run.refresh_from_db()
    assert (run.state, run.restore_count >= 1) == ("done", True)
    assert slow_publishing.stats()["publications"] == 1
    operation = ExternalOperation.objects.get(run=run, action="publish")
    assert operation.status == "confirmed"
    # The bucket holds the artifacts; no machine kept one on its own disk.
    assert {a.storage_name for a in Artifact.objects.all()} <= set(s3_storage.keys())
    for home in homes.values():
        assert not (home / "media").exists() or not any((home / "media").rglob("*.*"))


def _get_bytes(url: str, *, token: str) -> bytes:
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - loopback
        return response.read()
