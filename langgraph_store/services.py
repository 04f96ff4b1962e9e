"""Writing LangGraph threads into Cairn: puts and pending writes.

Every put is one transaction: the thread's row is locked, the channel values and the
LangGraph checkpoint are stored sealed, and the put is committed as the next Cairn
checkpoint of the run that records its branch (``checkpoint_commit``), so the console,
``verify``, retention and forks see LangGraph threads like any run.

Branching: LangGraph's checkpoints form a tree (``update_state`` or a replay from an older
checkpoint starts a new branch), while a Cairn run is a linear, hash-chained history. A put
whose parent is the latest root-namespace checkpoint of its run extends that run; a put
whose parent is an older one forks a new Cairn run from the Cairn checkpoint that recorded
the parent (``forked_from_run``/``forked_from_checkpoint``), and the branch continues there.
Subgraph namespaces follow the run of the root checkpoint they run under.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from cairn.errors import ConcurrentCheckpointWrite
from checkpoints.models import Run, RunStatus
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from langgraph_store import payloads
from langgraph_store.models import (
    ID_LENGTH,
    NS_LENGTH,
    LangGraphBlob,
    LangGraphCheckpoint,
    LangGraphThread,
    LangGraphWrite,
)
from langgraph_store.payloads import Payload
from langgraph_store.threads import (
    INTERRUPT_CHANNEL,
    INTERRUPTED,
    RUNNING,
    branch_fork,
    check_key,
    head_run_id,
    inputs_group,
    thread_open,
    thread_versions,
)
from tenants.models import Tenant
from tenants.services import Actor


@dataclass(frozen=True)
class MetadataIndex:
    """The metadata fields kept in plaintext columns for SQL narrowing."""

    source: str | None
    step: int | None
    run_id: str | None
    # The root-namespace checkpoint a subgraph checkpoint runs under (metadata["parents"][""]).
    root_checkpoint_id: str | None
    # Channels LangGraph rebuilds from ancestors' writes (DeltaChannel); pruning keeps those.
    delta_channels: tuple[str, ...] = ()

    @classmethod
    def of(cls, metadata: dict[str, Any]) -> MetadataIndex:
        source, step, run_id = (metadata.get(k) for k in ("source", "step", "run_id"))
        parents = metadata.get("parents")
        root = parents.get("") if isinstance(parents, dict) else None
        counters = metadata.get("counters_since_delta_snapshot")
        delta = tuple(sorted(str(c) for c in counters)) if isinstance(counters, dict) else ()
        return cls(
            source=source if isinstance(source, str) and len(source) <= 100 else None,
            step=step if type(step) is int and -(2**63) <= step < 2**63 else None,
            run_id=run_id if isinstance(run_id, str) and len(run_id) <= ID_LENGTH else None,
            root_checkpoint_id=root if isinstance(root, str) else None,
            delta_channels=delta,
        )


@dataclass(frozen=True)
class BlobIn:
    channel: str
    version: str
    payload: Payload | None  # None: LangGraph's "empty" (no value at this version)


@dataclass(frozen=True)
class WriteIn:
    idx: int
    channel: str
    payload: Payload


@dataclass(frozen=True)
class VersionChange:
    """Versions of the thread's runs ({run id: version}) before and after a write."""

    before: dict[str, int]
    after: dict[str, int]
    created: bool = False


@dataclass(frozen=True)
class PutResult:
    run_id: uuid.UUID
    cairn_checkpoint_id: uuid.UUID
    sequence: int
    branched: bool
    versions: VersionChange


def _target(
    thread: LangGraphThread,
    *,
    ns: str,
    again: LangGraphCheckpoint | None,
    parent_id: str,
    root_id: str | None,
) -> tuple[uuid.UUID, LangGraphCheckpoint | None]:
    """(run to commit to, parent to fork from or None) for a put; ``again`` is the row of
    the same checkpoint when LangGraph puts it a second time."""
    rows = LangGraphCheckpoint.objects.filter(thread=thread)
    if again is not None:
        return again.run_id, None
    if ns:
        anchor = None
        if root_id:
            anchor = (
                rows.filter(checkpoint_ns="", checkpoint_id=root_id).values_list("run_id").first()
            )
        return (anchor[0] if anchor else head_run_id(thread)), None
    parent = rows.filter(checkpoint_ns="", checkpoint_id=parent_id).first() if parent_id else None
    if parent is None:
        return head_run_id(thread), None
    latest = (
        rows.filter(checkpoint_ns="", run_id=parent.run_id)
        .order_by("-checkpoint_id")
        .values_list("checkpoint_id", flat=True)
        .first()
    )
    return parent.run_id, (None if latest == parent_id else parent)


