"""Secret references (``env:NAME``, ``file:/path``), resolved at call time and never stored."""

from __future__ import annotations

import os
from pathlib import Path


class SecretUnavailable(Exception):
    """The reference names a variable or file that is not there."""


def secret_resolve(reference: str) -> str:
    """The secret a reference names. Raises SecretUnavailable, naming the reference only."""
    scheme, sep, name = reference.partition(":")
    if not sep or not name:
        raise SecretUnavailable(
            f"'{reference[:40]}' is not a secret reference (env:NAME or file:PATH)"
        )
    if scheme == "env":
        value = os.environ.get(name)
        if not value:
            raise SecretUnavailable(f"the environment variable {name} is not set")
        return value
    if scheme == "file":
        try:
            return Path(name).read_text().strip()
        except OSError as exc:
            raise SecretUnavailable(f"the secret file {name} cannot be read: {exc.strerror}")
    raise SecretUnavailable(f"unknown secret reference scheme '{scheme}' (use env: or file:)")
