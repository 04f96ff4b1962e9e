"""Loaded (through PYTHONPATH) only by worker processes the clock-skew tests run under
Debian's faketime (tests/test_clock_skew_workers.py).

libfaketime 0.9.10 with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` (the monotonic clock must stay
real, or every timed lock and event wait in Python hangs) hands Python 3.11's ``time.sleep``
a negative deadline (``clock_nanosleep`` on ``CLOCK_MONOTONIC`` with ``TIMER_ABSTIME``:
wolfcw/libfaketime#426) and it raises EINVAL. Sleeping on ``select``'s relative timeout
instead keeps the worker whole; only the wall clock is off, as on a drifted machine.
"""

import select
import time

_monotonic = time.monotonic


def _sleep(seconds: float) -> None:
    deadline = _monotonic() + seconds
    while (left := deadline - _monotonic()) > 0:
        select.select([], [], [], left)


time.sleep = _sleep
