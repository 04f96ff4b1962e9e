"""API authentication: ``Authorization: Bearer <token>``; a token names its tenant."""

from __future__ import annotations

from rest_framework import authentication, exceptions

from tenants.services import token_authenticate

KEYWORD = "Bearer"


def bearer_secret(header: bytes) -> str | None:
    """The secret of an ``Authorization: Bearer <secret>`` header, or None when the header
    names no bearer token (another scheme, or none). AuthenticationFailed when it is
    malformed."""
    parts = header.split()
    if not parts or parts[0].lower() != KEYWORD.lower().encode():
        return None
    if len(parts) != 2:
        raise exceptions.AuthenticationFailed("The Authorization header must be 'Bearer <token>'.")
    try:
        return parts[1].decode()
    except UnicodeDecodeError:
        raise exceptions.AuthenticationFailed("The token contains invalid characters.")


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = KEYWORD

    def authenticate(self, request):  # noqa: ANN001, ANN201
        secret = bearer_secret(authentication.get_authorization_header(request))
        if secret is None:
            return None
        token = token_authenticate(secret)
        if token is None:
            raise exceptions.AuthenticationFailed(
                "The token is unknown, revoked, or its member was removed."
            )
        request._request.cairn_tenant = token.tenant
        # Found while authenticating: the permission check needs no query of its own.
        request._request.cairn_permissions = token.permissions
        return token.user, token

    def authenticate_header(self, request) -> str:  # noqa: ANN001
        return self.keyword
