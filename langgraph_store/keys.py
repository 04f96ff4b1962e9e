"""Key rotation for LangGraph payloads: part of ``manage.py rotate_keys``.

Each sealed column is re-encrypted under the active key, bound to the same row and
LangGraph key as before; the plaintext never changes. Batches are short transactions, so
the rotation can be stopped and run again.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction
from django.db.models import Model, Q

from checkpoints import crypto
from langgraph_store import payloads
from langgraph_store.models import (
    LangGraphBlob,
    LangGraphCheckpoint,
    LangGraphWrite,
)


def _keys(row: Model) -> list[tuple[str, str]]:
    """(column, LangGraph key) of every sealed column of the row."""
    if isinstance(row, LangGraphCheckpoint):
        return [
            (
                f"{part}_sealed",
                payloads.checkpoint_key(row.thread_id, row.checkpoint_ns, row.checkpoint_id, part),
            )
            for part in ("checkpoint", "metadata")
        ]
    if isinstance(row, LangGraphBlob):
        key = payloads.blob_key(row.thread_id, row.checkpoint_ns, row.channel, row.version)
        return [("value_sealed", key)]
    key = payloads.write_key(
        row.thread_id, row.checkpoint_ns, row.checkpoint_id, row.task_id, row.idx, row.channel
    )
    return [("value_sealed", key)]


def _current(prefix: str) -> dict[type[Model], Q]:
    """Per model, the rows already under the active key (or with nothing sealed)."""
    value = Q(value_sealed__startswith=prefix)
    return {
        LangGraphCheckpoint: Q(checkpoint_sealed__startswith=prefix)
        & Q(metadata_sealed__startswith=prefix),
        # An empty column is LangGraph's "empty" marker: nothing to encrypt.
        LangGraphBlob: value | Q(value_sealed=""),
        LangGraphWrite: value,
    }


TABLES = {
    LangGraphCheckpoint: payloads.CHECKPOINTS,
    LangGraphBlob: payloads.BLOBS,
    LangGraphWrite: payloads.WRITES,
}


def langgraph_keys_rotate(
    *, batch_size: int = 500, progress: Callable[[str, int], None] | None = None
) -> int:
    """Re-encrypt LangGraph checkpoints, values and writes not under the active key.

    Returns how many rows were re-encrypted. Raises IntegrityFailure for a payload that
    cannot be decrypted (nothing of its batch is written).
    """
    active_prefix = f"{crypto.FORMAT}.{crypto.keyring().active_id}."
    report = progress or (lambda kind, done: None)
    done = 0
    current = _current(active_prefix)
    for model, table in TABLES.items():
        stale = model.objects.exclude(current[model])
        while True:
            batch = list(stale.order_by("pk")[:batch_size])
            if not batch:
                break
            with transaction.atomic():
                for row in batch:
                    changes = {}
                    for column, key in _keys(row):
                        scope = {
                            "tenant_id": row.tenant_id,
                            "table": table,
                            "row_id": row.pk,
                            "key": key,
                        }
                        payload = payloads.payload_unseal(getattr(row, column), **scope)
                        changes[column] = payloads.payload_seal(payload, **scope)
                    model.objects.filter(pk=row.pk).update(**changes)
            done += len(batch)
            report("langgraph", done)
    return done