def _groups(run: Run, thread: LangGraphThread, outputs: dict[str, Any], **control: Any) -> dict:
    return {
        "inputs": inputs_group(run, thread.thread_id),
        "evidence": {"artifacts": [], "validators": [], "outputs": {"langgraph": outputs}},
        "side_effects": [],
        "budgets": dict(run.budget_used),
        "control": control,
    }


def _waiting_reason(checkpoint_id: str) -> str:
    return f"Waiting for a person: LangGraph interrupt() at checkpoint {checkpoint_id}."


def _step_name(ns: str, text: str) -> str:
    return (f"{ns} · {text}" if ns else text)[:100]


def _check_fence(thread_id: str, expected: dict[str, int] | None, current: dict[str, int]) -> None:
    if expected is None:
        raise ConcurrentCheckpointWrite(
            f"Fencing is on and this saver has not read LangGraph thread {thread_id} yet; "
            "read it (get_tuple) before writing, so a concurrent writer can be detected."
        )
    if expected != current:
        moved = sorted(run for run in current if expected.get(run) != current[run])
        detail = (
            f"run {moved[0]} is at version {current[moved[0]]}, this saver last saw "
            f"{expected.get(moved[0], 'no such run')}"
            if moved
            else "one of its runs is gone"
        )
        raise ConcurrentCheckpointWrite(
            f"Another writer advanced LangGraph thread {thread_id} since this saver last read "
            f"it ({detail}). Nothing was written; reload the thread and decide again."
        )


def _store_blobs(thread: LangGraphThread, ns: str, blobs: Sequence[BlobIn]) -> None:
    """Insert the values of new channel versions; a version already stored is kept as is."""
    rows = []
    for blob in blobs:
        row_id = uuid.uuid4()
        sealed = ""
        if blob.payload is not None:
            sealed = payloads.payload_seal(
                blob.payload,
                tenant_id=thread.tenant_id,
                table=payloads.BLOBS,
                row_id=row_id,
                key=payloads.blob_key(thread.pk, ns, blob.channel, blob.version),
            )
        rows.append(
            LangGraphBlob(
                id=row_id,
                tenant_id=thread.tenant_id,
                thread=thread,
                checkpoint_ns=ns,
                channel=blob.channel,
                version=blob.version,
                empty=blob.payload is None,
                value_sealed=sealed,
            )
        )
    LangGraphBlob.objects.bulk_create(rows, ignore_conflicts=True)


