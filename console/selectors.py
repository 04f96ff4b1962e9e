"""Reads behind the console pages, tenant filter built in. Each page is a fixed number of
queries however many rows it shows: per-row facts are annotations, never lookups."""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any

from django.apps import apps
from django.conf import settings
from django.db.models import Count, Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from cairn.ids import run_id_prefix_bounds
from checkpoints.models import ExternalOperation, OperationStatus, Run, RunStatus
from tenants.models import Tenant

# sort key in the URL → model field; every order ends with the primary key for a stable
# keyset.
SORTS: dict[str, str] = {
    "created": "created_at",
    "updated": "updated_at",
    "restores": "restore_count",
}
DEFAULT_SORT = "-created"


def stalled_before() -> datetime:
    return timezone.now() - timedelta(seconds=settings.CAIRN_STALLED_OPERATION_SECONDS)


def stalled_operations(tenant: Tenant) -> QuerySet[ExternalOperation]:
    """Pending operations nobody confirmed within CAIRN_STALLED_OPERATION_SECONDS of their
    first attempt (retries do not reset the clock)."""
    return ExternalOperation.objects.filter(
        tenant=tenant, status=OperationStatus.PENDING, created_at__lt=stalled_before()
    )


def _approval_request_model() -> type | None:
    # The approvals app may not define its models yet; the console works without them.
    try:
        return apps.get_model("approvals", "ApprovalRequest")
    except LookupError:
        return None


def _waiting_for_approval() -> Q:
    model = _approval_request_model()
    waiting = Q(status=RunStatus.WAITING_APPROVAL)
    if model is not None:
        live = model.objects.filter(run=OuterRef("pk"), status="pending")
        waiting |= Q(Exists(live))
    return waiting


def _day_start(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


def runs_matching(tenant: Tenant, filters: dict[str, Any]) -> QuerySet[Run]:
    """The tenant's runs narrowed by the runs-page filters (cleaned form data).

    Dates are whole days: ``created_to`` includes the runs of that day.
    """
    runs = Run.objects.filter(tenant=tenant)
    if filters.get("status"):
        runs = runs.filter(status=filters["status"])
    for key in ("workflow_type", "workflow_version", "state"):
        if filters.get(key):
            runs = runs.filter(**{key: filters[key]})
    for field in ("created", "updated"):
        if filters.get(f"{field}_from"):
            runs = runs.filter(**{f"{field}_at__gte": _day_start(filters[f"{field}_from"])})
        # The last day a calendar has bounds nothing (and has no day after it to end at).
        if filters.get(f"{field}_to") and filters[f"{field}_to"] < date.max:
            end = _day_start(filters[f"{field}_to"] + timedelta(days=1))
            runs = runs.filter(**{f"{field}_at__lt": end})
    if filters.get("restored_more_than") is not None:
        runs = runs.filter(restore_count__gt=filters["restored_more_than"])
    if filters.get("stalled"):
        stalled = stalled_operations(tenant).filter(run=OuterRef("pk"))
        runs = runs.filter(Exists(stalled))
    if filters.get("waiting_approval"):
        runs = runs.filter(_waiting_for_approval())
    if filters.get("paused"):
        runs = runs.filter(paused=True)
    if filters.get("q"):
        runs = runs.filter(_search(filters["q"]))
    return runs


def _search(text: str) -> Q:
    text = text.strip()
    match = Q(objective_ref__icontains=text)
    bounds = run_id_prefix_bounds(text)
    if bounds:
        match |= Q(pk__range=bounds)
    return match


def with_row_facts(runs: QuerySet[Run], tenant: Tenant) -> QuerySet[Run]:
    """Per-row flags as annotations (one query for the whole page)."""
    stalled = stalled_operations(tenant).filter(run=OuterRef("pk"))
    return runs.annotate(has_stalled=Exists(stalled)).only(
        "id",
        "workflow_type",
        "workflow_version",
        "objective_ref",
        "state",
        "step",
        "status",
        "version",
        "restore_count",
        "created_at",
        "updated_at",
        "forked_from_run_id",
        "paused",
    )


def status_counts(runs: QuerySet[Run]) -> dict[str, int]:
    # COUNT(*) rather than COUNT(id): PostgreSQL can answer it from the (tenant, status)
    # index alone.
    rows = runs.order_by().values_list("status").annotate(n=Count("*"))
    counts = {status: 0 for status in RunStatus.values}
    counts.update(dict(rows))
    return counts


def status_and_paused_counts(runs: QuerySet[Run]) -> tuple[dict[str, int], int]:
    """Runs per status, and how many of them an operator paused (a hold apart from the
    status): one query."""
    rows = (
        runs.order_by()
        .values_list("status")
        .annotate(n=Count("*"), held=Count("id", filter=Q(paused=True)))
    )
    counts = {status: 0 for status in RunStatus.values}
    paused = 0
    for status, n, held in rows:
        counts[status] = n
        paused += held
    return counts, paused


@dataclass(frozen=True)
class Page:
    rows: list[Run]
    next_cursor: str | None
    previous_cursor: str | None


def _encode(value: object, pk: object, direction: str) -> str:
    raw = json.dumps([direction, _plain(value), str(pk)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _plain(value: object) -> object:
    return value.isoformat() if isinstance(value, datetime) else value


def _decode(cursor: str, field: str) -> tuple[str, object, str] | None:
    """(direction, value, pk), or None for a cursor that is not ours (start over)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        direction, value, pk = json.loads(raw)
        if direction not in ("n", "p"):
            return None
        if field.endswith("_at"):
            value = datetime.fromisoformat(value)
            if value.tzinfo is None:
                return None
        elif type(value) is not int or not -(2**63) < value < 2**63:
            return None
        return direction, value, str(uuid.UUID(pk))
    except (ValueError, TypeError, AttributeError):
        return None


def keyset_page(runs: QuerySet[Run], *, sort: str, cursor: str | None, size: int) -> Page:
    """One page in ``sort`` order after (or before) the cursor. No OFFSET: the cost of a
    page does not grow with how deep it is."""
    descending = sort.startswith("-")
    field = SORTS[sort.lstrip("-")]
    position = _decode(cursor, field) if cursor else None
    backwards = position is not None and position[0] == "p"
    # Walking backwards reads the reverse order and flips the rows afterwards.
    reverse = descending != backwards
    order = [f"-{field}", "-pk"] if reverse else [field, "pk"]
    if position is not None:
        _, value, pk = position
        op = "lt" if reverse else "gt"
        runs = runs.filter(Q(**{f"{field}__{op}": value}) | Q(**{field: value, f"pk__{op}": pk}))
    rows = list(runs.order_by(*order)[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    if backwards:
        rows.reverse()
    if not rows:
        return Page(rows, None, None)
    first, last = rows[0], rows[-1]
    has_next = more if not backwards else True
    has_previous = more if backwards else position is not None
    return Page(
        rows,
        _encode(getattr(last, field), last.pk, "n") if has_next else None,
        _encode(getattr(first, field), first.pk, "p") if has_previous else None,
    )
