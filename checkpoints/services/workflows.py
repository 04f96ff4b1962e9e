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
from tenants.prepared import (
    POSTGRES,
    SQLITE,
    Dialect,
    model_columns,
    model_from_row,
    statement_fetchone,
)
from tenants.reviewer_groups import GROUP_NAME

LIST_KEYS = ("states", "terminal", "approval_states", "effect_states")
# What a definition declares for each approval state (``approvals``): the action an approval
# there allows, who may decide (``reviewers``: a role or a reviewer group of the tenant) and
# how many distinct reviewers must approve (``quorum``). What else an approval state
# declares belongs here too.
APPROVAL_FIELDS = ("action", "reviewers", "quorum", "escalation")
# After the last escalation level expires with no decision: the run fails, or it is held.
ESCALATION_ENDINGS = ("fail", "hold")
MAX_ESCALATION_LEVELS = 5
REVIEWER_ROLES = ("reviewer", "admin")
MAX_QUORUM = 20


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
    if normal["approval_states"]:
        normal["approvals"] = _approvals_normalize(raw.get("approvals", {}), normal, problems)
    elif raw.get("approvals"):
        problems["approvals"] = "declares approval states the definition does not list"
    steps = raw.get("steps", {})
    if not isinstance(steps, dict) or not all(
        isinstance(k, str) and k in known and isinstance(v, str) for k, v in steps.items()
    ):
        problems["steps"] = "an object mapping state names to step names"
    elif steps:
        normal["steps"] = steps
    unknown = set(raw) - {"initial", "states", "transitions", "steps", "approvals", *LIST_KEYS}
    if unknown:
        problems[sorted(unknown)[0]] = "is not a definition field"
    if problems:
        raise InvalidDefinition("The workflow definition is not valid.", fields=problems)
    return normal


def _approvals_normalize(
    raw: Any, normal: dict[str, Any], problems: dict[str, str]
) -> dict[str, dict[str, str]]:
    """Every approval state's declaration, in ``approval_states`` order; an approval state
    that declares no action allows the one its effect state performs
    (``approval_action_default``)."""
    if not isinstance(raw, dict):
        problems["approvals"] = 'an object mapping each approval state to {"action": …}'
        raw = {}
    stray = sorted(set(raw) - set(normal["approval_states"]))
    if stray:
        problems[f"approvals.{stray[0]}"] = "is not one of the approval_states"
    declared: dict[str, dict[str, str]] = {}
    # A default is derived from the graph, so only from a graph that is valid.
    graph_valid = not problems
    for state in normal["approval_states"]:
        entry = raw.get(state, {})
        if not isinstance(entry, dict) or set(entry) - set(APPROVAL_FIELDS):
            problems[f"approvals.{state}"] = f"an object with the field(s) {APPROVAL_FIELDS}"
            entry = {}
        action = entry.get("action")
        if action is None and graph_valid:
            action = approval_action_default(normal, state)
        if not isinstance(action, str) or not 0 < len(action.strip()) <= 100:
            problems[f"approvals.{state}.action"] = "1-100 characters, e.g. publish"
            continue
        declared[state] = {"action": action.strip()}
        if "reviewers" in entry:
            reviewers = _reviewers_normalize(entry["reviewers"])
            if reviewers is None:
                problems[f"approvals.{state}.reviewers"] = (
                    f'{{"role": one of {list(REVIEWER_ROLES)}}} or {{"group": a group name '
                    "(lowercase letters, digits, - and _)}"
                )
            else:
                declared[state]["reviewers"] = reviewers
        if "quorum" in entry:
            quorum = entry["quorum"]
            if (
                not isinstance(quorum, int)
                or isinstance(quorum, bool)
                or not 1 <= quorum <= MAX_QUORUM
            ):
                problems[f"approvals.{state}.quorum"] = f"a whole number from 1 to {MAX_QUORUM}"
            else:
                declared[state]["quorum"] = quorum
        if "escalation" in entry:
            escalation = _escalation_normalize(entry["escalation"])
            if escalation is None:
                problems[f"approvals.{state}.escalation"] = (
                    '{"to": [1-5 reviewers, each {"role": …} or {"group": …}], "then": '
                    f"one of {list(ESCALATION_ENDINGS)}}}"
                )
            else:
                declared[state]["escalation"] = escalation
    return declared


def _escalation_normalize(raw: Any) -> dict[str, Any] | None:
    """``{"to": [reviewers, …], "then": "fail"|"hold"}`` (``then`` defaults to fail)."""
    if not isinstance(raw, dict) or set(raw) - {"to", "then"}:
        return None
    levels = raw.get("to")
    if not isinstance(levels, list) or not 1 <= len(levels) <= MAX_ESCALATION_LEVELS:
        return None
    normal = [_reviewers_normalize(level) for level in levels]
    then = raw.get("then", "fail")
    if any(level is None for level in normal) or then not in ESCALATION_ENDINGS:
        return None
    return {"to": normal, "then": then}


def _reviewers_normalize(raw: Any) -> dict[str, str] | None:
    """``{"role": …}`` or ``{"group": …}``, exactly one of them; None when it is neither."""
    if not isinstance(raw, dict) or len(raw) != 1:
        return None
    ((kind, value),) = raw.items()
    if kind == "role" and value in REVIEWER_ROLES:
        return {"role": value}
    if kind == "group" and isinstance(value, str) and GROUP_NAME.fullmatch(value):
        return {"group": value}
    return None


