"""Sign-in by the account a username means (``tenants.usernames``): ``Alice``, ``ALICE`` and
``ａｌｉｃｅ`` sign in to ``alice``, as the throttle already counts them as one name."""

from __future__ import annotations

from django.contrib.auth.backends import ModelBackend
from django.http import HttpRequest

from tenants.usernames import account_find


class UsernameKeyBackend(ModelBackend):
    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password=None, **kwargs
    ):  # noqa: ANN001, ANN003, ANN201
        if username is not None:
            account = account_find(username)
            if account is not None:
                username = account.get_username()
        return super().authenticate(request, username=username, password=password, **kwargs)
