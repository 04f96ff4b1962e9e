"""Sign-in throttling: after too many failures for one username from one address (or from
one address for any username) within a window, sign-in is refused until the window ends.

The counts live in the database so every web process shares them; a fixed window keeps
it to one row per key.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from tenants.models import LoginThrottle
from tenants.usernames import username_key

log = logging.getLogger("cairn.security")


def _keys(username: str, ip: str) -> list[tuple[str, int]]:
    """(key, allowed failures) pairs this attempt counts against. The username counts as
    its key (NFKC, case-folded), as the sign-in form reads it: ``𝐚𝐫𝐞𝐯`` and ``AREV`` are
    ``arev`` tried again, not a fresh name."""
    name = username_key(username)[:150]
    return [
        (_digest(f"user|{name}|{ip}"), settings.CAIRN_LOGIN_MAX_FAILURES),
        (_digest(f"addr|{ip}"), settings.CAIRN_LOGIN_MAX_FAILURES_PER_ADDRESS),
    ]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _window() -> timedelta:
    return timedelta(seconds=settings.CAIRN_LOGIN_WINDOW_SECONDS)


@dataclass(frozen=True)
class LoginRefusal:
    """Why sign-in is refused for now: ``seconds`` until it may be tried again, and which
    limit holds it (``per_address``: failures from the address for any username; else
    failures for this username from the address)."""

    seconds: int
    per_address: bool


def login_throttle_refusal(*, username: str, ip: str) -> LoginRefusal | None:
    """The refusal of a sign-in by this username from this address; None: it may try now.

    When both limits are reached, the one that holds longer is named (the address's on a
    tie, as it holds whatever username is tried)."""
    now = timezone.now()
    keys = _keys(username, ip)
    limits = dict(keys)
    address_key = keys[1][0]
    refusal = None
    for row in LoginThrottle.objects.filter(pk__in=limits, window_started_at__gt=now - _window()):
        if row.failures >= limits[row.key]:
            left = (row.window_started_at + _window() - now).total_seconds()
            seconds, per_address = int(left) + 1, row.key == address_key
            if refusal is None or (seconds, per_address) > (refusal.seconds, refusal.per_address):
                refusal = LoginRefusal(seconds=seconds, per_address=per_address)
    return refusal


def login_failure_record(*, username: str, ip: str) -> None:
    """Count one failed sign-in against the username+address and the address.

    Atomic; rows of windows that have ended are removed on the way.
    """
    now = timezone.now()
    with transaction.atomic():
        LoginThrottle.objects.filter(window_started_at__lte=now - _window()).delete()
        for key, _limit in _keys(username, ip):
            row, created = LoginThrottle.objects.select_for_update().get_or_create(
                key=key, defaults={"failures": 1, "window_started_at": now}
            )
            if not created:
                LoginThrottle.objects.filter(pk=key).update(failures=row.failures + 1)
    log.warning("sign-in failed", extra={"username": (username or "")[:150], "ip": ip})


def login_success_record(*, username: str, ip: str) -> None:
    """A successful sign-in clears the username+address count (not the address's)."""
    key = _keys(username, ip)[0][0]
    with transaction.atomic():
        LoginThrottle.objects.filter(pk=key).delete()
