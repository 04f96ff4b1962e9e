"""Reading the audit log: filters, keyset pages and streaming exports (CSV, JSON lines).

The log is append-only; nothing here writes to it except ``audit_export_record``, which
records that someone took a copy.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from cairn.ids import run_id_prefix_bounds
from tenants.models import AuditEvent, Tenant
from tenants.services import Actor, audit_record

EXPORT_FIELDS = (
    "id",
    "created_at",
    "action",
    "actor",
    "run_id",
    "target",
    "reason",
    "ip",
    "details",
)
# A spreadsheet runs a cell that starts with one of these as a formula.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def audit_actions(tenant: Tenant) -> list[str]:
    """The distinct actions recorded for the tenant (the filter's choices)."""
    return list(
        AuditEvent.objects.filter(tenant=tenant)
        .order_by("action")
        .values_list("action", flat=True)
        .distinct()
    )


def audit_events(*, tenant: Tenant, filters: dict[str, Any]) -> QuerySet[AuditEvent]:
    """The tenant's events narrowed by the cleaned filter form data, newest first."""
    rows = AuditEvent.objects.filter(tenant=tenant)
    if filters.get("action"):
        rows = rows.filter(action=filters["action"])
    if filters.get("actor"):
        rows = rows.filter(actor_label__iexact=filters["actor"].strip())
    if filters.get("run"):
        # The form admits only a run id or a prefix of one (``run_id_prefix_bounds``).
        rows = rows.filter(run_id__range=run_id_prefix_bounds(filters["run"]))
    if filters.get("since"):
        rows = rows.filter(created_at__gte=filters["since"])
    if filters.get("until"):
        rows = rows.filter(created_at__lt=filters["until"])
    return rows.order_by("-id")


def details_json(details: Any) -> str:
    """An event's details as compact JSON for the page (as the CSV export writes them, but
    with non-ASCII text as it is, not escaped)."""
    return json.dumps(details, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class AuditPage:
    rows: list[AuditEvent]
    older: int | None  # the ``before`` cursor of the next (older) page


def audit_page(rows: QuerySet[AuditEvent], *, before: int | None, size: int) -> AuditPage:
    """One page older than ``before`` (an event id). Keyset, so deep pages cost the same."""
    if before is not None:
        rows = rows.filter(id__lt=before)
    page = list(rows[: size + 1])
    more = len(page) > size
    page = page[:size]
    return AuditPage(rows=page, older=page[-1].id if more and page else None)


def _plain(event: AuditEvent) -> dict[str, Any]:
    return {
        "id": event.id,
        "created_at": event.created_at.isoformat().replace("+00:00", "Z"),
        "action": event.action,
        "actor": event.actor_label,
        "run_id": str(event.run_id) if event.run_id else None,
        "target": event.target,
        "reason": event.reason,
        "ip": event.ip,
        "details": event.details,
    }


def audit_jsonl(rows: QuerySet[AuditEvent]) -> Iterator[str]:
    """One JSON object per line, streamed in chunks (the log may be large)."""
    for event in rows.iterator(chunk_size=1000):
        yield json.dumps(_plain(event), sort_keys=True, separators=(",", ":")) + "\n"


class _Line:
    def write(self, value: str) -> str:
        return value


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        value = json.dumps(value, sort_keys=True, separators=(",", ":"))
    text = str(value)
    return "'" + text if text.startswith(_FORMULA_START) else text


def audit_csv(rows: QuerySet[AuditEvent]) -> Iterator[str]:
    """A header line, then one row per event; cells a spreadsheet would run are defused."""
    writer = csv.writer(_Line())
    yield writer.writerow(EXPORT_FIELDS)
    for event in rows.iterator(chunk_size=1000):
        plain = _plain(event)
        yield writer.writerow([_cell(plain[field]) for field in EXPORT_FIELDS])


def audit_export_record(
    *, tenant: Tenant, actor: Actor, export_format: str, filters: dict[str, Any]
) -> None:
    """Record that ``actor`` exported the log (with which filters). Atomic."""
    with transaction.atomic():
        audit_record(
            tenant=tenant,
            actor=actor,
            action="audit.exported",
            target=export_format,
            details={key: str(value) for key, value in filters.items() if value},
        )
