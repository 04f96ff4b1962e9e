"""AES-GCM encryption of payload fields, bound to where the ciphertext lives.

A sealed value is ``v1.<key id>.<base64url(nonce || ciphertext || tag)>``, or ``z1.…`` when
the plaintext was compressed with zlib before it was encrypted (checkpoint envelopes:
ciphertext does not compress, so PostgreSQL's TOAST could not do it later). The format
prefix says which, so rows written before compression stay readable. The associated data is
``tenant|table|row|field``, so a ciphertext copied into another row, field or tenant fails
authentication instead of decrypting into the wrong place.

Keys come from ``CAIRN_ENCRYPTION_KEYS`` ("kid:base64key,kid2:base64key"; the first is
active) or, when that is unset, from the local key file ``CAIRN_KEY_FILE`` (same format, one
key per line), which is generated on first use and never committed.
"""

from __future__ import annotations

import base64
import functools
import os
import secrets
import zlib
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings

FORMAT = "v1"
COMPRESSED_FORMAT = "z1"  # zlib (level 1), then AES-GCM
NONCE_BYTES = 12
# What a page shows for a stored value that is set but cannot be unsealed here (its key is
# no longer configured, or the seal is damaged or was not written for this row).
UNREADABLE = "(set, but it cannot be read: set it again)"
ZLIB_LEVEL = 1  # 51.9 KB of agent state → 4.2 KB in well under a millisecond


class KeyConfigurationError(Exception):
    """The key configuration is unusable (malformed, or a key of the wrong size)."""


class MissingKeyError(Exception):
    """A ciphertext names a key id that is not configured."""

    def __init__(self, key_id: str):
        self.key_id = key_id
        super().__init__(
            f"encryption key '{key_id}' is not configured; add it to CAIRN_ENCRYPTION_KEYS "
            "(or the key file) to read data written under it"
        )


class DecryptionError(Exception):
    """The ciphertext is damaged or was moved from the row it was written for."""


@dataclass(frozen=True)
class Keyring:
    active_id: str
    keys: dict[str, bytes]


def _parse(spec: str, source: str) -> Keyring:
    entries = [part.strip() for part in spec.replace("\n", ",").split(",") if part.strip()]
    if not entries:
        raise KeyConfigurationError(f"{source} holds no keys")
    keys: dict[str, bytes] = {}
    for entry in entries:
        key_id, sep, encoded = entry.partition(":")
        if not sep or not key_id or "." in key_id:
            raise KeyConfigurationError(f"{source}: expected 'kid:base64key', got '{key_id}:…'")
        try:
            key = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
        except ValueError as exc:
            raise KeyConfigurationError(f"{source}: key '{key_id}' is not base64") from exc
        if len(key) not in (16, 24, 32):
            raise KeyConfigurationError(f"{source}: key '{key_id}' must be 16, 24 or 32 bytes")
        keys[key_id] = key
    return Keyring(active_id=entries[0].partition(":")[0], keys=keys)


def new_key_spec(key_id: str) -> str:
    return f"{key_id}:" + base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")


def _read_or_create_key_file(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text()
    with os.fdopen(fd, "w") as handle:
        handle.write(new_key_spec("k1") + "\n")
    return path.read_text()


@functools.lru_cache(maxsize=8)
def _keyring_for(spec: str, key_file: str) -> Keyring:
    if spec:
        return _parse(spec, "CAIRN_ENCRYPTION_KEYS")
    return _parse(_read_or_create_key_file(Path(key_file)), f"key file {key_file}")


def keyring() -> Keyring:
    return _keyring_for(settings.CAIRN_ENCRYPTION_KEYS or "", str(settings.CAIRN_KEY_FILE))


def _aad(tenant_id: object, table: str, row_id: object, field: str) -> bytes:
    return f"{tenant_id}|{table}|{row_id}|{field}".encode()


def seal(
    plaintext: bytes,
    *,
    tenant_id: object,
    table: str,
    row_id: object,
    field: str,
    compress: bool = False,
) -> str:
    """Encrypt ``plaintext`` under the active key, bound to tenant, table, row and field;
    with ``compress``, zlib-compress it first (format ``z1``)."""
    ring = keyring()
    fmt = FORMAT
    if compress:
        plaintext, fmt = zlib.compress(plaintext, ZLIB_LEVEL), COMPRESSED_FORMAT
    nonce = secrets.token_bytes(NONCE_BYTES)
    ciphertext = AESGCM(ring.keys[ring.active_id]).encrypt(
        nonce, plaintext, _aad(tenant_id, table, row_id, field)
    )
    body = base64.urlsafe_b64encode(nonce + ciphertext).decode()
    return f"{fmt}.{ring.active_id}.{body}"


def is_compressed(sealed: str) -> bool:
    return sealed.startswith(COMPRESSED_FORMAT + ".")


def key_id_of(sealed: str) -> str:
    return sealed.split(".", 2)[1]


def unseal(sealed: str, *, tenant_id: object, table: str, row_id: object, field: str) -> bytes:
    """Decrypt a sealed value. Raises MissingKeyError or DecryptionError, never returns junk."""
    try:
        fmt, key_id, body = sealed.split(".", 2)
        raw = base64.urlsafe_b64decode(body)
    except ValueError as exc:
        raise DecryptionError(f"{table}.{field} of {row_id} is not a sealed value") from exc
    if fmt not in (FORMAT, COMPRESSED_FORMAT):
        raise DecryptionError(f"{table}.{field} of {row_id} has unknown format '{fmt}'")
    key = keyring().keys.get(key_id)
    if key is None:
        raise MissingKeyError(key_id)
    try:
        plain = AESGCM(key).decrypt(
            raw[:NONCE_BYTES], raw[NONCE_BYTES:], _aad(tenant_id, table, row_id, field)
        )
    except InvalidTag as exc:
        raise DecryptionError(
            f"{table}.{field} of {row_id} failed authentication: damaged, or not written for "
            "this row"
        ) from exc
    if fmt == COMPRESSED_FORMAT:
        try:
            return zlib.decompress(plain)
        except zlib.error as exc:  # authenticated, so only a writer's bug gets here
            raise DecryptionError(f"{table}.{field} of {row_id} does not decompress") from exc
    return plain
