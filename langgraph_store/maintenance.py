"""Deleting, pruning and copying LangGraph threads.

``thread_delete`` erases a thread: its Cairn runs and their checkpoints go with it (the
one deletion besides retention, refused under a legal hold). ``threads_prune`` and
``checkpoints_delete_for_runs`` remove LangGraph content only: the Cairn runs keep their
envelopes (ids and sha256 digests, no values), so their hash chains still verify.
``thread_copy`` starts a new thread as a Cairn fork of the source thread's head.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence

from django.db import connection, transaction
from django.db.models import Q

from cairn.errors import InvalidRequest, LegalHoldActive
from checkpoints.models import Run
from langgraph_store import payloads
from langgraph_store.models import (
    LangGraphBlob,
    LangGraphBranch,
    LangGraphCheckpoint,
    LangGraphThread,
    LangGraphWrite,
)
from langgraph_store.threads import head_run_id, thread_lock
from runtime.services.forks import run_fork
from tenants.models import Tenant
from tenants.services import Actor, audit_record

PRUNE_STRATEGIES = ("keep_latest", "delete")


def _checkpoint_deletion(allowed: bool) -> None:
    """Switch the PostgreSQL trigger that refuses checkpoint deletes for this transaction."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL cairn.retention = '{'on' if allowed else 'off'}'")


def thread_delete(*, tenant: Tenant, thread_id: str, actor: Actor) -> int:
    """Erase a thread: every LangGraph row and the Cairn runs that recorded it, with their
    checkpoints. Returns how many runs were deleted (0 for an unknown thread).

    Atomic. Raises LegalHoldActive, deleting nothing, when the tenant or one of the runs is
    on legal hold. Each deleted run leaves an audit event.
    """
    with transaction.atomic():
        thread = thread_lock(tenant, thread_id)
        if thread is None:
            return 0
        runs = list(
            Run.objects.filter(langgraph_branch__thread=thread).values_list("pk", "legal_hold")
        )
        held = [str(pk) for pk, hold in runs if hold]
        if held or Tenant.objects.filter(pk=tenant.pk, legal_hold=True).exists():
            raise LegalHoldActive(
                f"LangGraph thread {thread_id} is under legal hold "
                f"({'run ' + held[0] if held else 'the whole tenant'}); nothing was deleted."
            )
        for pk, _ in runs:
            audit_record(
                tenant=tenant,
                actor=actor,
                action="langgraph.thread_deleted",
                run_id=pk,
                target=f"thread {thread_id}",
            )
        LangGraphThread.objects.filter(pk=thread.pk).delete()
        _checkpoint_deletion(True)
        Run.objects.filter(pk__in=[pk for pk, _ in runs]).delete()
        _checkpoint_deletion(False)
    return len(runs)


def _refs(row: LangGraphCheckpoint) -> dict[str, str]:
    return {channel: version for channel, version in row.channel_refs}


def _delta_ancestors(thread: LangGraphThread, kept: LangGraphCheckpoint) -> set[str]:
    """Ancestors of ``kept`` that LangGraph needs to rebuild its DeltaChannels: up to, for
    every such channel, the nearest checkpoint that stores a value for it."""
    remaining = set(kept.delta_channels)
    if not remaining:
        return set()
    rows = {
        row.checkpoint_id: row
        for row in LangGraphCheckpoint.objects.filter(
            thread=thread, checkpoint_ns=kept.checkpoint_ns
        ).only("checkpoint_id", "parent_checkpoint_id", "channel_refs")
    }
    stored = {
        (channel, version)
        for channel, version in LangGraphBlob.objects.filter(
            thread=thread, checkpoint_ns=kept.checkpoint_ns, empty=False
        ).values_list("channel", "version")
    }

    def seeds(row: LangGraphCheckpoint) -> set[str]:
        refs = _refs(row)
        return {ch for ch in remaining if (ch, refs.get(ch)) in stored}

    remaining -= seeds(kept)
    needed: set[str] = set()
    current = rows.get(kept.parent_checkpoint_id)
    while current is not None and remaining and current.checkpoint_id not in needed:
        needed.add(current.checkpoint_id)
        remaining -= seeds(current)
        current = rows.get(current.parent_checkpoint_id)
    return needed


def _collect_blobs(thread: LangGraphThread, namespaces: Iterable[str]) -> None:
    """Delete channel values no remaining checkpoint of the namespace refers to."""
    for ns in set(namespaces):
        referenced = {
            (channel, version)
            for refs in LangGraphCheckpoint.objects.filter(
                thread=thread, checkpoint_ns=ns
            ).values_list("channel_refs", flat=True)
            for channel, version in refs
        }
        orphans = [
            pk
            for pk, channel, version in LangGraphBlob.objects.filter(
                thread=thread, checkpoint_ns=ns
            ).values_list("pk", "channel", "version")
            if (channel, version) not in referenced
        ]
        LangGraphBlob.objects.filter(pk__in=orphans).delete()


