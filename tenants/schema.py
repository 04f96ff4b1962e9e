"""How the bearer token appears in the OpenAPI document."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.authentication.BearerTokenAuthentication"
    name = "bearerToken"

    def get_security_definition(self, auto_schema):  # noqa: ANN001, ANN201
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A token from `manage.py issue_token`; it names one user in one tenant.",
        }
