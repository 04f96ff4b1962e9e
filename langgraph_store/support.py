"""Helpers of the LangGraph saver: serializer checks, connection hygiene, building tuples."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

if TYPE_CHECKING:
    from langgraph_store.models import LangGraphCheckpoint
    from langgraph_store.payloads import Payload

_thread = threading.local()


def release_connection() -> None:
    """LangGraph calls a sync saver from short-lived pool threads; a database connection one
    of them opened would outlive it (holding the database), so it is closed after the call.
    The main thread and asgiref's long-lived executor thread keep theirs."""
    from django.db import connection

    if threading.current_thread() is threading.main_thread() or getattr(_thread, "kept", False):
        return
    if not connection.in_atomic_block:
        connection.close()


def db_call(method):  # noqa: ANN001, ANN202
    @functools.wraps(method)
    def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        try:
            return method(*args, **kwargs)
        finally:
            release_connection()

    return call


def off_loop(function):  # noqa: ANN001, ANN202
    """``function`` in asgiref's thread-sensitive executor (Django's ORM is synchronous)."""

    def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        _thread.kept = True
        return function(*args, **kwargs)

    return sync_to_async(call)


def serializer_checked(serde: SerializerProtocol | None) -> JsonPlusSerializer:
    """LangGraph's JSON-plus serializer with pickle off; anything else is refused."""
    if serde is None:
        return JsonPlusSerializer(pickle_fallback=False)
    if not isinstance(serde, JsonPlusSerializer):
        raise TypeError(
            "CairnSaver stores values with LangGraph's JsonPlusSerializer only (msgpack, "
            f"never pickle); got {type(serde).__name__}."
        )
    if serde.pickle_fallback:
        raise ValueError(
            "CairnSaver never stores pickle: pass JsonPlusSerializer(pickle_fallback=False)."
        )
    return serde


def version_key(version: Any) -> str:
    # JSON keeps 1, 1.0 and "1" apart, so a version is found under exactly its own key.
    return json.dumps(version)


def tuples_build(
    load: Callable[[Payload], Any], rows: Sequence[LangGraphCheckpoint], metadata: dict
) -> list[CheckpointTuple]:
    """LangGraph's tuples for stored rows (``metadata``: already loaded, by row pk), with
    their channel values and pending writes fetched in one query each."""
    from langgraph_store import selectors

    cores = {row.pk: load(selectors.row_payload(row, "checkpoint")) for row in rows}
    wanted = [
        (row.thread_id, row.checkpoint_ns, channel, version_key(version))
        for row in rows
        for channel, version in cores[row.pk]["channel_versions"].items()
    ]
    blobs = selectors.blobs_for(wanted)
    writes = selectors.writes_for(rows)
    tuples = []
    for row in rows:
        core = cores[row.pk]
        values = {}
        for channel, version in core["channel_versions"].items():
            payload = blobs.get((row.thread_id, row.checkpoint_ns, channel, version_key(version)))
            if payload is not None:
                values[channel] = load(payload)
        configurable = {
            "thread_id": row.thread.thread_id,
            "checkpoint_ns": row.checkpoint_ns,
            "checkpoint_id": row.checkpoint_id,
        }
        parent = None
        if row.parent_checkpoint_id:
            parent = {"configurable": {**configurable, "checkpoint_id": row.parent_checkpoint_id}}
        pending = [
            (w.task_id, w.channel, load(w.payload))
            for w in writes.get((row.thread_id, row.checkpoint_ns, row.checkpoint_id), [])
        ]
        tuples.append(
            CheckpointTuple(
                config={"configurable": configurable},
                checkpoint={**core, "channel_values": values},
                metadata=metadata[row.pk],
                parent_config=parent,
                pending_writes=pending,
            )
        )
    return tuples
