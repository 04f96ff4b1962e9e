"""OpenAPI post-processing: document what every authenticated operation may answer."""

from __future__ import annotations

ERROR_REF = {"$ref": "#/components/schemas/Error"}
COMMON = {
    "401": "No valid credentials: a bearer token or a signed-in session is required.",
    "403": "Signed in, but your role in this tenant does not allow this.",
}


def add_common_responses(result, generator, request, public):  # noqa: ANN001, ANN201
    """Every operation with security requirements may answer 401 and 403 (API.md)."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault(
        "Error",
        {
            "type": "object",
            "required": ["code", "detail"],
            "properties": {
                "code": {"type": "string"},
                "detail": {"type": "string"},
                "fields": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
    )
    for path_item in result.get("paths", {}).values():
        for operation in path_item.values():
            if not isinstance(operation, dict) or not operation.get("security"):
                continue
            if operation["security"] == [{}]:
                continue
            responses = operation.setdefault("responses", {})
            if any(p.get("name") == "cursor" for p in operation.get("parameters", [])):
                responses.setdefault(
                    "400",
                    {
                        "description": "A malformed pagination cursor.",
                        "content": {"application/json": {"schema": ERROR_REF}},
                    },
                )
            for status, description in COMMON.items():
                responses.setdefault(
                    status,
                    {
                        "description": description,
                        "content": {"application/json": {"schema": ERROR_REF}},
                    },
                )
    return result
