"""The retention job (``retention_apply``) and its preview (``retention_preview``).

Guarantees of the job:

- every batch is one short transaction, so killing the job at any point loses at most the
  batch in flight, which rolls back whole (its deletions, its compaction record, its
  counters and its audit event together);
- it touches only terminal runs not on legal hold. Each batch re-reads the run under a
  row lock taken with ``SKIP LOCKED`` and with those conditions in the WHERE clause, so it
  never waits for, nor locks, an active run, and two jobs running at once never work on
  the same run at the same moment: nothing is deleted twice and nothing kept is lost;
- a checkpoint is removed only with a ``CompactionRecord`` of its hashes, written in the same
  transaction, so ``run_verify`` still links the kept checkpoints;
- an artifact row is removed only when no checkpoint and no other row references it (the
  database's foreign key from ``ArtifactReference`` backs this); its file goes after the
  commit, through ``PendingFileDeletion`` rows that a killed job leaves for the next run;
- artifact files no row names (a web server killed mid-upload) are removed once they are
  an hour old (``retention.orphans.sweep_orphans``), in every tenant's folder.

On SQLite, writers are serialized by the database lock (IMMEDIATE transactions), which gives
the same guarantees without row locks.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.files.storage import default_storage
from django.db import connection, transaction
from django.db.models import (
    Count,
    Exists,
    OuterRef,
    ProtectedError,
    Q,
    QuerySet,
    RestrictedError,
    Sum,
)
from django.db.models.functions import Length
from django.utils import timezone

from checkpoints.models import (
    Artifact,
    ArtifactReference,
    Checkpoint,
    CompactionReason,
    CompactionRecord,
    Run,
)
from retention import plan
from retention.models import PendingFileDeletion, RetentionPolicy
from retention.orphans import sweep_orphans
from telemetry.models import MetricIncrement
from tenants.models import AuditEvent, Tenant
from tenants.services import Actor, audit_record

log = logging.getLogger("cairn.retention")

ACTOR = Actor.system("retention")
DELETED = "cairn_retention_deleted_total"
DELETED_BYTES = "cairn_retention_deleted_bytes_total"
# Runs locked together by one batch: enough that a batch fills up with small histories.
RUNS_PER_BATCH = 100


@dataclass
class RetentionReport:
    """What a run of the job removed (or, with ``dry_run``, would remove)."""

    dry_run: bool = False
    checkpoints: int = 0
    artifacts: int = 0
    bytes: int = 0
    runs_compacted: int = 0
    runs_expired: int = 0
    files: int = 0
    orphan_files: int = 0  # artifact files no row names (sweep_orphans), removed or to remove
    skipped: int = 0  # runs or batches left for the next run (locked by another job, refused)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Context:
    now: datetime
    batch_size: int
    report: RetentionReport
    progress: Callable[[str], None]
    on_batch: Callable[[], None]


def _postgres() -> bool:
    return connection.vendor == "postgresql"


def _retention_on() -> None:
    """Let this transaction delete checkpoints (the PostgreSQL trigger refuses otherwise)."""
    if _postgres():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL cairn.retention = 'on'")


def _lock_runs(run_ids: list[object], due: Q) -> list[Run]:
    """Those runs, locked, that are still deletable (``plan.deletable``), unheld and
    ``due``. A run another transaction holds is left out (we skip it rather than wait)."""
    runs = plan.deletable(Run.objects.filter(pk__in=run_ids)).filter(due)
    if _postgres():
        runs = runs.select_for_update(skip_locked=True, no_key=True, of=("self",))
    return list(runs.select_related("tenant").order_by("pk"))


def _count(name: str, labels: str, value: float) -> None:
    if value:
        MetricIncrement.objects.create(name=name, labels=labels, value=value)


def _ids(runs: QuerySet[Run], chunk: int = 500) -> Iterator[object]:
    """Run ids in primary-key order, re-querying per chunk so the list never goes stale."""
    last = None
    while True:
        page = runs.order_by("pk")
        if last is not None:
            page = page.filter(pk__gt=last)
        ids = list(page.values_list("pk", flat=True)[:chunk])
        yield from ids
        if len(ids) < chunk:
            return
        last = ids[-1]


def _checkpoint_rows(checkpoints: QuerySet[Checkpoint], limit: int) -> list[dict[str, Any]]:
    return list(
        checkpoints.order_by("run_id", "sequence")
        .annotate(size=Length("envelope_sealed"))
        .values(
            "id",
            "run_id",
            "sequence",
            "sha256",
            "parent_sha256",
            "state",
            "step",
            "created_at",
            "size",
        )[:limit]
    )


def _audit_event(run: Run, action: str, target: str, details: dict[str, Any]) -> AuditEvent:
    return AuditEvent(
        tenant_id=run.tenant_id,
        actor_label=ACTOR.name,
        action=action,
        run_id=run.id,
        target=target[:200],
        details=details,
    )


def _remove_checkpoints(
    *, runs: list[Run], rows: list[dict[str, Any]], policy: RetentionPolicy, reason: str
) -> int:
    """Record, then delete, these checkpoints of the locked ``runs`` (inside the caller's
    transaction): one CompactionRecord and one audit event per run. Returns the bytes."""
    by_run: dict[object, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_run[row["run_id"]].append(row)
    records, events = [], []
    action = (
        "retention.compacted" if reason == CompactionReason.INTERMEDIATE else "retention.expiring"
    )
    for run in runs:
        removed = by_run.get(run.pk)
        if not removed:
            continue
        span = f"checkpoints {removed[0]['sequence']}-{removed[-1]['sequence']}"
        records.append(
            CompactionRecord(
                tenant_id=run.tenant_id,
                run=run,
                policy_id=policy.pk,
                policy_label=policy.label,
                reason=reason,
                first_sequence=removed[0]["sequence"],
                last_sequence=removed[-1]["sequence"],
                removed=[
                    {
                        "sequence": row["sequence"],
                        "sha256": row["sha256"],
                        "parent_sha256": row["parent_sha256"],
                        "state": row["state"],
                        "step": row["step"],
                        "created_at": row["created_at"].isoformat(),
                    }
                    for row in removed
                ],
            )
        )
        events.append(
            _audit_event(
                run, action, span, {"policy": policy.label, "count": len(removed), "reason": reason}
            )
        )
    CompactionRecord.objects.bulk_create(records)
    AuditEvent.objects.bulk_create(events)
    ids = [row["id"] for row in rows]
    ArtifactReference.objects.filter(checkpoint_id__in=ids).delete()
    # only("pk"): the delete collects the rows first, and needs no envelope for that.
    deleted = Checkpoint.objects.filter(pk__in=ids, run__in=runs).only("pk").retention_delete()
    if deleted != len(ids):
        # Under the run locks nobody else deletes these rows; a mismatch means something is
        # wrong, so the whole batch (records included) rolls back.
        raise RuntimeError(f"retention expected to delete {len(ids)} checkpoints, not {deleted}")
    size = sum(row["size"] or 0 for row in rows)
    _count(DELETED, 'kind="checkpoint"', len(ids))
    _count(DELETED_BYTES, 'kind="checkpoint"', size)
    return size


def _chunks(ids: Iterator[object], size: int) -> Iterator[list[object]]:
    chunk: list[object] = []
    for run_id in ids:
        chunk.append(run_id)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _sweep(
    chunk: list[object],
    *,
    policy: RetentionPolicy,
    due: Q,
    candidates: QuerySet[Checkpoint],
    reason: str,
    ctx: _Context,
) -> set[object]:
    """Remove ``candidates`` of these runs, a batch per transaction, each batch under the
    locks of the runs it touches. Returns the runs it could lock and finished."""
    finished: set[object] = set()
    first = True
    while True:
        with transaction.atomic():
            _retention_on()
            runs = _lock_runs(chunk, due)
            if first:
                ctx.report.skipped += len(chunk) - len(runs)
                first = False
            if not runs:
                return finished
            rows = _checkpoint_rows(candidates.filter(run__in=runs), ctx.batch_size)
            if rows:
                size = _remove_checkpoints(runs=runs, rows=rows, policy=policy, reason=reason)
                ctx.on_batch()
        if rows:
            ctx.report.checkpoints += len(rows)
            ctx.report.bytes += size
            touched = {row["run_id"] for row in rows}
            if reason == CompactionReason.INTERMEDIATE:
                ctx.report.runs_compacted += len(touched - finished)
                finished |= touched
            ctx.progress(
                f"removed checkpoints of {len(touched)} run(s): {len(rows)} in this batch "
                f"({ctx.report.checkpoints} so far)"
            )
        if len(rows) < ctx.batch_size:
            return finished | {run.pk for run in runs}


def _compact(policy: RetentionPolicy, ctx: _Context) -> None:
    due = plan.compaction_due(policy, ctx.now)
    for chunk in _chunks(_ids(plan.compaction_runs(policy, ctx.now)), RUNS_PER_BATCH):
        _sweep(
            chunk,
            policy=policy,
            due=due,
            candidates=plan.compactable(),
            reason=CompactionReason.INTERMEDIATE,
            ctx=ctx,
        )


def _expire(policy: RetentionPolicy, ctx: _Context) -> None:
    due = plan.expiry_due(policy, ctx.now)
    for chunk in _chunks(_ids(plan.expiring_runs(policy, ctx.now)), RUNS_PER_BATCH):
        emptied = _sweep(
            chunk,
            policy=policy,
            due=due,
            candidates=plan.expirable(),
            reason=CompactionReason.EXPIRY,
            ctx=ctx,
        )
        for run_id in sorted(emptied, key=str):
            _expire_run(run_id, policy, due, ctx)


def _expire_run(run_id: object, policy: RetentionPolicy, due: Q, ctx: _Context) -> None:
    """Delete one emptied run row and what still belongs to it, in one transaction."""
    try:
        with transaction.atomic():
            _retention_on()
            runs = _lock_runs([run_id], due)
            if not runs:
                ctx.report.skipped += 1
                return
            size = _delete_run(runs[0], policy)
            ctx.on_batch()
    except (ProtectedError, RestrictedError) as exc:
        ctx.report.skipped += 1
        log.warning("run not expired: rows still refer to it", extra={"run": str(run_id)})
        ctx.progress(f"run {run_id}: not expired ({exc.args[0]})")
        return
    ctx.report.bytes += size
    ctx.report.runs_expired += 1
    ctx.progress(f"run {run_id}: expired and deleted")


def _delete_run(run: Run, policy: RetentionPolicy) -> int:
    """Delete the run row and what belongs to it (inside the caller's transaction)."""
    left = Checkpoint.objects.filter(run=run).aggregate(
        n=Count("pk"), size=Sum(Length("envelope_sealed"))
    )
    audit_record(
        tenant=run.tenant,
        actor=ACTOR,
        action="retention.run_expired",
        run_id=run.id,
        target=f"run {run.id}",
        details={
            "policy": policy.label,
            "workflow_type": run.workflow_type,
            "status": run.status,
            "checkpoints": run.checkpoint_sequence,
            "latest_sha256": run.latest_checkpoint_sha256,
        },
    )
    ArtifactReference.objects.filter(checkpoint__run=run).delete()
    Run.objects.filter(pk=run.pk).delete()
    _count(DELETED, 'kind="run"', 1)
    _count(DELETED, 'kind="checkpoint"', left["n"] or 0)
    _count(DELETED_BYTES, 'kind="checkpoint"', left["size"] or 0)
    return left["size"] or 0


def _remove_artifacts(policy: RetentionPolicy, ctx: _Context) -> None:
    while True:
        try:
            with transaction.atomic():
                candidates = plan.removable_artifacts(policy, ctx.now).order_by("created_at", "pk")
                if _postgres():
                    candidates = candidates.select_for_update(skip_locked=True, of=("self",))
                rows = list(
                    candidates.only("id", "tenant_id", "sha256", "size", "kind", "storage_name")[
                        : ctx.batch_size
                    ]
                )
                if not rows:
                    return
                PendingFileDeletion.objects.bulk_create(
                    [PendingFileDeletion(storage_name=row.storage_name) for row in rows]
                )
                Artifact.objects.filter(pk__in=[row.pk for row in rows]).delete()
                size = sum(row.size for row in rows)
                _count(DELETED, 'kind="artifact"', len(rows))
                _count(DELETED_BYTES, 'kind="artifact"', size)
                audit_record(
                    tenant=policy.tenant,
                    actor=ACTOR,
                    action="retention.artifacts_deleted",
                    target=f"{len(rows)} artifacts",
                    details={"policy": policy.label, "sha256": [row.sha256 for row in rows]},
                )
                ctx.on_batch()
        except (ProtectedError, RestrictedError):
            # A checkpoint referenced one of them a moment ago: leave it for the next run.
            ctx.report.skipped += 1
            return
        ctx.report.artifacts += len(rows)
        ctx.report.bytes += size
        ctx.progress(f"tenant {policy.tenant.slug}: removed {len(rows)} artifacts")
        _remove_pending_files(ctx)


def _remove_pending_files(ctx: _Context) -> None:
    while True:
        with transaction.atomic():
            pending = PendingFileDeletion.objects.order_by("id")
            if _postgres():
                pending = pending.select_for_update(skip_locked=True)
            rows = list(pending[: ctx.batch_size])
            if not rows:
                return
            names = [row.storage_name for row in rows]
            in_use = set(
                Artifact.objects.filter(storage_name__in=names).values_list(
                    "storage_name", flat=True
                )
            )
            for name in set(names) - in_use:
                # Deleting a file twice (a killed job's rerun) is harmless.
                default_storage.delete(name)
                ctx.report.files += 1
            PendingFileDeletion.objects.filter(pk__in=[row.pk for row in rows]).delete()


def _policies(tenant: Tenant | None) -> QuerySet[RetentionPolicy]:
    policies = RetentionPolicy.objects.select_related("tenant").order_by("tenant_id", "id")
    return policies.filter(tenant=tenant) if tenant is not None else policies


def retention_apply(
    *,
    dry_run: bool = False,
    tenant: Tenant | None = None,
    batch_size: int | None = None,
    now: datetime | None = None,
    progress: Callable[[str], None] | None = None,
    on_batch: Callable[[], None] | None = None,
) -> RetentionReport:
    """Enforce every retention policy (of one tenant, or all). See the module docstring
    for the guarantees. ``dry_run`` writes nothing and reports what would be removed.

    ``on_batch`` is called inside each batch's transaction just before it commits (tests
    use it to kill the job mid-batch). Never raises for a run it must skip.
    """
    now = now or timezone.now()
    if dry_run:
        report = RetentionReport(dry_run=True)
        for each in Tenant.objects.filter(pk__in=_policies(tenant).values("tenant_id")):
            estimate = _estimate(list(_policies(each)), plan.default_policy_of(each.pk), now)
            for key, value in estimate.items():
                setattr(report, key, getattr(report, key) + value)
        report.orphan_files = len(sweep_orphans(dry_run=True, now=now, tenant=tenant).files)
        return report
    ctx = _Context(
        now=now,
        batch_size=batch_size or settings.CAIRN_RETENTION_BATCH_SIZE,
        report=RetentionReport(),
        progress=progress or (lambda message: None),
        on_batch=on_batch or (lambda: None),
    )
    _remove_pending_files(ctx)  # what a killed run left behind
    for policy in _policies(tenant):
        _expire(policy, ctx)
        _compact(policy, ctx)
    for policy in _policies(tenant).filter(workflow_type=""):
        _remove_artifacts(policy, ctx)
    # Files a killed upload left without a row: whatever the policies, they are nobody's.
    ctx.report.orphan_files = len(sweep_orphans(now=now, tenant=tenant).files)
    log.info("retention applied", extra=ctx.report.as_dict())
    return ctx.report


@dataclass(frozen=True)
class RetentionPreview:
    checkpoints: int
    artifacts: int
    bytes: int
    runs_compacted: int
    runs_expired: int


def _estimate(
    policies: list[RetentionPolicy], artifact_policy: RetentionPolicy | None, now: datetime
) -> dict[str, int]:
    removed = Q(pk__in=[])
    compacted_runs = expired_runs = checkpoints = size = 0
    for policy in policies:
        expiring = plan.expiring_runs(policy, now)
        compacting = plan.compaction_runs(policy, now).exclude(pk__in=expiring.values("pk"))
        compactable = plan.compactable().filter(run__in=compacting.values("pk"))
        for rows in (compactable, Checkpoint.objects.filter(run__in=expiring.values("pk"))):
            totals = rows.aggregate(n=Count("pk"), size=Sum(Length("envelope_sealed")))
            checkpoints += totals["n"] or 0
            size += totals["size"] or 0
        compacted_runs += compacting.count()
        expired_runs += expiring.count()
        removed |= Q(pk__in=compactable.values("pk")) | Q(run__in=expiring.values("pk"))
    artifacts = 0
    if artifact_policy is not None:
        kept_refs = ArtifactReference.objects.filter(artifact=OuterRef("pk")).exclude(
            checkpoint__in=Checkpoint.objects.filter(removed).values("pk")
        )
        freed = (
            Artifact.objects.filter(tenant_id=artifact_policy.tenant_id, tenant__legal_hold=False)
            .filter(plan.artifact_due(artifact_policy, now))
            .exclude(plan.referenced_elsewhere(Artifact, ignore=(ArtifactReference,)))
            .exclude(Exists(kept_refs))
            .aggregate(n=Count("pk"), size=Sum("size"))
        )
        artifacts = freed["n"] or 0
        size += freed["size"] or 0
    return {
        "checkpoints": checkpoints,
        "artifacts": artifacts,
        "bytes": size,
        "runs_compacted": compacted_runs,
        "runs_expired": expired_runs,
    }


def retention_preview(policy: RetentionPolicy, *, now: datetime | None = None) -> RetentionPreview:
    """How many checkpoints, artifacts and bytes ``policy`` (saved or not) would remove now.

    Reads only. Counts the stored ciphertext of checkpoints and the plaintext size of
    artifacts. Artifacts follow the tenant's default policy: ``policy`` itself when it is the
    default, else the saved default.
    """
    now = now or timezone.now()
    artifact_policy = (
        policy if not policy.workflow_type else plan.default_policy_of(policy.tenant_id)
    )
    return RetentionPreview(**_estimate([policy], artifact_policy, now))
