"""A storage that cannot take a write answers 503 ``storage_unavailable`` with Retry-After on
every upload path, like a database that is down, and leaves nothing half-written: no row,
no object. The disks are real: a small tmpfs filled to the last byte, or remounted
read-only. The bucket is a real S3 client talking to an address nobody listens on.

The upload paths: the API with a Content-Length body, with a body large enough to be sealed
through a temporary file (the temporary disk fails), with a chunked body through a real
gunicorn, and a worker's step storing an artifact (it waits to retry, then goes on). A
test holds the API's routes that take raw bytes to this list.
"""

from __future__ import annotations

import errno
import http.client
import os
import subprocess
import tempfile
from collections.abc import Iterator
from email.message import Message
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from botocore.config import Config
from django.urls import URLPattern, URLResolver

from api import urls as api_urls
from api.views import RawBytesParser
from checkpoints.models import Artifact, Run, RunStatus
from runtime.executor import run_advance
from tenants.services import Actor, token_issue
from tests.approvals_support import start_demo
from tests.publishing import free_port
from tests.web_server import web_server  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

UPLOAD_ROUTES = {"artifacts"}  # the API routes that take raw bytes (every one is tested)


class SmallDisk:
    """A 512 KiB tmpfs: ``fail("full")`` fills it, ``fail("read-only")`` remounts it so;
    ``heal()`` undoes either."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, how: str) -> None:
        if how == "read-only":
            subprocess.run(["mount", "-o", "remount,ro", str(self.path)], check=True)
            return
        with open(self.path / "filler", "wb", buffering=0) as filler:
            try:
                while True:
                    filler.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC

    def heal(self) -> None:
        subprocess.run(["mount", "-o", "remount,rw", str(self.path)], check=True)
        (self.path / "filler").unlink(missing_ok=True)

    def artifacts(self) -> list[Path]:
        return [p for p in self.path.rglob("*") if p.is_file() and p.name != "filler"]


@pytest.fixture
def disk(tmp_path) -> Iterator[SmallDisk]:  # noqa: ANN001
    path = tmp_path / "disk"
    path.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k,mode=0777", "tmpfs", str(path)], check=True
    )
    try:
        yield SmallDisk(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def token(acme, bob) -> str:  # noqa: ANN001
    return token_issue(tenant=acme, user=bob, actor=Actor.system("test"))[1]


def assert_refused_and_nothing_stored(status: int, headers: Message, body: dict, sentence: str):  # noqa: ANN201
    assert status == 503, body
    assert body["code"] == "storage_unavailable"
    assert sentence in body["detail"] and "nothing was stored" in body["detail"]
    assert int(headers["Retry-After"]) > 0
    assert not Artifact.objects.exists()


SENTENCE = {"full": "disk is full", "read-only": "disk is read-only"}


def post(api_as, bob, acme, data: bytes):  # noqa: ANN001, ANN201
    response = api_as(bob, acme).post(
        "/api/v1/artifacts", data, content_type="text/plain", HTTP_X_ARTIFACT_KIND="source"
    )
    return response.status_code, response, response.json()


@pytest.mark.parametrize("how", SENTENCE)
def test_an_upload_to_a_full_or_read_only_disk_is_503_and_stores_nothing(
    how, disk, settings, api_as, bob, acme
):  # noqa: ANN001
    settings.MEDIA_ROOT = str(disk.path)
    disk.fail(how)
    status, response, body = post(api_as, bob, acme, b"a source, " * 1000)
    assert_refused_and_nothing_stored(status, response, body, f"artifact {SENTENCE[how]}")
    assert disk.artifacts() == []  # not even part of one
    disk.heal()
    status, _, body = post(api_as, bob, acme, b"a source, " * 1000)
    assert status == 201 and len(disk.artifacts()) == 1


@pytest.mark.parametrize("how", SENTENCE)
def test_a_large_upload_whose_temporary_disk_fails_is_503_and_stores_nothing(
    how, disk, monkeypatch, api_as, bob, acme
):  # noqa: ANN001
    monkeypatch.setattr(tempfile, "tempdir", str(disk.path))  # TMPDIR, for this process
    disk.fail(how)
    data = os.urandom(2 * 1024 * 1024)  # sealed through a temporary file past 1 MiB
    status, response, body = post(api_as, bob, acme, data)
    assert_refused_and_nothing_stored(status, response, body, f"temporary {SENTENCE[how]}")


def send_chunked(url: str, data: bytes, token: str) -> tuple[int, dict, dict]:
    import json

    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    try:
        connection.request(
            "POST",
            "/api/v1/artifacts",
            body=(data[i : i + 4096] for i in range(0, len(data), 4096)),
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "text/plain",
                "Transfer-Encoding": "chunked",
            },
            encode_chunked=True,
        )
        response = connection.getresponse()
        return response.status, response.headers, json.loads(response.read())
    finally:
        connection.close()


@pytest.mark.parametrize("how", SENTENCE)
def test_a_chunked_upload_to_a_failing_disk_is_503_from_a_real_server(
    how,
    disk,
    web_server,  # noqa: F811
    token,
):  # noqa: ANN001
    server = web_server(env={"CAIRN_MEDIA_ROOT": str(disk.path)})
    disk.fail(how)
    status, headers, body = send_chunked(server.url, os.urandom(300_000), token)
    assert_refused_and_nothing_stored(status, headers, body, f"artifact {SENTENCE[how]}")
    assert disk.artifacts() == []
    assert "Traceback" not in server.log()


def test_an_upload_to_a_bucket_that_cannot_be_reached_is_503(settings, api_as, bob, acme):  # noqa: ANN001
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {
            "BACKEND": "cairn.storage.ArtifactS3Storage",
            "OPTIONS": {
                "bucket_name": "cairn-nowhere",
                "endpoint_url": f"http://127.0.0.1:{free_port()}",
                "region_name": "us-east-1",
                "access_key": "x",
                "secret_key": "y",
                "client_config": Config(retries={"max_attempts": 1}, connect_timeout=2),
            },
        },
    }
    status, response, body = post(api_as, bob, acme, b"to the bucket")
    assert_refused_and_nothing_stored(status, response, body, "artifact bucket cannot be reached")


@pytest.mark.parametrize("how", SENTENCE)
def test_a_step_storing_to_a_failing_disk_waits_to_retry_then_goes_on(
    how, disk, settings, acme, bob
):  # noqa: ANN001
    settings.MEDIA_ROOT = str(disk.path)
    run = start_demo(acme, bob)
    disk.fail(how)
    assert run_advance(run_id=run.pk, expected_version=run.version, owner="w") == "waiting_retry"
    run.refresh_from_db()
    assert SENTENCE[how] in run.status_reason and not Artifact.objects.exists()
    disk.heal()
    Run.objects.filter(pk=run.pk).update(next_eligible_at=None)
    run.refresh_from_db()
    assert run_advance(run_id=run.pk, expected_version=run.version, owner="w") == (
        RunStatus.WAITING_APPROVAL
    )


def _routes(patterns, prefix: str = "") -> Iterator[tuple[str, object]]:  # noqa: ANN001
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _routes(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield pattern.name, getattr(pattern.callback, "view_class", None)


def test_every_api_route_that_takes_raw_bytes_is_an_upload_path_tested_here():
    takes_bytes = {
        name
        for name, view in _routes(api_urls.urlpatterns)
        if view is not None and RawBytesParser in getattr(view, "parser_classes", ())
    }
    assert takes_bytes == UPLOAD_ROUTES
