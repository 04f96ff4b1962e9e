"""The test fault injector: what a fault point (cairn/faults.py) does in a test process.

tests/settings.py names ``inject`` as ``CAIRN_FAULT_INJECTOR``; the worker, web server and
command subprocesses the tests start use tests.settings too, and a test arms them through
the environment it gives them:

- ``CAIRN_TEST_CRASH_AT=<fault point>`` SIGKILLs the process at that point, once:
  ``CAIRN_TEST_CRASH_MARKER`` names a file created at the crash, and an existing marker
  disarms it, so the resumed worker goes through (tests/publishing.py ``run_killed_at``);
- ``CAIRN_TEST_CRASH_SKIP=<n>`` lets the process pass the crash point n times first (counted
  in that process), so a test can kill it in the middle of a loop (a bulk action's runs);
- ``CAIRN_RETENTION_TEST_PAUSE=<seconds>`` sleeps at ``retention.batch``, inside the
  batch's transaction, so a test can kill the job mid-batch
  (tests/retention_support.py ``start_job``).

(``CAIRN_TEST_STORAGE_STALL`` needs no fault point: tests/settings.py swaps in the stalling
storage of tests/storage.py.) The variables are read at each call, in the process that
reaches the point, so one test process can arm one subprocess and not the next.
"""

from __future__ import annotations

import os
import signal
import time

CRASH_AT = "CAIRN_TEST_CRASH_AT"
CRASH_MARKER = "CAIRN_TEST_CRASH_MARKER"
CRASH_SKIP = "CAIRN_TEST_CRASH_SKIP"
RETENTION_PAUSE = "CAIRN_RETENTION_TEST_PAUSE"


_passed: dict[str, int] = {}


def inject(point: str) -> None:
    if os.environ.get(CRASH_AT) == point:
        _passed[point] = _passed.get(point, 0) + 1
        if _passed[point] > int(os.environ.get(CRASH_SKIP) or 0):
            _crash_once(point)
    if point == "retention.batch":
        pause = float(os.environ.get(RETENTION_PAUSE) or 0)
        if pause:
            time.sleep(pause)


def _crash_once(point: str) -> None:
    marker = os.environ.get(CRASH_MARKER, "")
    if marker:
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return
        os.write(fd, point.encode())
        os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)