def thread_checkpoint_put(
    *,
    tenant: Tenant,
    thread_id: str,
    checkpoint_ns: str,
    checkpoint_id: str,
    parent_checkpoint_id: str | None,
    checkpoint: Payload,
    metadata: Payload,
    index: MetadataIndex,
    blobs: Sequence[BlobIn],
    channel_refs: list[list[str]],
    actor: Actor,
    fencing: bool = False,
    expected_versions: dict[str, int] | None = None,
) -> PutResult:
    """Store one LangGraph checkpoint and commit it as the next Cairn checkpoint of its run.

    One transaction: blobs, the sealed checkpoint and metadata, and the Cairn commit (plus a
    forked run when the put branches) are written together or not at all. With ``fencing``,
    raises ConcurrentCheckpointWrite when the thread's runs are not at
    ``expected_versions`` (another writer advanced it since the caller's last read). Also
    raises InvalidRequest (a key too long, a refused serialization) and whatever
    ``checkpoint_commit`` raises (RunNotActive when an operator cancelled the run, ...).
    """
    check_key(checkpoint_id, "checkpoint_id")
    check_key(checkpoint_ns, "checkpoint_ns", NS_LENGTH)
    parent_id = parent_checkpoint_id or ""
    check_key(parent_id, "parent checkpoint_id")
    payloads.payload_check(checkpoint, "checkpoint")
    payloads.payload_check(metadata, "metadata")
    for blob in blobs:
        check_key(blob.channel, "channel")
        check_key(blob.version, "channel version")
        if blob.payload is not None:
            payloads.payload_check(blob.payload, f"value of channel {blob.channel}")
    ns = checkpoint_ns
    with transaction.atomic():
        thread, created = thread_open(tenant=tenant, thread_id=thread_id, actor=actor)
        before = thread_versions(thread) if fencing else {}
        if fencing and not created:
            _check_fence(thread_id, expected_versions, before)
        row = LangGraphCheckpoint.objects.filter(
            thread=thread, checkpoint_ns=ns, checkpoint_id=checkpoint_id
        ).first()
        run_id, fork_from = _target(
            thread, ns=ns, again=row, parent_id=parent_id, root_id=index.root_checkpoint_id
        )
        if fork_from is not None:
            run_id = branch_fork(thread=thread, parent=fork_from, actor=actor).pk
        run = Run.objects.select_for_update().get(pk=run_id)
        _store_blobs(thread, ns, blobs)
        outputs = {
            "op": "put",
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
            "parent_checkpoint_id": parent_id or None,
            "branch": fork_from is not None,
            "source": index.source,
            "step": index.step,
            "run_id": index.run_id,
            "checkpoint_sha256": checkpoint.sha256,
            "metadata_sha256": metadata.sha256,
            "channels": [
                {
                    "channel": b.channel,
                    "version": b.version,
                    "sha256": b.payload.sha256 if b.payload is not None else None,
                }
                for b in blobs
            ],
        }
        # LangGraph may store a checkpoint's interrupt before the checkpoint itself (its
        # writes and puts run concurrently): then this put is where the run starts waiting.
        waiting = LangGraphWrite.objects.filter(
            thread=thread, checkpoint_ns=ns, checkpoint_id=checkpoint_id, channel=INTERRUPT_CHANNEL
        ).exists()
        outputs["interrupted"] = waiting
        step = f"{index.source or 'put'} {index.step if index.step is not None else ''}".strip()
        commit = checkpoint_commit(
            tenant=tenant,
            run_id=run.pk,
            request=CommitRequest(
                expected_version=run.version,
                state=INTERRUPTED if waiting else RUNNING,
                step=_step_name(ns, step),
                envelope=_groups(run, thread, outputs),
                actor=actor,
                status=RunStatus.WAITING_APPROVAL if waiting else None,
                status_reason=_waiting_reason(checkpoint_id) if waiting else "",
                is_evidence=waiting,
            ),
        )
        row = row or LangGraphCheckpoint(
            tenant_id=tenant.pk, thread=thread, checkpoint_ns=ns, checkpoint_id=checkpoint_id
        )
        row.run_id = run.pk
        row.cairn_checkpoint_id = commit.checkpoint_id
        row.parent_checkpoint_id = parent_id
        row.source, row.step, row.lg_run_id = index.source, index.step, index.run_id
        row.channel_refs = channel_refs
        row.delta_channels = list(index.delta_channels)
        for part, payload in (("checkpoint", checkpoint), ("metadata", metadata)):
            sealed = payloads.payload_seal(
                payload,
                tenant_id=tenant.pk,
                table=payloads.CHECKPOINTS,
                row_id=row.pk,
                key=payloads.checkpoint_key(thread.pk, ns, checkpoint_id, part),
            )
            setattr(row, f"{part}_sealed", sealed)
        row.save()
        # Writes may have been stored before their checkpoint: attach them now.
        LangGraphWrite.objects.filter(
            thread=thread,
            checkpoint_ns=ns,
            checkpoint_id=checkpoint_id,
            checkpoint_row__isnull=True,
        ).update(checkpoint_row=row)
        after = thread_versions(thread) if fencing else {}
    return PutResult(
        run_id=run.pk,
        cairn_checkpoint_id=commit.checkpoint_id,
        sequence=commit.sequence,
        branched=fork_from is not None,
        versions=VersionChange(before=before, after=after, created=created),
    )


