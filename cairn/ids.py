"""Run ids as people copy them from a table: a full uuid or a prefix of one."""

from __future__ import annotations

from uuid import UUID

RUN_ID_PREFIX_MIN = 4


def run_id_prefix_bounds(text: str) -> tuple[UUID, UUID] | None:
    """The lowest and highest run id that start with ``text`` as people copy it from a table
    (a full id, or at least RUN_ID_PREFIX_MIN hex digits; dashes ignored), for a primary-key
    range the index answers on every database (no text cast of the uuid). None when ``text``
    is no such prefix."""
    compact = str(text).strip().lower().replace("-", "")
    if not RUN_ID_PREFIX_MIN <= len(compact) <= 32 or any(
        c not in "0123456789abcdef" for c in compact
    ):
        return None
    return UUID(compact.ljust(32, "0")), UUID(compact.ljust(32, "f"))
