"""The API's OpenAPI schema class (REST_FRAMEWORK's DEFAULT_SCHEMA_CLASS)."""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema


class CairnAutoSchema(AutoSchema):
    """drf-spectacular's schema, saying what the API enforces: a body read by a
    StrictSerializer refuses unknown fields, so its schema has ``additionalProperties:
    false`` (a fuzzer then knows an extra field is invalid input, and a 400 for it right)."""

    def _map_serializer(self, serializer, direction, bypass_extensions=False):  # noqa: ANN001, ANN202
        # Imported here: REST framework loads this class while its settings are read.
        from api.serializers import StrictSerializer

        schema = super()._map_serializer(serializer, direction, bypass_extensions)
        if direction == "request" and isinstance(serializer, StrictSerializer):
            schema["additionalProperties"] = False
        return schema
