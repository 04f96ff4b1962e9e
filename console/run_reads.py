"""Reads behind the run and checkpoint pages. Fixed query counts: every list is one
query (bounded), never a lookup per row."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db.models import QuerySet
from django.http import Http404
from django.utils import timezone

from cairn.errors import CairnError
from checkpoints.models import (
    Artifact,
    ArtifactReference,
    Checkpoint,
    ExternalOperation,
    OperationStatus,
    Run,
)
from checkpoints.selectors import checkpoint_read
from checkpoints.services.budgets import budget_remaining
from console.selectors import stalled_before
from tenants.access import ConsoleAccess
from tenants.models import AuditEvent, Tenant

TIMELINE_LIMIT = 200
OPERATIONS_LIMIT = 200
AUDIT_LIMIT = 100
FORKS_LIMIT = 50

BUDGETS = (
    ("attempts", "Attempts", "attempts_used", "max_attempts"),
    ("tokens", "Tokens", "tokens_used", "max_tokens"),
    ("cost", "Cost", "cost_used", "max_cost"),
)


def run_for_page(*, tenant: Tenant, run_id: object) -> Run:
    """The tenant's run with what its page shows alongside; 404 for anyone else's."""
    try:
        return Run.objects.select_related(
            "workflow", "forked_from_run", "forked_from_checkpoint"
        ).get(tenant=tenant, pk=run_id)
    except (Run.DoesNotExist, ValueError):
        raise Http404("No such run in this tenant.")


def envelope_for_page(
    access: ConsoleAccess, *, run_id: object, sequence: int
) -> tuple[dict[str, Any] | None, str]:
    """A checkpoint's decrypted envelope for a page, and "" (the read is audited by
    ``checkpoint_read``); or None and the sentence the page shows instead (it cannot be
    decrypted, or retention removed it)."""
    try:
        _, envelope = checkpoint_read(
            tenant=access.tenant, run_id=run_id, sequence=sequence, actor=access.actor
        )
    except CairnError as exc:
        return None, exc.detail
    return envelope, ""


def budget_bars(run: Run) -> list[dict[str, Any]]:
    """Used and left per budget; ``limit`` None means unlimited (no bar)."""
    left = budget_remaining(run)
    used = run.budget_used or {}
    bars = []
    for key, label, used_key, limit_key in BUDGETS:
        limit = run.budget_limits.get(limit_key)
        spent = used.get(used_key, 0)
        bars.append(
            {
                "key": key,
                "label": label,
                "used": spent,
                "limit": limit,
                "left": left.get(key),
                "percent": _percent(spent, limit),
            }
        )
    deadline = run.budget_limits.get("deadline")
    if deadline:
        end = datetime.fromisoformat(deadline)
        total = (end - run.created_at).total_seconds()
        elapsed = (timezone.now() - run.created_at).total_seconds()
        bars.append(
            {
                "key": "deadline",
                "label": "Time to deadline",
                "used": round(elapsed),
                "limit": round(total),
                "left": left.get("deadline_seconds"),
                "percent": _percent(elapsed, total),
                "deadline": end,
            }
        )
    return bars


def _percent(used: float, limit: float | None) -> int:
    if not limit:
        return 0
    return max(0, min(100, round(100 * used / limit)))


def _before(raw: str | None) -> int | None:
    """A keyset cursor from the query string (a positive whole number), else None."""
    raw = (raw or "").strip()
    return int(raw) if raw.isdigit() and len(raw) < 19 else None


def timeline(run: Run, before: str | None = None) -> tuple[list[Checkpoint], int | None]:
    """A page of TIMELINE_LIMIT checkpoints, newest first, older than sequence ``before``
    (the query string's ``checkpoints_before``), and the cursor of the next older page (or
    None). The envelope ciphertext is not loaded."""
    rows = Checkpoint.objects.filter(tenant_id=run.tenant_id, run=run)
    cursor = _before(before)
    if cursor is not None:
        rows = rows.filter(sequence__lt=cursor)
    page = list(
        rows.only(
            "id",
            "sequence",
            "state",
            "step",
            "created_at",
            "actor",
            "sha256",
            "is_evidence",
            "attempt",
        ).order_by("-sequence")[: TIMELINE_LIMIT + 1]
    )
    more = len(page) > TIMELINE_LIMIT
    _mark_lost_attempts(page)
    page = page[:TIMELINE_LIMIT]
    return page, (page[-1].sequence if more else None)


def _mark_lost_attempts(page: list[Checkpoint]) -> None:
    """Set ``lost_before`` on each checkpoint that ends a step attempt: how many attempts
    were charged between the previous recorded attempt (older, on this page or the extra
    row fetched past it) and this one without a checkpoint of their own (a worker that
    stopped mid-step; each attempt is charged before its step runs)."""
    older_number = None
    for checkpoint in reversed(page):  # oldest first
        attempt = checkpoint.attempt or {}
        number = attempt.get("number")
        checkpoint.lost_before = 0
        if not isinstance(number, int):
            continue
        if older_number is not None:
            checkpoint.lost_before = max(0, number - older_number - 1)
        older_number = number


def states_visited(run: Run) -> list[str]:
    return list(
        Checkpoint.objects.filter(tenant_id=run.tenant_id, run=run)
        .order_by("sequence")
        .values_list("state", flat=True)
    )


def run_names_artifact(run: Run, artifact_id: object) -> bool:
    """Whether a checkpoint of ``run`` names the artifact (the retention index answers,
    so no envelope is decrypted)."""
    return ArtifactReference.objects.filter(checkpoint__run=run, artifact_id=artifact_id).exists()


def artifacts_referenced(tenant: Tenant, refs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The envelope's artifact references joined with the stored rows (one query)."""
    ids = [str(ref.get("id")) for ref in refs]
    stored = {str(a.pk): a for a in Artifact.objects.filter(tenant=tenant, pk__in=ids)}
    return [
        {
            "ref": ref,
            "name": ref.get("name") or "",
            "kind": getattr(stored.get(str(ref.get("id"))), "kind", None) or ref.get("kind", ""),
            "artifact": stored.get(str(ref.get("id"))),
            "matches": (
                str(ref.get("id")) in stored
                and stored[str(ref.get("id"))].sha256 == ref.get("sha256")
            ),
        }
        for ref in refs
    ]


