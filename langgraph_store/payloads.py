"""Serialized LangGraph values and how they are sealed at rest.

The saver hands over ``(type, bytes)`` pairs from LangGraph's serializer. The type travels
inside the ciphertext, and the associated data names the row and its LangGraph key, so a
value moved to another row, channel, version or task fails authentication instead of
loading into the wrong place.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from cairn.errors import IntegrityFailure, InvalidRequest
from checkpoints import crypto

# What the saver may store. Pickle is refused here as well as in the saver: a pickle
# payload would run code when it is loaded.
STORABLE_TYPES = frozenset({"null", "bytes", "bytearray", "msgpack", "json"})

CHECKPOINTS = "langgraph_checkpoint"
BLOBS = "langgraph_blob"
WRITES = "langgraph_write"


@dataclass(frozen=True)
class Payload:
    type: str
    data: bytes

    def plaintext(self) -> bytes:
        return self.type.encode() + b"\0" + self.data

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.plaintext()).hexdigest()


def payload_check(payload: Payload, what: str) -> None:
    """Raise InvalidRequest unless the payload's type is one Cairn stores."""
    if payload.type not in STORABLE_TYPES:
        raise InvalidRequest(
            f"The {what} is serialized as '{payload.type}'; Cairn stores only "
            f"{', '.join(sorted(STORABLE_TYPES))} (never pickle). Use LangGraph's "
            "JsonPlusSerializer with pickle_fallback off.",
            fields={what: payload.type},
        )


def payload_seal(
    payload: Payload, *, tenant_id: object, table: str, row_id: object, key: str
) -> str:
    return crypto.seal(
        payload.plaintext(), tenant_id=tenant_id, table=table, row_id=row_id, field=key
    )


def payload_unseal(
    sealed: str, *, tenant_id: object, table: str, row_id: object, key: str
) -> Payload:
    """Decrypt a sealed payload. Raises IntegrityFailure (damaged, moved or missing key)."""
    try:
        plain = crypto.unseal(sealed, tenant_id=tenant_id, table=table, row_id=row_id, field=key)
    except (crypto.DecryptionError, crypto.MissingKeyError) as exc:
        raise IntegrityFailure(f"A stored LangGraph value cannot be read: {exc}")
    type_, sep, data = plain.partition(b"\0")
    if not sep:
        raise IntegrityFailure(f"The stored LangGraph value of {table} {row_id} has no type.")
    return Payload(type=type_.decode(), data=data)


# The LangGraph key each sealed field is bound to (the ``field`` part of the AAD).
def checkpoint_key(thread_pk: int, ns: str, checkpoint_id: str, part: str) -> str:
    return f"{part}|{thread_pk}|{ns}|{checkpoint_id}"


def blob_key(thread_pk: int, ns: str, channel: str, version: str) -> str:
    return f"value|{thread_pk}|{ns}|{channel}|{version}"


def write_key(
    thread_pk: int, ns: str, checkpoint_id: str, task_id: str, idx: int, channel: str
) -> str:
    return f"value|{thread_pk}|{ns}|{checkpoint_id}|{task_id}|{idx}|{channel}"
