"""A real S3-protocol server on loopback for the tests: moto's standalone server.

``s3_server`` starts ``moto.server`` as a subprocess on a free port once per test session
(an HTTP server speaking the S3 API, not an in-process mock). ``s3_storage`` gives a test
its own bucket and points Django's default storage at it through Cairn's S3 settings;
``s3_storage.env`` is what a subprocess needs to use the same bucket.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import boto3
import pytest

from tests.scaleout_support import REPO, free_port

ACCESS_KEY, SECRET_KEY = "cairn-test-access", "cairn-test-secret"  # moto accepts any pair


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[str]:  # noqa: ANN001
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "w") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            cwd=REPO,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/moto-api/", timeout=2):  # noqa: S310
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the moto S3 server did not start:\n{log.read_text()}")
            time.sleep(0.2)
    try:
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@dataclass
class S3Bucket:
    endpoint: str
    bucket: str
    env: dict[str, str]

    def client(self):  # noqa: ANN201
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )

    def keys(self) -> list[str]:
        listing = self.client().list_objects_v2(Bucket=self.bucket)
        return sorted(item["Key"] for item in listing.get("Contents", []))


def s3_env(endpoint: str, bucket: str) -> dict[str, str]:
    return {
        "CAIRN_ARTIFACT_STORAGE": "s3",
        "CAIRN_S3_BUCKET": bucket,
        "CAIRN_S3_ENDPOINT_URL": endpoint,
        "CAIRN_S3_REGION": "us-east-1",
        "CAIRN_S3_ADDRESSING_STYLE": "path",
        "CAIRN_S3_ACCESS_KEY_ID_REF": "env:CAIRN_TEST_S3_ACCESS_KEY",
        "CAIRN_S3_SECRET_ACCESS_KEY_REF": "env:CAIRN_TEST_S3_SECRET_KEY",
        "CAIRN_TEST_S3_ACCESS_KEY": ACCESS_KEY,
        "CAIRN_TEST_S3_SECRET_KEY": SECRET_KEY,
    }


@pytest.fixture
def s3_storage(s3_server: str, settings, monkeypatch) -> S3Bucket:  # noqa: ANN001
    """Django's default storage on a fresh bucket of the loopback S3 server (real settings:
    the storage is built by cairn.settings.artifact_storage from the CAIRN_S3_* variables)."""
    from cairn import settings as cairn_settings

    bucket = f"cairn-test-{uuid.uuid4().hex[:12]}"
    env = s3_env(s3_server, bucket)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
        if hasattr(cairn_settings, name):
            monkeypatch.setattr(cairn_settings, name, value)
    store = S3Bucket(endpoint=s3_server, bucket=bucket, env=env)
    store.client().create_bucket(Bucket=bucket)
    settings.STORAGES = {**settings.STORAGES, "default": cairn_settings.artifact_storage()}
    return store
