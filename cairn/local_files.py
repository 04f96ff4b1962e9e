"""Secrets generated once into a local directory that git ignores (the embedded default)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def local_secret(path: Path, *, nbytes: int) -> str:
    """Return the secret stored at ``path``, creating it (mode 0600) on first use.

    Creation is atomic (O_EXCL), so two processes starting together agree on one value.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        value = secrets.token_urlsafe(nbytes)
        handle.write(value + "\n")
    return value
