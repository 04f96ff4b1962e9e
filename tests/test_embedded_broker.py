"""The embedded default's broker (cairn.broker): a worker polling the folder while a message
is being written never reads half of it (kombu's own filesystem transport hands it an empty
file, and the worker stops with "Unrecoverable error: JSONDecodeError")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from queue import Empty

import pytest
from kombu import Connection

import cairn.broker

ROOT = Path(__file__).resolve().parent.parent


def _channel(tmp_path, transport: str):  # noqa: ANN001, ANN202
    folder = tmp_path / "out"
    folder.mkdir()
    connection = Connection(
        "filesystem://",
        transport=transport,
        transport_options={
            "data_folder_in": str(folder),
            "data_folder_out": str(folder),
            "control_folder": str(tmp_path / "control"),
            "store_processed": False,
        },
    )
    return connection, connection.default_channel


def test_the_embedded_default_uses_the_whole_message_transport_and_polls_often(tmp_path):  # noqa: ANN001
    """As a deployment with nothing set reads its settings (the tests run on another broker)."""
    environment = {
        k: v for k, v in os.environ.items() if k not in ("CELERY_BROKER_URL", "DATABASE_URL")
    }
    environment["CAIRN_HOME"] = str(tmp_path / "home")
    read = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, cairn.settings as s; print(json.dumps([s.CELERY_BROKER_URL, "
            "s.CELERY_BROKER_TRANSPORT, s.CELERY_BROKER_TRANSPORT_OPTIONS['polling_interval']]))",
        ],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert read.returncode == 0, read.stderr
    url, transport, interval = json.loads(read.stdout)
    assert url == "filesystem://" and transport == "cairn.broker:Transport"
    assert interval <= 0.1


def test_a_poll_during_the_write_sees_no_message_then_the_whole_one(tmp_path, monkeypatch):  # noqa: ANN001
    connection, channel = _channel(tmp_path, "cairn.broker:Transport")
    seen = []
    real_dumps = cairn.broker.dumps

    def dumps_while_polled(payload):  # noqa: ANN001, ANN202
        # A worker polls exactly while the message is being written.
        try:
            seen.append(channel._get("celery"))
        except Empty:
            seen.append("empty")
        return real_dumps(payload)

    monkeypatch.setattr(cairn.broker, "dumps", dumps_while_polled)
    channel._put("celery", {"body": "run.resume", "n": 1})
    assert seen == ["empty"]
    assert channel._get("celery") == {"body": "run.resume", "n": 1}
    with pytest.raises(Empty):
        channel._get("celery")
    connection.release()


def test_a_write_that_fails_half_way_leaves_nothing_a_worker_would_take(tmp_path, monkeypatch):  # noqa: ANN001
    connection, channel = _channel(tmp_path, "cairn.broker:Transport")

    def no_rename(*args):  # noqa: ANN002, ANN202
        raise OSError("disk full")

    monkeypatch.setattr(cairn.broker.os, "replace", no_rename)
    with pytest.raises(Exception, match="Cannot add file"):
        channel._put("celery", {"body": "x"})
    with pytest.raises(Empty):
        channel._get("celery")
    connection.release()
