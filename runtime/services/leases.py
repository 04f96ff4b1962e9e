"""Run leases: one owner at a time, with expiry, taken with a conditional UPDATE.

A lease does not change the run's version (it is not history); it is granted only while the
caller's ``expected_version`` is current, so a worker holding a stale command cannot lease.
Taking over an expired lease of another owner is a restore and increments restore_count.

Expiry is set and compared on the database's clock (``cairn.clock``): the UPDATE writes
``Now() + ttl`` and calls a lease free when it ``<= Now()``, so a worker whose clock is off
neither takes a healthy lease early nor sets one that has already expired.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db.models import F, Q
from django.db.models.functions import Now

from cairn import clock
from cairn.credentials import free_text_refuse
from cairn.errors import ConcurrentCheckpointWrite, InvalidRequest, LeaseHeld, RunNotActive
from checkpoints.models import ACTIVE_STATUSES, Run
from checkpoints.services.reads import run_get
from tenants.models import Tenant

MAX_TTL_SECONDS = 3600


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
    lease at all); without it the run is read first, and the returned ``expires_at`` is
    read back from the row (the database's value, for an API client). With ``run`` it is
    this process's estimate (``cairn.clock.now``): a worker renews well before it anyway.
    The UPDATE checks the version either way, so a stale ``run`` is refused, never leased.

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
    ttl = timedelta(seconds=ttl_seconds)
    expires = Now() + ttl  # on the database's clock, like every comparison below
    read_back = run is None or str(run.pk) != str(run_id) or run.tenant_id != tenant.id
    if read_back:
        run = run_get(tenant=tenant, run_id=run_id)
    free = Q(lease_owner="") | Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=Now())
    mine = Q(lease_owner=owner)
    base = Run.objects.filter(pk=run.pk, version=expected_version, status__in=ACTIVE_STATUSES)
    # The three cases are disjoint (a free lease, this owner's, another owner's expired
    # one); a new task's lease, the common case, is the first UPDATE.
    took_over = False
    updated = base.filter(free, lease_owner="").update(lease_owner=owner, lease_expires_at=expires)
    if not updated:
        updated = base.filter(mine).update(lease_expires_at=expires)
    if not updated:
        # Someone else's expired lease: taking it over is a restore.
        updated = took_over = bool(
            base.filter(free)
            .exclude(lease_owner="")
            .update(
                lease_owner=owner, lease_expires_at=expires, restore_count=F("restore_count") + 1
            )
        )
    if not updated:
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
    # The UPDATE matched the expected version, so the run is at it; a take-over counted one
    # more restore than the run had when it was read.
    if read_back:
        expires_at = Run.objects.values_list("lease_expires_at", flat=True).get(pk=run.pk)
    else:
        expires_at = clock.now() + ttl
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
