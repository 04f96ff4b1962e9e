"""A web server killed in the middle of an upload leaves an encrypted file that no row
names. The retention job (and ``manage.py sweep_orphans`` alone) removes such files once
they are an hour old, reports them first with ``--dry-run``, and never touches a file a
row names or an upload that may still be in flight."""

from __future__ import annotations

import os
import threading
import time
import urllib.error
import urllib.request
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.core.management import call_command

from checkpoints.models import Artifact
from checkpoints.services.artifacts import artifact_content, artifact_store
from tenants.services import Actor, token_issue
from tests.web_server import web_server  # noqa: F401
from tests.worker_fixtures import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

TWO_HOURS = 2 * 3600


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()} if root.exists() else set()


def age(path: Path, seconds: int) -> None:
    """Make the file look ``seconds`` old (what an hour of waiting would do)."""
    then = time.time() - seconds
    os.utime(path, (then, then))


def upload_until_killed(url: str, token: str, data: bytes) -> threading.Thread:
    def post() -> None:
        request = urllib.request.Request(
            f"{url}/api/v1/artifacts",
            data=data,
            method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "text/plain"},
        )
        try:
            urllib.request.urlopen(request, timeout=120)  # noqa: S310 - our own server
        except (urllib.error.URLError, ConnectionError, OSError):
            pass  # the server dies under it

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    return thread


def test_files_a_killed_upload_left_are_swept_once_an_hour_old(web_server, acme, bob):  # noqa: ANN001, F811
    _, token = token_issue(tenant=acme, user=bob, actor=Actor.system("test"))
    media = Path(settings.MEDIA_ROOT)
    server = web_server(env={"CAIRN_TEST_STORAGE_STALL": "120"})
    upload = upload_until_killed(server.url, token, b"a draft the server never finished\n" * 50)
    # The server has written half of the encrypted file and stalls: kill it there.
    partial = wait_for(
        lambda: next((p for p in files_under(media) if p.stat().st_size > 0), None),
        what="the server to start writing the artifact file",
    )
    server.kill()
    upload.join(timeout=30)
    assert not Artifact.objects.exists()  # the row never came: the file is an orphan

    kept, _ = artifact_store(tenant=acme, data=b"a real artifact\n", media_type="text/plain")
    kept_path = Path(default_storage.path(kept.storage_name))
    young = Path(
        default_storage.path(
            default_storage.save(
                f"artifacts/{acme.id}/in-flight", ContentFile(b"an upload still being written")
            )
        )
    )
    for path in (partial, kept_path):
        age(path, TWO_HOURS)

    out = StringIO()
    call_command("apply_retention", "--dry-run", stdout=out)
    assert "orphan files 1" in out.getvalue(), out.getvalue()
    listed = StringIO()
    call_command("sweep_orphans", "--dry-run", stdout=listed)
    assert partial.name in listed.getvalue() and "would remove 1 files" in listed.getvalue()
    assert partial.exists(), "a dry run deleted a file"

    out = StringIO()
    call_command("apply_retention", stdout=out)
    assert "orphan files 1" in out.getvalue(), out.getvalue()
    assert not partial.exists()
    assert young.exists(), "a file younger than an hour may still be an upload in flight"
    assert kept_path.exists() and artifact_content(kept) == b"a real artifact\n"
    # A second sweep finds nothing more to do.
    again = StringIO()
    call_command("sweep_orphans", stdout=again)
    assert "removed 0 files; 1 younger orphans" in again.getvalue(), again.getvalue()
