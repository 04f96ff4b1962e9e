"""Which adapter serves which provider name, built from settings at call time."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings

from runtime.providers.base import Provider
from runtime.providers.http import HttpProvider

PUBLISHING = "publishing"


def _publishing() -> Provider:
    return HttpProvider(
        name=PUBLISHING,
        base_url=settings.CAIRN_PUBLISHING_URL,
        timeout_seconds=settings.CAIRN_PROVIDER_TIMEOUT_SECONDS,
        auth_ref=settings.CAIRN_PUBLISHING_TOKEN_REF,
    )


_FACTORIES: dict[str, Callable[[], Provider]] = {PUBLISHING: _publishing}


class UnknownProvider(LookupError):
    pass


def provider_register(name: str, factory: Callable[[], Provider]) -> None:
    """Make ``name`` resolve to the adapter ``factory`` builds (called at each use, so
    settings and secret references are read when the call is made)."""
    _FACTORIES[name] = factory


def provider_get(name: str) -> Provider:
    try:
        return _FACTORIES[name]()
    except KeyError:
        raise UnknownProvider(
            f"No provider adapter is registered as '{name}'; "
            f"known: {', '.join(sorted(_FACTORIES))}."
        )
