"""Compare two envelopes group by group, as flat JSON paths a person can read."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from checkpoints.envelope import GROUPS

MISSING = object()


@dataclass(frozen=True)
class Change:
    path: str
    kind: str  # added | removed | changed
    before: str
    after: str


@dataclass(frozen=True)
class GroupView:
    name: str
    pretty: str
    changes: list[Change]


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{"a.b[0].c": leaf}; empty containers are leaves so their appearance is a change."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key in sorted(value):
            out.update(flatten(value[key], f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and value:
        out = {}
        for index, item in enumerate(value):
            out.update(flatten(item, f"{prefix}[{index}]"))
        return out
    return {prefix or "(value)": value}


def _show(value: Any) -> str:
    return "" if value is MISSING else json.dumps(value, ensure_ascii=False, sort_keys=True)


def group_changes(before: Any, after: Any) -> list[Change]:
    old = flatten(before) if before is not MISSING else {}
    new = flatten(after) if after is not MISSING else {}
    changes = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path, MISSING), new.get(path, MISSING)
        if a is MISSING:
            changes.append(Change(path, "added", "", _show(b)))
        elif b is MISSING:
            changes.append(Change(path, "removed", _show(a), ""))
        elif a != b:
            changes.append(Change(path, "changed", _show(a), _show(b)))
    return changes


# Identity fields every checkpoint has its own of: that they differ says nothing about the
# run, so a diff leaves them out (run id, workflow type and version still count).
PER_CHECKPOINT_IDENTITY = frozenset(
    {"checkpoint_id", "parent_checkpoint_id", "sequence", "parent_sha256"}
)


def _without_per_checkpoint(identity: Any) -> Any:
    if not isinstance(identity, dict):
        return identity
    return {k: v for k, v in identity.items() if k not in PER_CHECKPOINT_IDENTITY}


def envelope_groups(envelope: dict[str, Any], parent: dict[str, Any] | None) -> list[GroupView]:
    """Every field group of ``envelope`` with its changes since ``parent`` (None: nothing to
    compare with), any earlier or later checkpoint. The identity fields every checkpoint has
    its own of (``PER_CHECKPOINT_IDENTITY``) are not listed as changes."""
    views = []
    for name in GROUPS:
        value = envelope.get(name, MISSING)
        before = MISSING if parent is None else parent.get(name, MISSING)
        views.append(
            GroupView(
                name=name,
                pretty=json.dumps(
                    None if value is MISSING else value,
                    indent=2,
                    ensure_ascii=False,
                    sort_keys=True,
                ),
                changes=[]
                if parent is None
                else (
                    group_changes(_without_per_checkpoint(before), _without_per_checkpoint(value))
                    if name == "identity"
                    else group_changes(before, value)
                ),
            )
        )
    return views
