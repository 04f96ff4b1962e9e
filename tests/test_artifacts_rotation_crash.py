"""Key rotation cannot lose an artifact: a process killed (SIGKILL) at any point of
``artifact_reseal`` leaves every artifact readable, on the filesystem and on S3.

The rotation runs in a child process (tests/rotation_crash.py) on this test's database and
storage, with a new key first; the test then reads every artifact with the old and the new
key configured (as during a rotation), finishes the rotation, and reads them again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from django.conf import settings as django_settings

from checkpoints import crypto
from checkpoints.models import Artifact
from checkpoints.services.artifacts import artifact_content, artifact_store
from checkpoints.services.keys import keys_rotate
from tests.scaleout_support import REPO
from tests.worker_fixtures import database_env

pytestmark = pytest.mark.django_db(transaction=True)
POINTS = ["during_write", "after_write", "before_commit", "after_commit"]


def objects(s3) -> set[str]:  # noqa: ANN001
    if s3 is not None:
        return set(s3.keys())
    root = django_settings.MEDIA_ROOT
    return {
        os.path.relpath(os.path.join(folder, name), root)
        for folder, _, names in os.walk(root)
        for name in names
    }


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("where", ["filesystem", "s3"])
def test_a_rotation_killed_at_any_point_leaves_every_artifact_readable(
    acme, settings, request, where, point
):
    s3 = request.getfixturevalue("s3_storage") if where == "s3" else None
    # Each larger than a few chunks, so the crash happens on the first artifact rotated.
    contents = [os.urandom(200 * 1024) for _ in range(3)]
    for data in contents:
        artifact_store(tenant=acme, data=data, media_type="application/octet-stream")
    old_key = settings.CAIRN_ENCRYPTION_KEYS
    both_keys = f"{crypto.new_key_spec('k-new')},{old_key}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "CAIRN_ENCRYPTION_KEYS": both_keys,
        "CAIRN_MEDIA_ROOT": str(settings.MEDIA_ROOT),
        **database_env(),
        **(s3.env if s3 else {}),
    }
    child = subprocess.run(
        [sys.executable, "-m", "tests.rotation_crash", point],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, (child.returncode, child.stdout, child.stderr)

    settings.CAIRN_ENCRYPTION_KEYS = both_keys
    rows = list(Artifact.objects.order_by("created_at"))
    assert [artifact_content(row) for row in rows] == contents
    switched = sum(row.key_id == "k-new" for row in rows)
    assert switched == (1 if point == "after_commit" else 0)
    for row in rows:
        assert row.storage_name in objects(s3)

    # Run again: it finishes, and every artifact reads under the new key alone.
    assert keys_rotate()["artifacts"] == (2 if point == "after_commit" else 3)
    settings.CAIRN_ENCRYPTION_KEYS = both_keys.split(",")[0]
    rows = list(Artifact.objects.order_by("created_at"))
    assert [artifact_content(row) for row in rows] == contents
    assert {row.key_id for row in rows} == {"k-new"}