def _delete_checkpoints(thread: LangGraphThread, rows: Sequence[LangGraphCheckpoint]) -> None:
    """Delete the rows, their pending writes and the values nothing else refers to."""
    if not rows:
        return
    keys = Q()
    for row in rows:
        keys |= Q(checkpoint_ns=row.checkpoint_ns, checkpoint_id=row.checkpoint_id)
    LangGraphWrite.objects.filter(keys, thread=thread).delete()
    LangGraphCheckpoint.objects.filter(pk__in=[row.pk for row in rows]).delete()
    _collect_blobs(thread, (row.checkpoint_ns for row in rows))


def threads_prune(*, tenant: Tenant, thread_ids: Sequence[str], strategy: str, actor: Actor) -> int:
    """Prune LangGraph content of the threads; returns how many checkpoints were removed.

    ``keep_latest`` keeps each namespace's latest checkpoint, its writes, and the ancestors
    its DeltaChannels are rebuilt from; ``delete`` removes every checkpoint, write and
    value. The Cairn runs and their history stay. Atomic per call; raises InvalidRequest
    for an unknown strategy.
    """
    if strategy not in PRUNE_STRATEGIES:
        raise InvalidRequest(
            f"Unknown prune strategy '{strategy}'; use one of {', '.join(PRUNE_STRATEGIES)}.",
            fields={"strategy": strategy},
        )
    removed = 0
    with transaction.atomic():
        for thread_id in dict.fromkeys(str(t) for t in thread_ids):
            thread = thread_lock(tenant, thread_id)
            if thread is None:
                continue
            rows = list(
                LangGraphCheckpoint.objects.filter(thread=thread)
                .order_by("checkpoint_ns", "-checkpoint_id")
                .only(
                    "checkpoint_ns",
                    "checkpoint_id",
                    "parent_checkpoint_id",
                    "channel_refs",
                    "delta_channels",
                )
            )
            if strategy == "delete":
                doomed = rows
                LangGraphWrite.objects.filter(thread=thread).delete()
            else:
                keep: set[tuple[str, str]] = set()
                seen_ns: set[str] = set()
                for row in rows:  # newest first within each namespace
                    if row.checkpoint_ns in seen_ns:
                        continue
                    seen_ns.add(row.checkpoint_ns)
                    keep.add((row.checkpoint_ns, row.checkpoint_id))
                    for ancestor in _delta_ancestors(thread, row):
                        keep.add((row.checkpoint_ns, ancestor))
                doomed = [r for r in rows if (r.checkpoint_ns, r.checkpoint_id) not in keep]
            _delete_checkpoints(thread, doomed)
            if strategy == "delete":
                LangGraphBlob.objects.filter(thread=thread).delete()
            removed += len(doomed)
            audit_record(
                tenant=tenant,
                actor=actor,
                action="langgraph.thread_pruned",
                run_id=thread.run_id,
                target=f"thread {thread_id}",
                details={"strategy": strategy, "checkpoints_removed": len(doomed)},
            )
    return removed


def checkpoints_delete_for_runs(*, tenant: Tenant, run_ids: Sequence[str], actor: Actor) -> int:
    """Remove the LangGraph checkpoints (and their writes) that LangGraph runs ``run_ids``
    created (metadata ``run_id``), in every thread of the tenant. Returns how many. Atomic;
    the Cairn runs and their history stay."""
    ids = sorted({str(r) for r in run_ids})
    if not ids:
        return 0
    removed = 0
    with transaction.atomic():
        threads = (
            LangGraphCheckpoint.objects.filter(tenant=tenant, lg_run_id__in=ids)
            .values_list("thread_id", flat=True)
            .distinct()
        )
        for thread in LangGraphThread.objects.select_for_update().filter(pk__in=list(threads)):
            rows = list(
                LangGraphCheckpoint.objects.filter(thread=thread, lg_run_id__in=ids).only(
                    "checkpoint_ns", "checkpoint_id"
                )
            )
            _delete_checkpoints(thread, rows)
            removed += len(rows)
            audit_record(
                tenant=tenant,
                actor=actor,
                action="langgraph.runs_deleted",
                run_id=thread.run_id,
                target=f"thread {thread.thread_id}",
                details={"langgraph_run_ids": ids[:50], "checkpoints_removed": len(rows)},
            )
    return removed


def _reseal(
    sealed: str, *, tenant_id: object, table: str, old: tuple[object, str], new: tuple[object, str]
) -> str:
    payload = payloads.payload_unseal(
        sealed, tenant_id=tenant_id, table=table, row_id=old[0], key=old[1]
    )
    return payloads.payload_seal(
        payload, tenant_id=tenant_id, table=table, row_id=new[0], key=new[1]
    )


