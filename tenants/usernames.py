"""One rule for what a username is: its key is its NFKC form, case-folded. Django's sign-in
form reads ``𝐚𝐫𝐞𝐯`` as ``arev`` (NFKC), so the throttle keys on the same form, and an
account, an invitation or a sign-in that names ``Bop`` or ``ｂｏｐ`` means the account
``bop``: a look-alike of an existing account is never created beside it.

New accounts are created with their key as their username. Accounts made before (``Alice``)
are still found by theirs: an exact match first, then a case-insensitive one whose key is
the key asked for.
"""

from __future__ import annotations

import unicodedata

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser


def username_key(name: object) -> str:
    """NFKC, case-folded, without surrounding whitespace: the same person's name however it
    is typed (fullwidth, mathematical letters, capitals)."""
    return unicodedata.normalize("NFKC", str(name or "")).casefold().strip()


def account_find(name: object) -> AbstractBaseUser | None:
    """The account ``name`` means, or None."""
    key = username_key(name)
    if not key:
        return None
    users = get_user_model().objects
    typed = unicodedata.normalize("NFKC", str(name)).strip()
    exact = users.filter(username__in={typed, key}).order_by("pk")
    for user in exact:
        if user.get_username() == typed:
            return user
    for user in exact:
        return user
    alike = [u for u in users.filter(username__iexact=key) if username_key(u.username) == key]
    return alike[0] if len(alike) == 1 else None


def same_account_name(one: object, other: object) -> bool:
    return username_key(one) == username_key(other)
