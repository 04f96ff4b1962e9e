"""LangGraph checkpoint savers backed by Cairn.

    from langgraph_store.saver import AsyncCairnSaver
    graph = builder.compile(checkpointer=AsyncCairnSaver(tenant="acme"))

A LangGraph thread is recorded by Cairn runs of the tenant (workflow type ``langgraph``):
every ``put`` is a Cairn checkpoint of the thread's run, ``interrupt()`` shows the run as
waiting, and a put that branches (``update_state`` on an older checkpoint) is a Cairn fork.
Values are serialized with LangGraph's ``JsonPlusSerializer`` (msgpack; pickle refused)
and stored sealed with Cairn's encryption, bound to tenant, row and LangGraph key.

Fencing (``fencing=True``): a put is refused with ConcurrentCheckpointWrite when another
writer advanced the thread (any of its Cairn runs' versions) since this saver last read it.

Build the saver once Django is set up. Django's ORM is synchronous: the async methods run
the sync ones in asgiref's thread-sensitive executor, and the sync methods must not be
called from a running event loop (Django refuses that).
"""

from __future__ import annotations

import random
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from langgraph_store.support import (
    db_call,
    off_loop,
    release_connection,
    serializer_checked,
    tuples_build,
    version_key,
)

if TYPE_CHECKING:
    from langgraph_store.payloads import Payload
    from langgraph_store.services import VersionChange
    from tenants.models import Tenant
    from tenants.services import Actor

__all__ = ["AsyncCairnSaver", "CairnSaver"]

BATCH = 100