def operations(run: Run) -> list[ExternalOperation]:
    rows = list(
        ExternalOperation.objects.filter(tenant_id=run.tenant_id, run=run)
        .defer("request_sealed", "result_sealed")
        .order_by("created_at")[:OPERATIONS_LIMIT]
    )
    cutoff = stalled_before()
    for row in rows:
        row.is_stalled = row.status == OperationStatus.PENDING and row.created_at < cutoff
    return rows


def audit_trail(run: Run, before: str | None = None) -> tuple[list[AuditEvent], int | None]:
    """A page of the run's AUDIT_LIMIT newest events older than event id ``before`` (the
    query string's ``audit_before``), and the cursor of the next older page, or None (one
    row more is read to know)."""
    rows = AuditEvent.objects.filter(tenant_id=run.tenant_id, run_id=run.pk)
    cursor = _before(before)
    if cursor is not None:
        rows = rows.filter(id__lt=cursor)
    page = list(rows.order_by("-id")[: AUDIT_LIMIT + 1])
    more = len(page) > AUDIT_LIMIT
    page = page[:AUDIT_LIMIT]
    return page, (page[-1].id if more else None)


def forks(run: Run) -> QuerySet[Run]:
    return (
        Run.objects.filter(tenant_id=run.tenant_id, forked_from_run=run)
        .select_related("forked_from_checkpoint")
        .only("id", "status", "state", "created_at", "forked_from_checkpoint__sequence")
        .order_by("-created_at")[:FORKS_LIMIT]
    )


def optional_selector(module: str, name: str) -> Callable[..., Any] | None:
    """A selector another app may provide; the console renders its slot only if it exists."""
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
