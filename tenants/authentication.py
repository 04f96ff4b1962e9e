"""API authentication: ``Authorization: Bearer <token>``; a token names its tenant."""

from __future__ import annotations

from rest_framework import authentication, exceptions

from tenants.services import token_authenticate


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):  # noqa: ANN001, ANN201
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed(
                "The Authorization header must be 'Bearer <token>'."
            )
        try:
            secret = header[1].decode()
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("The token contains invalid characters.")
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
