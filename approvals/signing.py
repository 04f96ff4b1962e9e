"""The deployment's Ed25519 key that signs evidence bundles (``approvals.services.evidence``).

The private key is a PEM file at ``CAIRN_EVIDENCE_KEY_FILE``. The embedded default
(the variable unset) generates it on first use under ``CAIRN_HOME``, mode 0600, atomically
(two processes starting together agree on one key); a configured path is never made up: a
missing or unreadable file is ``SigningKeyUnavailable`` (503 ``key_unavailable``), and
``python manage.py evidence_key --create`` writes one. Every web process of a deployment
must read the same file. The public key is published at ``GET /api/v1/evidence/public-key``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)
from django.conf import settings

from approvals.evidence_verify import ALGORITHM, public_key_id
from cairn.errors import SigningKeyUnavailable


@dataclass(frozen=True)
class SigningKey:
    private: Ed25519PrivateKey
    key_id: str
    public_pem: str
    public_hex: str

    def sign(self, message: bytes) -> str:
        return self.private.sign(message).hex()

    def published(self) -> dict[str, str]:
        """What ``GET /api/v1/evidence/public-key`` answers."""
        return {
            "algorithm": ALGORITHM,
            "key_id": self.key_id,
            "public_key_pem": self.public_pem,
            "public_key_hex": self.public_hex,
        }


def evidence_key_create(path: Path) -> bool:
    """Write a new private key to ``path`` unless one is there (mode 0600, O_EXCL). Returns
    whether it wrote one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pem = Ed25519PrivateKey.generate().private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
    )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    return True


@functools.lru_cache(maxsize=4)
def _load(path: str, generate: bool, mtime_ns: int) -> SigningKey:
    try:
        private = load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise SigningKeyUnavailable(
            f"The evidence signing key {path} cannot be read ({exc.__class__.__name__}); "
            "see docs/operations.md, 'Signed evidence'."
        ) from None
    if not isinstance(private, Ed25519PrivateKey):
        raise SigningKeyUnavailable(f"The evidence signing key {path} is not an Ed25519 key.")
    public = private.public_key()
    raw = public.public_bytes(Encoding.Raw, PublicFormat.Raw)
    pem = public.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()
    return SigningKey(private, public_key_id(raw), pem, raw.hex())


def evidence_signing_key() -> SigningKey:
    """The deployment's signing key (generated first when the embedded default has none)."""
    path = Path(settings.CAIRN_EVIDENCE_KEY_FILE)
    if settings.CAIRN_EVIDENCE_KEY_GENERATE and not path.exists():
        evidence_key_create(path)
    if not path.exists():
        raise SigningKeyUnavailable(
            f"No evidence signing key at {path} (CAIRN_EVIDENCE_KEY_FILE): create one with "
            "`python manage.py evidence_key --create`."
        )
    return _load(str(path), bool(settings.CAIRN_EVIDENCE_KEY_GENERATE), path.stat().st_mtime_ns)
