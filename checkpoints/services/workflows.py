"""Workflow definitions: the declarative state machine every run is checked against."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet

from cairn.errors import (
    DefinitionConflict,
    InvalidDefinition,
    InvalidRequest,
    SecretInEnvelope,
    UnknownWorkflow,
)
from checkpoints.envelope import canonical_json, find_secret
from checkpoints.models import WorkflowDefinition
from tenants.models import Tenant

LIST_KEYS = ("states", "terminal", "approval_states", "effect_states")


def definition_normalize(raw: Any) -> dict[str, Any]:
    """Check a definition's shape and return it in normal form. Raises InvalidDefinition."""
    if not isinstance(raw, dict):
        raise InvalidDefinition("A workflow definition must be a JSON object.")
    problems: dict[str, str] = {}
    states = raw.get("states")
    if (
        not isinstance(states, list)
        or not states
        or not all(isinstance(s, str) and 0 < len(s) <= 100 for s in states)
    ):
        problems["states"] = "a non-empty list of state names (strings of 1-100 characters)"
        states = []
    if len(set(states)) != len(states):
        problems["states"] = "state names must be unique"
    known = set(states)
    initial = raw.get("initial")
    if not isinstance(initial, str) or initial not in known:
        problems["initial"] = "must name one of the states"
    transitions = raw.get("transitions")
    pairs: list[list[str]] = []
    if not isinstance(transitions, list):
        problems["transitions"] = "a list of [from, to] pairs"
    else:
        for index, pair in enumerate(transitions):
            if (
                not isinstance(pair, list | tuple)
                or len(pair) != 2
                or not all(isinstance(s, str) and s in known for s in pair)
            ):
                problems[f"transitions.{index}"] = "must be [from, to] with both among the states"
            else:
                pairs.append([pair[0], pair[1]])
    normal: dict[str, Any] = {"initial": initial, "states": states, "transitions": pairs}
    for key in LIST_KEYS[1:]:
        value = raw.get(key, [])
        if not isinstance(value, list) or not all(isinstance(s, str) and s in known for s in value):
            problems[key] = "a list of names among the states"
            value = []
        normal[key] = value
    steps = raw.get("steps", {})
    if not isinstance(steps, dict) or not all(
        isinstance(k, str) and k in known and isinstance(v, str) for k, v in steps.items()
    ):
        problems["steps"] = "an object mapping state names to step names"
    elif steps:
        normal["steps"] = steps
    unknown = set(raw) - {"initial", "states", "transitions", "steps", *LIST_KEYS}
    if unknown:
        problems[sorted(unknown)[0]] = "is not a definition field"
    if problems:
        raise InvalidDefinition("The workflow definition is not valid.", fields=problems)
    return normal


def definition_sha256(definition: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(definition)).hexdigest()


def transition_allowed(definition: dict[str, Any], source: str, target: str) -> bool:
    """Staying in a state is always allowed (progress within it); moves must be declared."""
    return source == target or [source, target] in definition["transitions"]


def workflows_visible(*, tenant: Tenant) -> QuerySet[WorkflowDefinition]:
    return WorkflowDefinition.objects.filter(Q(tenant=tenant) | Q(tenant__isnull=True))


_BAD_NAME = re.compile(r"[/\s\x00-\x1f\x7f]")


def _check_names(workflow_type: object, version: object) -> None:
    problems = {
        field: f"1-{limit} characters, without '/', whitespace or control characters"
        for field, value, limit in (("workflow_type", workflow_type, 100), ("version", version, 50))
        if not isinstance(value, str) or not 0 < len(value) <= limit or _BAD_NAME.search(value)
    }
    if problems:
        raise InvalidRequest("The workflow's type or version is not a valid name.", fields=problems)


def workflow_register(
    *,
    tenant: Tenant | None,
    workflow_type: str,
    version: str,
    definition: Any,
    has_code: bool = False,
) -> tuple[WorkflowDefinition, bool]:
    """Store a definition; return (row, created). Idempotent for an identical definition.

    Raises InvalidRequest (a type or version that is not a name), InvalidDefinition, or
    DefinitionConflict when a different definition already has this type and version (for
    this tenant or in code). Atomic.
    """
    _check_names(workflow_type, version)
    found = find_secret(definition, "definition")
    if found:  # stored and listed in the clear
        raise SecretInEnvelope(
            f"{found[0]} looks like a credential ({found[1]}); a definition names states and "
            "steps, never secrets.",
            fields={found[0]: found[1]},
        )
    normal = definition_normalize(definition)
    digest = definition_sha256(normal)
    scope = Q(tenant__isnull=True) | (Q(tenant=tenant) if tenant else Q())
    existing = WorkflowDefinition.objects.filter(
        scope, workflow_type=workflow_type, version=version
    ).first()
    if existing is not None:
        if existing.definition_sha256 != digest:
            raise DefinitionConflict(
                f"Workflow {workflow_type} version {version} is already registered with a "
                "different definition; register a new version instead."
            )
        return existing, False
    try:
        with transaction.atomic():
            row = WorkflowDefinition.objects.create(
                tenant=tenant,
                workflow_type=workflow_type,
                version=version,
                definition=normal,
                definition_sha256=digest,
                has_code=has_code,
            )
    except IntegrityError:
        # A concurrent registration won; answer as if it had come first.
        return workflow_register(
            tenant=tenant,
            workflow_type=workflow_type,
            version=version,
            definition=definition,
            has_code=has_code,
        )
    return row, True


def workflow_resolve(
    *, tenant: Tenant, workflow_type: str, version: str | None = None
) -> WorkflowDefinition:
    """The named version, or the newest one registered. Raises UnknownWorkflow."""
    rows = workflows_visible(tenant=tenant).filter(workflow_type=workflow_type)
    row = rows.filter(version=version).first() if version else rows.order_by("-created_at").first()
    if row is None:
        named = f"{workflow_type} version {version}" if version else workflow_type
        raise UnknownWorkflow(f"No workflow {named} is registered.")
    return row
