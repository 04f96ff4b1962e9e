"""The lease a worker holds while it works on a run, and the usage it charges meanwhile.

Usage (attempts, tokens, cost, elapsed seconds) is written to ``Run.budget_used`` as it is
spent, guarded by the lease owner and run version, so a crash never forgets it: the next
checkpoint's budgets start from that high-water mark (the commit refuses to lower it).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.db import connection, transaction

from checkpoints.errors import CairnError
from checkpoints.models import Run
from checkpoints.services.checkpoints import BUDGET_USED_KEYS
from checkpoints.services.leases import lease_acquire, lease_release

from .errors import LeaseLost

log = logging.getLogger("cairn.runtime")


def used_merge(*sources: dict[str, Any] | None) -> dict[str, Any]:
    """The largest value of each usage counter among the sources (usage never shrinks)."""
    merged: dict[str, Any] = {key: 0 for key in BUDGET_USED_KEYS}
    for source in sources:
        for key in BUDGET_USED_KEYS:
            value = (source or {}).get(key)
            if isinstance(value, int | float) and value > merged[key]:
                merged[key] = value
    return merged


class LeaseKeeper:
    """Holds one run's lease for one worker: renews it (also from a background thread during
    a long step), charges usage under it, and releases it."""

    def __init__(self, *, run: Run, owner: str, version: int, ttl_seconds: int) -> None:
        self.run_id = run.pk
        self.tenant = run.tenant
        self.owner = owner
        self.version = version
        self.ttl_seconds = ttl_seconds
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.RLock()
        self._elapsed_since_flush = 0.0
        self._mark = time.monotonic()

    def _guard(self):  # noqa: ANN202
        return Run.objects.filter(pk=self.run_id, version=self.version, lease_owner=self.owner)

    def renew(self) -> None:
        """Extend the lease. Raises LeaseLost when it is no longer this worker's."""
        try:
            lease_acquire(
                tenant=self.tenant,
                run_id=self.run_id,
                owner=self.owner,
                ttl_seconds=self.ttl_seconds,
                expected_version=self.version,
            )
        except CairnError as exc:
            self.lost = True
            raise LeaseLost(exc.detail)

    def charge(self, **deltas: float) -> dict[str, Any]:
        """Add usage to the run (one transaction, only while this worker holds the lease).
        Returns the run's usage afterwards. Raises LeaseLost."""
        with self._lock, transaction.atomic():
            row = self._guard().select_for_update().values_list("budget_used", flat=True).first()
            if row is None:
                self.lost = True
                raise LeaseLost("the run's lease or version changed")
            used = used_merge(row)
            for key, delta in deltas.items():
                used[key] = (
                    round(used[key] + delta, 6) if isinstance(delta, float) else (used[key] + delta)
                )
            self._guard().update(budget_used=used)
            return used

    def flush_elapsed(self) -> dict[str, Any]:
        """Charge the wall-clock time since the last flush. Raises LeaseLost."""
        with self._lock:
            now = time.monotonic()
            elapsed, self._mark = now - self._mark, now
            return self.charge(elapsed_seconds=round(elapsed, 3))

    def restart_clock(self) -> None:
        self._mark = time.monotonic()

    # --- renewal during a step -------------------------------------------------------------
    def start_renewing(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="cairn-lease", daemon=True)
        self._thread.start()

    def stop_renewing(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _renew_loop(self) -> None:
        interval = max(0.2, self.ttl_seconds / 3)
        try:
            while not self._stop.wait(interval):
                try:
                    self.renew()
                    self.flush_elapsed()
                except LeaseLost:
                    log.warning("lease lost during a step", extra={"run": str(self.run_id)})
                    return
                except Exception:  # a database hiccup: try again at the next interval
                    log.exception("lease renewal failed", extra={"run": str(self.run_id)})
        finally:
            connection.close()  # this thread's own connection

    def release(self) -> None:
        self.stop_renewing()
        try:
            lease_release(tenant=self.tenant, run_id=self.run_id, owner=self.owner)
        except Exception:
            log.exception("lease release failed", extra={"run": str(self.run_id)})
