"""Sign-in throttling: after too many failures for one username from one address (or from
one address for any username) within a window, sign-in is refused until the window ends.

The counts live in the database so every web process shares them; a fixed window keeps
it to one row per key.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from tenants.models import LoginThrottle

log = logging.getLogger("cairn.security")


def _keys(username: str, ip: str) -> list[tuple[str, int]]:
    """(key, allowed failures) pairs this attempt counts against."""
    name = (username or "").strip().lower()[:150]
    return [
        (_digest(f"user|{name}|{ip}"), settings.CAIRN_LOGIN_MAX_FAILURES),
        (_digest(f"addr|{ip}"), settings.CAIRN_LOGIN_MAX_FAILURES_PER_ADDRESS),
    ]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _window() -> timedelta:
    return timedelta(seconds=settings.CAIRN_LOGIN_WINDOW_SECONDS)


def login_throttle_wait(*, username: str, ip: str) -> int:
    """Seconds until this username may try again from this address (0: it may now)."""
    now = timezone.now()
    wait = 0
    limits = dict(_keys(username, ip))
    for row in LoginThrottle.objects.filter(pk__in=limits, window_started_at__gt=now - _window()):
        if row.failures >= limits[row.key]:
            left = (row.window_started_at + _window() - now).total_seconds()
            wait = max(wait, int(left) + 1)
    return wait


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