def thread_writes_put(
    *,
    tenant: Tenant,
    thread_id: str,
    checkpoint_ns: str,
    checkpoint_id: str,
    task_id: str,
    task_path: str,
    writes: Sequence[WriteIn],
    replace: bool,
    actor: Actor,
    track_versions: bool = False,
) -> VersionChange:
    """Store a task's pending writes against a checkpoint. Atomic.

    A write already stored under the same (task, idx) is kept, unless ``replace`` (LangGraph's
    special channels: errors, interrupts, resumes), which overwrites it. A new interrupt on
    its run's latest checkpoint is also committed as a Cairn checkpoint in state
    ``interrupted``, so the run shows as waiting for a person until the next put (an
    interrupt stored before its checkpoint is recorded by that checkpoint's put). Raises
    InvalidRequest, or what ``checkpoint_commit`` raises. With ``track_versions`` the
    result carries the thread's run versions before and after (for a fencing saver).
    """
    check_key(checkpoint_id, "checkpoint_id")
    check_key(checkpoint_ns, "checkpoint_ns", NS_LENGTH)
    check_key(task_id, "task_id")
    for write in writes:
        check_key(write.channel, "channel")
        payloads.payload_check(write.payload, f"write to channel {write.channel}")
    ns = checkpoint_ns
    with transaction.atomic():
        thread, created = thread_open(tenant=tenant, thread_id=thread_id, actor=actor)
        before = thread_versions(thread) if track_versions else {}
        anchor = (
            LangGraphCheckpoint.objects.filter(
                thread=thread, checkpoint_ns=ns, checkpoint_id=checkpoint_id
            )
            .only("pk", "run_id", "cairn_checkpoint_id")
            .first()
        )
        existing = {
            row.idx: row
            for row in LangGraphWrite.objects.filter(
                thread=thread,
                checkpoint_ns=ns,
                checkpoint_id=checkpoint_id,
                task_id=task_id,
                idx__in=[w.idx for w in writes],
            )
        }
        new_interrupts = []
        for write in writes:
            row = existing.get(write.idx)
            if row is not None and not replace:
                continue
            if row is None:
                row = LangGraphWrite(
                    tenant_id=tenant.pk,
                    thread=thread,
                    checkpoint_row=anchor,
                    checkpoint_ns=ns,
                    checkpoint_id=checkpoint_id,
                    task_id=task_id,
                    idx=write.idx,
                )
                existing[write.idx] = row
            row.channel, row.task_path = write.channel, task_path
            row.value_sealed = payloads.payload_seal(
                write.payload,
                tenant_id=tenant.pk,
                table=payloads.WRITES,
                row_id=row.pk,
                key=payloads.write_key(
                    thread.pk, ns, checkpoint_id, task_id, write.idx, write.channel
                ),
            )
            row.save()
            if write.channel == INTERRUPT_CHANNEL:
                new_interrupts.append(write)
        # Before its checkpoint is stored, the put records the wait instead; on a checkpoint
        # that is no longer its run's latest, the run already moved on or already waits.
        run = None
        if new_interrupts and anchor is not None:
            run = Run.objects.select_for_update().get(pk=anchor.run_id)
            if run.latest_checkpoint_id != anchor.cairn_checkpoint_id:
                run = None
        if run is not None:
            outputs = {
                "op": "interrupt",
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint_id,
                "task_id": task_id,
                "writes": [
                    {"channel": w.channel, "idx": w.idx, "sha256": w.payload.sha256}
                    for w in new_interrupts
                ],
            }
            checkpoint_commit(
                tenant=tenant,
                run_id=run.pk,
                request=CommitRequest(
                    expected_version=run.version,
                    state=INTERRUPTED,
                    step=_step_name(ns, "interrupt"),
                    envelope=_groups(run, thread, outputs),
                    actor=actor,
                    status=RunStatus.WAITING_APPROVAL,
                    status_reason=_waiting_reason(checkpoint_id),
                    is_evidence=True,
                ),
            )
        after = thread_versions(thread) if track_versions else {}
    return VersionChange(before=before, after=after, created=created)
