"""Secret references: envelopes and settings name a secret (``env:NAME``, ``file:/path``);
the value is read only at execution time and never stored."""

from __future__ import annotations

import os
from pathlib import Path


class SecretUnavailable(Exception):
    pass


def secret_resolve(reference: str) -> str:
    """The secret a reference names. Raises SecretUnavailable with a sentence naming the
    reference (never the value)."""
    scheme, _, name = (reference or "").partition(":")
    if scheme == "env" and name:
        value = os.environ.get(name)
        if not value:
            raise SecretUnavailable(f"The environment variable {name} is not set.")
        return value
    if scheme == "file" and name:
        try:
            return Path(name).read_text().strip()
        except OSError as exc:
            raise SecretUnavailable(f"The secret file {name} cannot be read: {exc.strerror}.")
    raise SecretUnavailable(f"'{reference}' is not a secret reference; use env:NAME or file:/path.")
