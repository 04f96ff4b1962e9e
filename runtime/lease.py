"""The lease a worker holds while it works on a run, and the usage it charges meanwhile.

Usage (attempts, tokens, cost, elapsed seconds) is written to ``Run.budget_used`` as it is
spent, guarded by the lease owner and run version, so a crash never forgets it: the next
checkpoint's budgets start from that high-water mark (the commit refuses to lower it).
The wall-clock time of a step is the exception: it is written by the step's own checkpoint
(``usage_now``), or charged on its own when no checkpoint follows (``flush_elapsed``), so a
step costs one write transaction besides its commit.

Every expiry this module writes is ``Now() + ttl`` on the database's clock (``cairn.clock``),
never this worker's: a worker whose clock is off keeps its lease exactly as long as one whose
clock is right.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Subquery
from django.db.models.functions import Now
from django.utils import timezone

from checkpoints.models import ACTIVE_STATUSES, OutboxMessage, Run
from checkpoints.services.checkpoints import BUDGET_USED_KEYS
from checkpoints.services.commit_sql import RunHead
from runtime.services.leases import ACTIVE_SQL, lease_release
from telemetry import tracing
from tenants.prepared import POSTGRES, SQLITE, Dialect, statement_fetchone

from .errors import LeaseLost

log = logging.getLogger("cairn.runtime")


def _protocol(method):  # noqa: ANN001, ANN202
    """The lease's statements (renewals, charges, the release) are the protocol's own: the
    task's and the step's spans time them, and a query span for each model call's charge or
    each renewal would cost more than it tells (tracing.protocol_statements)."""

    @functools.wraps(method)
    def untraced(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        with tracing.protocol_statements():
            return method(self, *args, **kwargs)

    return untraced


def _charge_statement(d: Dialect) -> str:
    """The charge: the run's usage and the lease's expiry, only while this worker holds
    the lease and the usage is the one it last wrote (one prepared statement: the first
    attempt of every task is charged with it)."""
    return f"""
    UPDATE {Run._meta.db_table}
       SET budget_used = {d.p("used", "jsonb")}, lease_expires_at = {d.later("ttl")}
     WHERE id = {d.p("run_id", "uuid")} AND version = {d.p("version", "bigint")}
       AND lease_owner = {d.p("owner", "text")} AND status IN ({ACTIVE_SQL})
       AND {d.json_equal("budget_used", "prior")}
    RETURNING 1"""


_CHARGE = (_charge_statement(POSTGRES), _charge_statement(SQLITE))


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
        self._mark = time.monotonic()
        self._used = used_merge(run.budget_used)  # as last written under this lease
        self._renewing = False
        # The run as this worker last wrote it, for the next commit (``head=``): kept in step
        # with every charge, so the commit's head check passes without a re-read.
        self.head: RunHead | None = None
        # The run.resume of this worker's last commit, which it executes itself: claimed,
        # not published; marked sent by the next commit or on release.
        self.taken_outbox_id: int | None = None

    def _guard(self):  # noqa: ANN202
        # Holding the lease means: this owner, at this version, on a run still active. An
        # expired lease nobody took over is still this worker's, as for lease_acquire.
        return Run.objects.filter(
            pk=self.run_id,
            version=self.version,
            lease_owner=self.owner,
            status__in=ACTIVE_STATUSES,
        )

    def _expiry(self):  # noqa: ANN202
        # An expression, evaluated by the database in the statement that writes it.
        return Now() + timedelta(seconds=self.ttl_seconds)

    @_protocol
    def renew(self) -> None:
        """Extend the lease (one conditional UPDATE). Raises LeaseLost when it is no longer
        this worker's, or the run moved on or ended."""
        expiry = self._expiry()
        if not self._guard().update(lease_expires_at=expiry):
            self.lost = True
            raise LeaseLost("the run's lease or version changed, or the run ended")
        self._extend_claim()

    def _extend_claim(self) -> None:
        # The command this worker took lives exactly as long as its lease: nobody publishes it
        # while the worker is alive, the sweep or the rescue does once the lease has lapsed.
        # The claim is the lease's expiry read back, not a second Now(): that one, a statement
        # later, outlived the lease, and a rescue in between skipped the dead worker's run.
        if self.taken_outbox_id is not None:
            lease = Run.objects.filter(pk=self.run_id).values("lease_expires_at")[:1]
            OutboxMessage.objects.filter(pk=self.taken_outbox_id, sent_at__isnull=True).update(
                claimed_until=Subquery(lease)
            )

    @_protocol
    def charge(self, **deltas: float) -> dict[str, Any]:
        """Add usage to the run and renew the lease, atomically and only while this worker
        holds the lease (one conditional UPDATE when the run's usage is the one this worker
        last wrote, else one locked transaction). Returns the run's usage afterwards.
        Raises LeaseLost."""
        with self._lock:
            # Only the lease holder writes the run's usage, so the usage it last wrote is the
            # run's: one conditional UPDATE charges it. Anything else (a usage this worker did
            # not write, a lost lease) goes through the locked read below, which decides.
            used = self._add(dict(self._used), deltas)
            charged = statement_fetchone(
                *_CHARGE,
                {
                    "run_id": self.run_id,
                    "version": self.version,
                    "owner": self.owner,
                    "ttl": self.ttl_seconds,
                    # The standard encoder's spacing, as the ORM writes a JSONField.
                    "used": json.dumps(used),
                    "prior": json.dumps(self._used),
                },
            )
            if charged:
                return self._charged(used)
        with self._lock, transaction.atomic():
            row = self._guard().select_for_update().values_list("budget_used", flat=True).first()
            if row is None:
                self.lost = True
                raise LeaseLost("the run's lease or version changed, or the run ended")
            used = self._add(used_merge(row), deltas)
            expiry = self._expiry()
            self._guard().update(budget_used=used, lease_expires_at=expiry)
            return self._charged(used)

    @staticmethod
    def _add(used: dict[str, Any], deltas: dict[str, float]) -> dict[str, Any]:
        for key, delta in deltas.items():
            used[key] = (
                round(used[key] + delta, 6) if isinstance(delta, float) else (used[key] + delta)
            )
        return used

    def _charged(self, used: dict[str, Any]) -> dict[str, Any]:
        self._extend_claim()
        self._used = used
        if self.head is not None:
            self.head = replace(self.head, budget_used=dict(used))
        return dict(used)

    def flush_elapsed(self) -> dict[str, Any]:
        """Charge the wall-clock time since the last flush. Raises LeaseLost."""
        with self._lock:
            now = time.monotonic()
            elapsed, self._mark = now - self._mark, now
            return self.charge(elapsed_seconds=round(elapsed, 3))

    def usage_now(self) -> dict[str, Any]:
        """The usage for the checkpoint about to be committed: what was charged, plus the
        wall-clock time since the last flush. Writes nothing; call ``committed`` once the
        checkpoint is in (until then a ``flush_elapsed`` still charges that time)."""
        with self._lock:
            used = dict(self._used)
            elapsed = time.monotonic() - self._mark
            used["elapsed_seconds"] = round(used["elapsed_seconds"] + elapsed, 3)
            return used

    def committed(self, *, version: int, used: dict[str, Any], head: RunHead | None = None) -> None:
        """A checkpoint at ``version`` recorded ``used``: the run's usage now (the commit's
        ``head``, when given, has the run's usage, which may include a prepaid attempt)."""
        with self._lock:
            self.version = version
            self._used = used_merge(used, head.budget_used if head is not None else None)
            self._mark = time.monotonic()
            self.head = head

    @property
    def released(self) -> bool:
        """Whether this worker's last commit released the lease (its ``WorkerLoop`` commit): the
        run as that commit left it names no longer this owner."""
        return self.head is not None and self.head.lease_owner != self.owner

    def restart_clock(self) -> None:
        self._mark = time.monotonic()

    # --- renewal during a step -------------------------------------------------------------
    # One renewal thread per lease, started with the first step and paused between steps
    # (a thread started per step would cost each step its start and join).
    def start_renewing(self) -> None:
        with self._lock:
            self._renewing = True
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._renew_loop, name="cairn-lease", daemon=True
            )
            self._thread.start()

    def stop_renewing(self) -> None:
        """Pause renewal. Returns once no renewal is in flight (it holds the lock), so the
        caller may move the run's version."""
        with self._lock:
            self._renewing = False

    def _end_renewing(self) -> None:
        self.stop_renewing()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _renew_loop(self) -> None:
        interval = max(0.2, self.ttl_seconds / 3)
        try:
            while not self._stop.wait(interval):
                try:
                    with self._lock:
                        if not self._renewing:
                            continue
                        self.flush_elapsed()  # a charge: it renews the lease as it writes
                except LeaseLost:
                    log.warning("lease lost during a step", extra={"run": str(self.run_id)})
                    return
                except Exception:  # a database hiccup: try again at the next interval
                    log.exception("lease renewal failed", extra={"run": str(self.run_id)})
        finally:
            connection.close()  # this thread's own connection

    @_protocol
    def release(self) -> None:
        """End renewal, mark this worker's own command done and release the lease. Never
        raises: a database that is away leaves the lease to expire (and the command's
        claim with it), which the rescue then finds."""
        self._end_renewing()
        try:
            if self.taken_outbox_id is not None:
                # This worker carried out the command itself (or the run moved on): done.
                OutboxMessage.objects.filter(pk=self.taken_outbox_id, sent_at__isnull=True).update(
                    sent_at=timezone.now()
                )
                self.taken_outbox_id = None
            if self.released:
                return  # the task's last commit released it in its own statement
            lease_release(tenant=self.tenant, run_id=self.run_id, owner=self.owner)
        except Exception:
            log.exception("lease release failed", extra={"run": str(self.run_id)})
