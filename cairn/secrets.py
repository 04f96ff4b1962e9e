"""Secret references, resolved at execution time and never stored.

Settings and provider adapters name a secret, never hold it: ``env:NAME`` reads the
environment variable NAME; ``file:NAME`` reads the file NAME under ``CAIRN_SECRETS_DIR``
(a path that leads outside that directory, through ``..``, an absolute path or a symlink,
is refused). Errors name the reference, never the value.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

MAX_SECRET_BYTES = 64 * 1024


class SecretUnavailable(Exception):
    """The reference is malformed, refused, or names a variable or file that is not there."""


def secret_resolve(reference: str) -> str:
    """The secret ``reference`` names, stripped of surrounding whitespace."""
    scheme, sep, name = (reference or "").partition(":")
    if not sep or not name:
        # Not echoed: a misconfigured setting may hold the secret itself.
        raise SecretUnavailable("The value is not a secret reference; use env:NAME or file:NAME.")
    if scheme == "env":
        value = os.environ.get(name)
        if not value:
            raise SecretUnavailable(f"The environment variable {name} is not set.")
        return value
    if scheme == "file":
        return _read_file(name)
    raise SecretUnavailable(f"Unknown secret reference scheme '{scheme}'; use env: or file:.")


def _read_file(name: str) -> str:
    base_setting = getattr(settings, "CAIRN_SECRETS_DIR", "")
    if not base_setting:
        raise SecretUnavailable(
            f"file:{name} cannot be read: set CAIRN_SECRETS_DIR to the directory of secret files."
        )
    base = Path(base_setting).resolve()
    path = (base / name).resolve()
    if not path.is_relative_to(base) or path == base:
        raise SecretUnavailable(f"file:{name} leads outside CAIRN_SECRETS_DIR; it is refused.")
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_SECRET_BYTES + 1)
    except OSError as exc:
        raise SecretUnavailable(f"The secret file {name} cannot be read: {exc.strerror}.")
    if len(data) > MAX_SECRET_BYTES:
        raise SecretUnavailable(f"The secret file {name} is larger than a secret can be.")
    try:
        return data.decode().strip()
    except UnicodeDecodeError:
        raise SecretUnavailable(f"The secret file {name} is not UTF-8 text.")
