"""Fault points: the named places where a test may crash, pause or stall a real process.

Production code marks a place a process can die, and that the crash tests stop at, with

    fault_point("effect.reserved")

which does nothing unless ``settings.CAIRN_FAULT_INJECTOR`` is the dotted path of a callable
taking the point's name. ``cairn/settings.py`` sets it to None and does not read it from the
environment, so no deployment can turn a fault point on; only a settings module that sets it
can (``tests/settings.py`` names ``tests.faults.inject``, which the test harness drives
through environment variables it gives the worker and command subprocesses it starts).

The fault points:

- ``effect.reserved``, ``effect.pending``, ``effect.accepted``, ``effect.stored``,
  ``effect.checkpointed``: the boundaries of the side-effect protocol (runtime/effects.py);
- ``effect.submitted``, ``effect.polling``: a long-running tool's job id recorded, the job
  observed;
- ``retention.batch``: inside each retention batch's transaction, just before it commits
  (the ``apply_retention`` command);
- ``run.leased``: a worker has just taken a run's lease, before its restore;
- ``approval.granted``: the approval gate found the run's approval granted, before the
  commit that consumes it and moves the run past its approval state;
- ``bulk.run_acted``: a bulk action has acted on one run, inside the transaction that records
  that run's outcome, before it commits (runtime/services/bulk.py).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from django.conf import settings
from django.utils.module_loading import import_string


def fault_point(name: str) -> None:
    """Hand ``name`` to the configured fault injector; a no-op when none is configured
    (always, under the production settings)."""
    path = settings.CAIRN_FAULT_INJECTOR
    if path:
        _injector(path)(name)


@cache
def _injector(path: str) -> Callable[[str], None]:
    # Imported once per path: a fault point sits on the effect protocol's hot path.
    return import_string(path)