def thread_copy(
    *, tenant: Tenant, source_thread_id: str, target_thread_id: str, actor: Actor
) -> LangGraphThread | None:
    """Copy every checkpoint, value and write of a thread into a new thread.

    The new thread's run is a Cairn fork (``run_fork``, audited on both runs) of the source
    thread's head run at its latest checkpoint; the fork's genesis records the copies. Returns None
    (and creates nothing) when the source has no checkpoints. Atomic. Raises InvalidRequest
    when the target thread already exists.
    """
    with transaction.atomic():
        source = thread_lock(tenant, source_thread_id)
        if source is None or not LangGraphCheckpoint.objects.filter(thread=source).exists():
            return None
        if LangGraphThread.objects.filter(tenant=tenant, thread_id=target_thread_id).exists():
            raise InvalidRequest(
                f"LangGraph thread {target_thread_id} already exists; copy into a new thread id.",
                fields={"target_thread_id": "exists"},
            )
        head = Run.objects.get(pk=head_run_id(source))
        reason = f"LangGraph copy of thread {source_thread_id} into {target_thread_id}"
        run = run_fork(
            tenant=tenant,
            run_id=head.pk,
            from_sequence=head.checkpoint_sequence,
            reason=reason,
            inputs_patch={"langgraph_thread_id": target_thread_id},
            actor=actor,
        ).run
        run.refresh_from_db()
        target = LangGraphThread.objects.create(tenant=tenant, thread_id=target_thread_id, run=run)
        LangGraphBranch.objects.create(run=run, tenant=tenant, thread=target)
        _copy_rows(source, target, run, run.latest_checkpoint_id)
    return target


def _copy_rows(
    source: LangGraphThread, target: LangGraphThread, run: Run, anchor: uuid.UUID
) -> None:
    tenant_id = source.tenant_id
    copies: dict[uuid.UUID, LangGraphCheckpoint] = {}
    for row in LangGraphCheckpoint.objects.filter(thread=source):
        new = LangGraphCheckpoint(
            tenant_id=tenant_id,
            thread=target,
            run=run,
            cairn_checkpoint_id=anchor,
            checkpoint_ns=row.checkpoint_ns,
            checkpoint_id=row.checkpoint_id,
            parent_checkpoint_id=row.parent_checkpoint_id,
            source=row.source,
            step=row.step,
            lg_run_id=row.lg_run_id,
            channel_refs=row.channel_refs,
            delta_channels=row.delta_channels,
        )
        for part in ("checkpoint", "metadata"):
            setattr(
                new,
                f"{part}_sealed",
                _reseal(
                    getattr(row, f"{part}_sealed"),
                    tenant_id=tenant_id,
                    table=payloads.CHECKPOINTS,
                    old=(
                        row.pk,
                        payloads.checkpoint_key(
                            source.pk, row.checkpoint_ns, row.checkpoint_id, part
                        ),
                    ),
                    new=(
                        new.pk,
                        payloads.checkpoint_key(
                            target.pk, row.checkpoint_ns, row.checkpoint_id, part
                        ),
                    ),
                ),
            )
        copies[row.pk] = new
    LangGraphCheckpoint.objects.bulk_create(copies.values())
    blobs = []
    for blob in LangGraphBlob.objects.filter(thread=source):
        new = LangGraphBlob(
            tenant_id=tenant_id,
            thread=target,
            checkpoint_ns=blob.checkpoint_ns,
            channel=blob.channel,
            version=blob.version,
            empty=blob.empty,
        )
        if not blob.empty:
            new.value_sealed = _reseal(
                blob.value_sealed,
                tenant_id=tenant_id,
                table=payloads.BLOBS,
                old=(
                    blob.pk,
                    payloads.blob_key(source.pk, blob.checkpoint_ns, blob.channel, blob.version),
                ),
                new=(
                    new.pk,
                    payloads.blob_key(target.pk, blob.checkpoint_ns, blob.channel, blob.version),
                ),
            )
        blobs.append(new)
    LangGraphBlob.objects.bulk_create(blobs)
    writes = []
    for write in LangGraphWrite.objects.filter(thread=source):
        new = LangGraphWrite(
            tenant_id=tenant_id,
            thread=target,
            checkpoint_row=copies.get(write.checkpoint_row_id),
            checkpoint_ns=write.checkpoint_ns,
            checkpoint_id=write.checkpoint_id,
            task_id=write.task_id,
            task_path=write.task_path,
            idx=write.idx,
            channel=write.channel,
        )
        key = (write.checkpoint_ns, write.checkpoint_id, write.task_id, write.idx, write.channel)
        new.value_sealed = _reseal(
            write.value_sealed,
            tenant_id=tenant_id,
            table=payloads.WRITES,
            old=(write.pk, payloads.write_key(source.pk, *key)),
            new=(new.pk, payloads.write_key(target.pk, *key)),
        )
        writes.append(new)
    LangGraphWrite.objects.bulk_create(writes)
