"""Reading LangGraph threads back: checkpoint rows, their channel values and pending writes.

Every read is scoped by tenant. Values come back as decrypted ``Payload`` pairs; the saver
turns them into Python objects with LangGraph's serializer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import Q, QuerySet

from checkpoints.models import Run
from langgraph_store import payloads
from langgraph_store.models import (
    LangGraphBlob,
    LangGraphCheckpoint,
    LangGraphThread,
    LangGraphWrite,
)
from langgraph_store.payloads import Payload
from langgraph_store.services import MetadataIndex
from langgraph_store.threads import head_run_id, thread_versions
from tenants.models import Tenant

CHUNK = 500


@dataclass(frozen=True)
class StoredWrite:
    task_id: str
    channel: str
    payload: Payload
    task_path: str
    idx: int

    @property
    def sort_key(self) -> tuple[str, str, int]:
        # LangGraph's writes_sort_key: (task_path, task_id, idx), compared in Python so the
        # database's collation cannot reorder them.
        return (self.task_path, self.task_id, self.idx)


def versions_of(*, tenant: Tenant, thread_id: str) -> dict[str, int]:
    """{run id: version} of the thread's runs; {} for a thread that does not exist."""
    thread = LangGraphThread.objects.filter(tenant=tenant, thread_id=thread_id).first()
    return thread_versions(thread) if thread is not None else {}


def checkpoint_rows(
    *,
    tenant: Tenant,
    thread_id: str | None = None,
    checkpoint_ns: str | None = None,
    checkpoint_id: str | None = None,
    before: str | None = None,
    metadata_filter: dict[str, Any] | None = None,
) -> QuerySet[LangGraphCheckpoint]:
    """Rows newest first (by checkpoint id). The metadata filter only narrows here: rows
    whose indexed copy is null still come back, the caller checks the decrypted metadata."""
    rows = LangGraphCheckpoint.objects.filter(tenant=tenant).select_related("thread")
    if thread_id is not None:
        rows = rows.filter(thread__thread_id=thread_id)
    if checkpoint_ns is not None:
        rows = rows.filter(checkpoint_ns=checkpoint_ns)
    if checkpoint_id is not None:
        rows = rows.filter(checkpoint_id=checkpoint_id)
    if before is not None:
        rows = rows.filter(checkpoint_id__lt=before)
    wanted = MetadataIndex.of(metadata_filter or {})
    for key, column, value in (
        ("source", "source", wanted.source),
        ("step", "step", wanted.step),
        ("run_id", "lg_run_id", wanted.run_id),
    ):
        if metadata_filter and key in metadata_filter and value is not None:
            rows = rows.filter(Q(**{column: value}) | Q(**{f"{column}__isnull": True}))
    return rows.order_by("-checkpoint_id", "thread_id", "checkpoint_ns")


def row_payload(row: LangGraphCheckpoint, part: str) -> Payload:
    return payloads.payload_unseal(
        getattr(row, f"{part}_sealed"),
        tenant_id=row.tenant_id,
        table=payloads.CHECKPOINTS,
        row_id=row.pk,
        key=payloads.checkpoint_key(row.thread_id, row.checkpoint_ns, row.checkpoint_id, part),
    )


def _chunks(items: Sequence, size: int = CHUNK) -> Iterable[Sequence]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def blobs_for(
    wanted: Iterable[tuple[int, str, str, str]],
) -> dict[tuple[int, str, str, str], Payload | None]:
    """Values for (thread pk, ns, channel, version) keys; None marks LangGraph's "empty".
    Keys with no stored value are absent."""
    by_scope: dict[tuple[int, str], set[str]] = defaultdict(set)
    keys = set(wanted)
    for thread_pk, ns, _channel, version in keys:
        by_scope[(thread_pk, ns)].add(version)
    found: dict[tuple[int, str, str, str], Payload | None] = {}
    for (thread_pk, ns), versions in by_scope.items():
        for chunk in _chunks(sorted(versions)):
            for blob in LangGraphBlob.objects.filter(
                thread_id=thread_pk, checkpoint_ns=ns, version__in=chunk
            ):
                key = (thread_pk, ns, blob.channel, blob.version)
                if key not in keys:
                    continue
                found[key] = (
                    None
                    if blob.empty
                    else payloads.payload_unseal(
                        blob.value_sealed,
                        tenant_id=blob.tenant_id,
                        table=payloads.BLOBS,
                        row_id=blob.pk,
                        key=payloads.blob_key(thread_pk, ns, blob.channel, blob.version),
                    )
                )
    return found


def writes_for(
    rows: Iterable[LangGraphCheckpoint],
) -> dict[tuple[int, str, str], list[StoredWrite]]:
    """Pending writes per (thread pk, ns, checkpoint id), in LangGraph's write order."""
    by_scope: dict[tuple[int, str], list[str]] = defaultdict(list)
    for row in rows:
        by_scope[(row.thread_id, row.checkpoint_ns)].append(row.checkpoint_id)
    found: dict[tuple[int, str, str], list[StoredWrite]] = defaultdict(list)
    for (thread_pk, ns), ids in by_scope.items():
        for chunk in _chunks(ids):
            for write in LangGraphWrite.objects.filter(
                thread_id=thread_pk, checkpoint_ns=ns, checkpoint_id__in=chunk
            ):
                payload = payloads.payload_unseal(
                    write.value_sealed,
                    tenant_id=write.tenant_id,
                    table=payloads.WRITES,
                    row_id=write.pk,
                    key=payloads.write_key(
                        thread_pk, ns, write.checkpoint_id, write.task_id, write.idx, write.channel
                    ),
                )
                found[(thread_pk, ns, write.checkpoint_id)].append(
                    StoredWrite(write.task_id, write.channel, payload, write.task_path, write.idx)
                )
    for writes in found.values():
        writes.sort(key=lambda w: w.sort_key)
    return found


def thread_runs(*, tenant: Tenant, thread_id: str) -> list[Run]:
    """The Cairn runs that record a thread, oldest first: its first run, then its forks."""
    return list(
        Run.objects.filter(tenant=tenant, langgraph_branch__thread__thread_id=thread_id).order_by(
            "created_at", "id"
        )
    )


def thread_head_run(*, tenant: Tenant, thread_id: str) -> Run | None:
    """The run holding the thread's latest root checkpoint (where the thread continues)."""
    thread = LangGraphThread.objects.filter(tenant=tenant, thread_id=thread_id).first()
    if thread is None:
        return None
    return Run.objects.get(pk=head_run_id(thread))
