"""Run leases: one owner at a time, with expiry, taken with a conditional UPDATE.

A lease does not change the run's version (it is not history); it is granted only while the
caller's ``expected_version`` is current, so a worker holding a stale command cannot lease.
Taking over an expired lease of another owner is a restore and increments restore_count.

Expiry is set and compared on the database's clock (``cairn.clock``): the UPDATE writes
``now + ttl`` and calls a lease free when it ``<= now``, both the statement's time, so a
worker whose clock is off neither takes a healthy lease early nor sets one that has already
expired. Each case is one prepared statement (``tenants.prepared``): every worker task
takes a lease before its first step.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.core.exceptions import ValidationError

from cairn.credentials import free_text_refuse
from cairn.errors import ConcurrentCheckpointWrite, InvalidRequest, LeaseHeld, RunNotActive
from checkpoints.models import ACTIVE_STATUSES, Run
from checkpoints.services.reads import run_get
from tenants.models import Tenant
from tenants.prepared import POSTGRES, SQLITE, Dialect, aware_datetime, statement_fetchone

MAX_TTL_SECONDS = 3600
# The active statuses as a statement's list (Cairn's own constants, never input).
ACTIVE_SQL = ", ".join(f"'{status}'" for status in sorted(ACTIVE_STATUSES))


def _lease_statement(d: Dialect, *, case: str, restore: bool = False) -> str:
    """The lease's conditional UPDATE for one case, returning the expiry it wrote (one
    prepared statement; the database's clock sets and compares the expiry)."""
    free = f"(lease_owner = '' OR lease_expires_at IS NULL OR lease_expires_at <= {d.now})"
    owner = d.p("owner", "text")
    where = {
        "new": f"{free} AND lease_owner = ''",
        "mine": f"lease_owner = {owner}",
        "take over": f"{free} AND lease_owner <> ''",
    }[case]
    return f"""
    UPDATE {Run._meta.db_table} SET lease_owner = {owner}, lease_expires_at = {d.later("ttl")}
        {", restore_count = restore_count + 1" if restore else ""}
     WHERE id = {d.p("run_id", "uuid")} AND version = {d.p("version", "bigint")}
       AND status IN ({ACTIVE_SQL}) AND {where}
    RETURNING lease_expires_at"""


_LEASE_NEW, _LEASE_MINE, _LEASE_TAKE_OVER = (
    (_lease_statement(POSTGRES, **kw), _lease_statement(SQLITE, **kw))
    for kw in ({"case": "new"}, {"case": "mine"}, {"case": "take over", "restore": True})
)


@dataclass(frozen=True)
class Lease:
    run_id: UUID
    owner: str
    expires_at: datetime
    run_version: int
    restore_count: int
    took_over: bool


def lease_acquire(
    *,
    tenant: Tenant,
    run_id: UUID | str,
    owner: str,
    ttl_seconds: int,
    expected_version: int,
    run: Run | None = None,
) -> Lease:
    """Grant or renew the lease to ``owner``. One conditional UPDATE; atomic.

    ``run`` is the run as the caller just read it (a worker reads it to decide whether to
    lease at all); without it the run is read first. The returned ``expires_at`` is the
    database's, as the UPDATE wrote it. The UPDATE checks the version either way, so a
    stale ``run`` is refused, never leased.

    Raises NotFound, RunNotActive, ConcurrentCheckpointWrite (the version moved) or
    LeaseHeld (another owner's lease has not expired).
    """
    if not owner or len(owner) > 200:
        raise InvalidRequest("owner must be 1-200 characters.", fields={"owner": "required"})
    if run is None:  # a worker passes its run and names itself; a client's owner is its text
        free_text_refuse({"owner": owner})
    if not isinstance(ttl_seconds, int) or not 1 <= ttl_seconds <= MAX_TTL_SECONDS:
        raise InvalidRequest(
            f"ttl_seconds must be between 1 and {MAX_TTL_SECONDS}.",
            fields={"ttl_seconds": "out of range"},
        )
    read_back = run is None or str(run.pk) != str(run_id) or run.tenant_id != tenant.id
    if read_back:
        run = run_get(tenant=tenant, run_id=run_id)
    # The three cases are disjoint (a free lease, this owner's, another owner's expired
    # one); a new task's lease, the common case, is the first statement.
    took_over = False
    params = {"run_id": run.pk, "version": expected_version, "owner": owner, "ttl": ttl_seconds}
    row = statement_fetchone(*_LEASE_NEW, params) or statement_fetchone(*_LEASE_MINE, params)
    if row is None:
        # Someone else's expired lease: taking it over is a restore.
        row = statement_fetchone(*_LEASE_TAKE_OVER, params)
        took_over = row is not None
    if row is None:
        run.refresh_from_db()
        if run.status not in ACTIVE_STATUSES:
            raise RunNotActive(f"The run is {run.status}; it cannot be leased.")
        if run.version != expected_version:
            raise ConcurrentCheckpointWrite(
                f"The run is at version {run.version}, not {expected_version}."
            )
        raise LeaseHeld(
            f"The run is leased by {run.lease_owner} until {run.lease_expires_at.isoformat()}."
        )
    # The statement matched the expected version, so the run is at it; a take-over counted
    # one more restore than the run had when it was read. The expiry is the database's.
    expires_at = aware_datetime(row[0])
    return Lease(
        run_id=run.id,
        owner=owner,
        expires_at=expires_at,
        run_version=expected_version,
        restore_count=run.restore_count + (1 if took_over else 0),
        took_over=took_over,
    )


def lease_release(*, tenant: Tenant, run_id: UUID | str, owner: str) -> bool:
    """Release the lease if ``owner`` holds it. Returns whether it did; never raises LeaseHeld.
    Raises NotFound for a run the tenant does not have."""
    try:
        released = Run.objects.filter(tenant=tenant, pk=run_id, lease_owner=owner).update(
            lease_owner="", lease_expires_at=None
        )
    except (ValueError, ValidationError):  # not a UUID
        released = 0
    if not released:
        run_get(tenant=tenant, run_id=run_id)  # NotFound for a run the tenant lacks
    return bool(released)