class CairnSaver(BaseCheckpointSaver[str]):
    """LangGraph's checkpoint saver protocol, stored in Cairn for one tenant."""

    def __init__(
        self,
        *,
        tenant: str | Tenant,
        fencing: bool = False,
        actor: Actor | None = None,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serializer_checked(serde))
        self.fencing = fencing
        self._tenant_ref = tenant
        self._actor = actor
        # Thread id -> {run id: version} as this saver last read or wrote them (fencing).
        self._seen: dict[str, dict[str, int]] = {}
        self._seen_lock = threading.Lock()
        self._thread_locks: dict[str, threading.Lock] = {}

    # --- Django side (imported lazily, so the module imports before Django is set up) ------
    @property
    def tenant(self) -> Tenant:
        from cairn.errors import NotFound
        from tenants.models import Tenant

        if not isinstance(self._tenant_ref, Tenant):
            try:
                self._tenant_ref = Tenant.objects.get(slug=self._tenant_ref)
            except Tenant.DoesNotExist:
                raise NotFound(
                    f"No tenant '{self._tenant_ref}' exists; create it first "
                    "(manage.py create_tenant)."
                )
        return self._tenant_ref

    @property
    def actor(self) -> Actor:
        from tenants.services import Actor

        if self._actor is None:
            self._actor = Actor.system("langgraph")
        return self._actor

    # --- serialization -----------------------------------------------------------------------
    def _dump(self, value: Any) -> Payload:
        from langgraph_store.payloads import Payload

        type_, data = self.serde.dumps_typed(value)
        return Payload(type=type_, data=data)

    def _load(self, payload: Payload) -> Any:
        return self.serde.loads_typed((payload.type, payload.data))

    # --- fencing bookkeeping -------------------------------------------------------------------
    @contextmanager
    def _writing(self, thread_id: str) -> Iterator[dict[str, int] | None]:
        """Serialize this saver's own writes to one thread, so they never fence each other.
        Yields the versions this saver last saw (fencing only; the database orders writers
        of a thread anyway)."""
        if not self.fencing:
            yield None
            return
        with self._seen_lock:
            lock = self._thread_locks.setdefault(thread_id, threading.Lock())
        with lock:
            with self._seen_lock:
                seen = self._seen.get(thread_id)
            yield None if seen is None else dict(seen)

    def _remember(self, thread_id: str, versions: dict[str, int]) -> None:
        with self._seen_lock:
            self._seen[thread_id] = dict(versions)

    def _advanced(self, thread_id: str, change: VersionChange) -> None:
        """Record our own write, unless another writer moved the thread before it: then the
        saver keeps its older view and its next fenced put is refused."""
        if not self.fencing:
            return
        with self._seen_lock:
            if change.created or self._seen.get(thread_id) == change.before:
                self._seen[thread_id] = dict(change.after)

    def _read_versions(self, thread_id: str) -> None:
        # Read before the checkpoint itself: a write landing in between leaves this saver
        # with the older versions, so its next fenced put is refused rather than let through.
        if self.fencing:
            from langgraph_store.selectors import versions_of

            self._remember(thread_id, versions_of(tenant=self.tenant, thread_id=thread_id))

    # --- reading -------------------------------------------------------------------------------
    @db_call
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        from langgraph_store import selectors

        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        self._read_versions(thread_id)
        row = selectors.checkpoint_rows(
            tenant=self.tenant,
            thread_id=thread_id,
            checkpoint_ns=configurable.get("checkpoint_ns") or "",
            checkpoint_id=get_checkpoint_id(config),
        ).first()
        if row is None:
            return None
        metadata = {row.pk: self._load(selectors.row_payload(row, "metadata"))}
        return tuples_build(self._load, [row], metadata)[0]

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        try:
            yield from self._pages(self._list_pks(config, filter, before, limit), filter, limit)
        finally:
            release_connection()

    def _list_pks(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> list[Any]:
        from langgraph_store import selectors

        configurable = (config or {}).get("configurable", {})
        thread_id = configurable.get("thread_id")
        thread_id = str(thread_id) if thread_id is not None else None
        if thread_id is not None:
            self._read_versions(thread_id)
        rows = selectors.checkpoint_rows(
            tenant=self.tenant,
            thread_id=thread_id,
            checkpoint_ns=configurable.get("checkpoint_ns"),
            checkpoint_id=get_checkpoint_id(config) if config else None,
            before=get_checkpoint_id(before) if before else None,
            metadata_filter=filter,
        )
        pks = rows.values_list("pk", flat=True)
        if limit is not None and not filter:
            pks = pks[: max(limit, 0)]
        return [*pks]

    def _pages(
        self, pks: Sequence[Any], filter: dict[str, Any] | None, limit: int | None
    ) -> Iterator[CheckpointTuple]:
        from langgraph_store import selectors

        remaining = limit
        for start in range(0, len(pks), BATCH):
            if remaining is not None and remaining <= 0:
                return
            by_pk = selectors.checkpoint_rows(tenant=self.tenant).in_bulk(
                pks[start : start + BATCH]
            )
            batch, metadata = [], {}
            for pk in pks[start : start + BATCH]:
                row = by_pk[pk]
                md = self._load(selectors.row_payload(row, "metadata"))
                if filter and not all(md.get(k) == v for k, v in filter.items()):
                    continue
                if remaining is not None:
                    if remaining <= 0:
                        break
                    remaining -= 1
                batch.append(row)
                metadata[row.pk] = md
            yield from tuples_build(self._load, batch, metadata)

    # --- writing -------------------------------------------------------------------------------
    @db_call
    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        from langgraph_store import services

        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        ns = configurable.get("checkpoint_ns") or ""
        core = dict(checkpoint)
        values = core.pop("channel_values")
        stored_metadata = get_serializable_checkpoint_metadata(config, metadata)
        blobs = [
            services.BlobIn(
                channel=channel,
                version=version_key(version),
                payload=self._dump(values[channel]) if channel in values else None,
            )
            for channel, version in new_versions.items()
        ]
        with self._writing(thread_id) as seen:
            result = services.thread_checkpoint_put(
                tenant=self.tenant,
                thread_id=thread_id,
                checkpoint_ns=ns,
                checkpoint_id=checkpoint["id"],
                parent_checkpoint_id=configurable.get("checkpoint_id"),
                checkpoint=self._dump(core),
                metadata=self._dump(stored_metadata),
                index=services.MetadataIndex.of(stored_metadata),
                blobs=blobs,
                channel_refs=[[c, version_key(v)] for c, v in core["channel_versions"].items()],
                actor=self.actor,
                fencing=self.fencing,
                expected_versions=seen,
            )
            self._advanced(thread_id, result.versions)
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    @db_call
    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        from langgraph_store import services

        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        items = [
            services.WriteIn(
                idx=WRITES_IDX_MAP.get(channel, idx),
                channel=channel,
                payload=self._dump(value),
            )
            for idx, (channel, value) in enumerate(writes)
        ]
        with self._writing(thread_id):
            change = services.thread_writes_put(
                tenant=self.tenant,
                thread_id=thread_id,
                checkpoint_ns=configurable.get("checkpoint_ns") or "",
                checkpoint_id=configurable["checkpoint_id"],
                task_id=task_id,
                task_path=task_path,
                writes=items,
                replace=all(channel in WRITES_IDX_MAP for channel, _ in writes),
                actor=self.actor,
                track_versions=self.fencing,
            )
            self._advanced(thread_id, change)

    @db_call
    def delete_thread(self, thread_id: str) -> None:
        from langgraph_store.maintenance import thread_delete

        thread_id = str(thread_id)
        with self._writing(thread_id):
            thread_delete(tenant=self.tenant, thread_id=thread_id, actor=self.actor)
            with self._seen_lock:
                self._seen.pop(thread_id, None)

    @db_call
    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        from langgraph_store.maintenance import (
            checkpoints_delete_for_runs,
        )

        checkpoints_delete_for_runs(tenant=self.tenant, run_ids=run_ids, actor=self.actor)

    @db_call
    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        from langgraph_store.maintenance import thread_copy

        thread_copy(
            tenant=self.tenant,
            source_thread_id=str(source_thread_id),
            target_thread_id=str(target_thread_id),
            actor=self.actor,
        )

    @db_call
    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        from langgraph_store.maintenance import threads_prune

        threads_prune(
            tenant=self.tenant, thread_ids=thread_ids, strategy=strategy, actor=self.actor
        )

    def get_next_version(self, current: str | None, channel: None) -> str:
        # A random suffix, as LangGraph's own savers do: two branches that write one channel
        # from the same parent get different versions, so their values never collide.
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # --- async: the same operations in asgiref's thread-sensitive executor --------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await off_loop(self.get_tuple)(config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        def collect() -> list[CheckpointTuple]:
            return [*self.list(config, filter=filter, before=before, limit=limit)]

        for item in await off_loop(collect)():
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await off_loop(self.put)(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await off_loop(self.put_writes)(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await off_loop(self.delete_thread)(thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await off_loop(self.delete_for_runs)(run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await off_loop(self.copy_thread)(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await off_loop(self.prune)(thread_ids, strategy=strategy)


class AsyncCairnSaver(CairnSaver):
    """The saver for async graphs (``ainvoke``/``astream``): the same storage; each call runs
    the Django ORM in asgiref's thread-sensitive executor, off the event loop."""
