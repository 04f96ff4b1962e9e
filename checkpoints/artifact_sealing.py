"""Streaming AES-GCM for artifact objects: sealed in chunks, never whole in memory twice.

An artifact object (format 2) is a header and a sequence of sealed chunks::

    b"CAIRNA2\\n" | len(key id) (1 byte) | key id | nonce prefix (7 bytes)
    chunk 0 | chunk 1 | … | chunk n        each: AES-GCM(≤ 64 KiB plaintext) || 16-byte tag

Chunk i's nonce is ``prefix || i (4 bytes, big-endian) || final flag (1 byte)``; the associated
data is ``tenant|table|row|field|`` followed by the header. So every chunk is bound to its
tenant, row and field (as every other sealed value in Cairn), to its position (reordering
fails), and the last chunk says it is the last (a truncated object fails instead of reading
short). Objects written before this format (``v1.<key id>.<base64>`` text, checkpoints.crypto)
are still read.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from typing import BinaryIO

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from checkpoints import crypto

MAGIC = b"CAIRNA2\n"
CHUNK_BYTES = 64 * 1024
TAG_BYTES = 16
PREFIX_BYTES = 7
MAX_CHUNKS = 2**32


def _aad(scope: dict[str, object], header: bytes) -> bytes:
    base = f"{scope['tenant_id']}|{scope['table']}|{scope['row_id']}|{scope['field']}|"
    return base.encode() + header


def _nonce(prefix: bytes, index: int, final: bool) -> bytes:
    return prefix + index.to_bytes(4, "big") + (b"\x01" if final else b"\x00")


def seal_to(data: bytes | memoryview, out: BinaryIO, *, scope: dict[str, object]) -> str:
    """Write ``data`` sealed under the active key to ``out``, chunk by chunk.

    ``scope`` is the tenant_id/table/row_id/field the ciphertext is bound to. Returns the
    sha256 of the bytes written (the object's content address). Only one chunk of
    ciphertext exists in memory at a time.
    """
    ring = crypto.keyring()
    key_id = ring.active_id.encode()
    header = MAGIC + bytes([len(key_id)]) + key_id + secrets.token_bytes(PREFIX_BYTES)
    prefix = header[-PREFIX_BYTES:]
    aead, aad = AESGCM(ring.keys[ring.active_id]), _aad(scope, header)
    digest = hashlib.sha256(header)
    out.write(header)
    view = memoryview(data)
    count = max(1, -(-len(view) // CHUNK_BYTES))
    if count >= MAX_CHUNKS:
        raise ValueError("the artifact is too large for one sealed object")
    for index in range(count):
        piece = view[index * CHUNK_BYTES : (index + 1) * CHUNK_BYTES]
        sealed = aead.encrypt(_nonce(prefix, index, index == count - 1), piece, aad)
        digest.update(sealed)
        out.write(sealed)
    return digest.hexdigest()


def _read_exactly(handle: BinaryIO, size: int) -> bytes:
    parts, missing = [], size
    while missing:
        part = handle.read(missing)
        if not part:
            break
        parts.append(part)
        missing -= len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def unseal_from(handle: BinaryIO, *, scope: dict[str, object]) -> Iterator[bytes]:
    """The plaintext of a sealed object, chunk by chunk, each authenticated before it is
    yielded. Raises crypto.MissingKeyError or crypto.DecryptionError (damaged, truncated,
    reordered, or written for another row); never yields unauthenticated bytes."""
    row = f"{scope['table']}.{scope['field']} of {scope['row_id']}"
    start = _read_exactly(handle, len(MAGIC))
    if start != MAGIC:
        # Format 1: one base64 text value (checkpoints.crypto.seal), read whole.
        rest = handle.read()
        try:
            sealed = (start + rest).decode()
        except UnicodeDecodeError as exc:
            raise crypto.DecryptionError(f"{row} is not a sealed value") from exc
        yield crypto.unseal(sealed, **scope)  # type: ignore[arg-type]
        return
    length = _read_exactly(handle, 1)
    key_id_raw = _read_exactly(handle, length[0]) if length else b""
    prefix = _read_exactly(handle, PREFIX_BYTES)
    if not length or len(key_id_raw) != length[0] or len(prefix) != PREFIX_BYTES:
        raise crypto.DecryptionError(f"{row} has a truncated header")
    key_id = key_id_raw.decode(errors="replace")
    key = crypto.keyring().keys.get(key_id)
    if key is None:
        raise crypto.MissingKeyError(key_id)
    header = MAGIC + length + key_id_raw + prefix
    aead, aad = AESGCM(key), _aad(scope, header)
    block = _read_exactly(handle, CHUNK_BYTES + TAG_BYTES)
    index = 0
    while True:
        following = _read_exactly(handle, CHUNK_BYTES + TAG_BYTES) if block else b""
        final = not following
        try:
            yield aead.decrypt(_nonce(prefix, index, final), block, aad)
        except InvalidTag as exc:
            raise crypto.DecryptionError(
                f"{row} failed authentication at chunk {index}: damaged, truncated, or not "
                "written for this row"
            ) from exc
        if final:
            return
        block, index = following, index + 1
