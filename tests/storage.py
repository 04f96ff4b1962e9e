"""A storage backend for crash tests: it writes the first half of each file, then stalls
for ``CAIRN_TEST_STORAGE_STALL`` seconds, like a slow object store a kill can catch in
the middle of an upload. tests/settings.py selects it when the variable is set (only the
web server subprocess of such a test has it)."""

from __future__ import annotations

import os
import time

from django.core.files.storage import FileSystemStorage


class StallingStorage(FileSystemStorage):
    def _save(self, name, content):  # noqa: ANN001, ANN202
        path = self.path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = content.read()
        with open(path, "wb") as handle:
            handle.write(data[: len(data) // 2])
            handle.flush()
            os.fsync(handle.fileno())
        time.sleep(float(os.environ["CAIRN_TEST_STORAGE_STALL"]))
        with open(path, "ab") as handle:
            handle.write(data[len(data) // 2 :])
        return name