def approval_action_default(definition: dict[str, Any], state: str) -> str:
    """The action an approval state allows when its definition names none: the one its
    effect state performs (the first effect state a run reaches from it before any other
    approval state; a declarative effect state performs the action named like it), else
    the state an approval leads to."""
    effects = set(definition.get("effect_states") or ())
    ahead = states_reachable(definition, state, stop_at_approvals=True, leave=state)
    found = [s for s in definition["states"] if s in effects and s in ahead and s != state]
    if found:
        return found[0]
    successors = [t for s, t in definition["transitions"] if s == state and t != state]
    return successors[0] if successors else state


def approval_action(definition: dict[str, Any], state: str) -> str:
    """The action an approval at ``state`` allows, as the definition declares it."""
    declared = (definition.get("approvals") or {}).get(state) or {}
    return declared.get("action") or approval_action_default(definition, state)


def approval_reviewers(definition: dict[str, Any], state: str) -> tuple[dict[str, str], int]:
    """Who may decide at ``state`` (``{}``: anyone who may review the run; ``{"role": …}``;
    ``{"group": …}``) and the quorum of distinct reviewers, as the definition declares them."""
    declared = (definition.get("approvals") or {}).get(state) or {}
    return dict(declared.get("reviewers") or {}), int(declared.get("quorum") or 1)


def approval_escalation(definition: dict[str, Any], state: str) -> dict[str, Any] | None:
    """The escalation ``state`` declares (``{"to": [reviewers, …], "then": …}``), or None."""
    declared = (definition.get("approvals") or {}).get(state) or {}
    return declared.get("escalation")


def _successors(definition: dict[str, Any]) -> dict[str, list[str]]:
    graph: dict[str, list[str]] = {s: [] for s in definition.get("states") or ()}
    for source, target in definition.get("transitions") or ():
        graph.setdefault(source, []).append(target)
    return graph


def states_reachable(
    definition: dict[str, Any],
    start: str,
    *,
    stop_at_approvals: bool = False,
    leave: str | None = None,
    avoid: str | None = None,
) -> set[str]:
    """The states reachable from ``start`` (itself included) along declared transitions.
    With ``stop_at_approvals`` the walk enters approval states but never leaves one (except
    ``leave``): what a run at ``start`` reaches without anyone's approval. ``avoid`` is a
    state the walk never enters."""
    graph = _successors(definition)
    gates = set(definition.get("approval_states") or ()) - {leave}
    seen, todo = {start}, [start]
    while todo:
        state = todo.pop()
        if stop_at_approvals and state in gates:
            continue
        for target in graph.get(state, ()):
            if target not in seen and target != avoid:
                seen.add(target)
                todo.append(target)
    return seen


def states_behind(definition: dict[str, Any]) -> dict[str, frozenset[str]]:
    """For each approval state, the states a run reaches only through it (from the
    workflow's initial state, every path to them passes it): where a run is past it."""
    initial = definition.get("initial") or (definition.get("states") or [""])[0]
    everywhere = states_reachable(definition, initial)
    return {
        gate: frozenset(everywhere - states_reachable(definition, initial, avoid=gate) - {gate})
        for gate in definition.get("approval_states") or ()
    }


def gate_of(definition: dict[str, Any], state: str) -> str | None:
    """The nearest approval state ``state`` lies past (the last one a run passed to get
    there), or None when it lies past none."""
    behind = states_behind(definition)
    around = [gate for gate, stretch in behind.items() if state in stretch]
    for gate in around:
        if all(gate == other or gate in behind[other] for other in around):
            return gate
    return around[-1] if around else None


def gated_states(definition: dict[str, Any]) -> set[str]:
    """States past an approval state: a run reaches them only through one."""
    return set().union(*states_behind(definition).values())


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


def _resolve_statement(d: Dialect, *, named: bool) -> str:
    """The definition a run starts on: the named version (ordered as the model is), or the
    newest one registered; the tenant's own or one registered in code."""
    version = f"AND w.version = {d.p('version', 'text')}" if named else ""
    order = "w.workflow_type, w.version, w.id" if named else "w.created_at DESC"
    return (
        f"SELECT {model_columns(WorkflowDefinition, 'w')} "
        f"FROM {WorkflowDefinition._meta.db_table} w "
        f"WHERE (w.tenant_id = {d.p('tenant_id', 'uuid')} OR w.tenant_id IS NULL) "
        f"AND w.workflow_type = {d.p('workflow_type', 'text')} {version} "
        f"ORDER BY {order} LIMIT 1"
    )


# Every run's start resolves its workflow: one prepared statement (``tenants.prepared``).
_RESOLVE_NAMED, _RESOLVE_NEWEST = (
    (_resolve_statement(POSTGRES, named=named), _resolve_statement(SQLITE, named=named))
    for named in (True, False)
)


def workflow_resolve(
    *, tenant: Tenant, workflow_type: str, version: str | None = None
) -> WorkflowDefinition:
    """The named version, or the newest one registered. Raises UnknownWorkflow."""
    params = {"tenant_id": tenant.pk, "workflow_type": workflow_type, "version": version}
    found = statement_fetchone(*(_RESOLVE_NAMED if version else _RESOLVE_NEWEST), params)
    row = None if found is None else model_from_row(WorkflowDefinition, found)
    if row is None:
        named = f"{workflow_type} version {version}" if version else workflow_type
        raise UnknownWorkflow(f"No workflow {named} is registered.")
    return row
