"""Workflows declared in Python: states, legal transitions and the step function of each.

A ``Workflow`` produces exactly the declarative definition the API stores
(``definition_normalize``), plus the code the workers run. Declaring one touches no
database: ``workflows_sync`` (the ``sync_workflows`` command) stores the definitions, and a
run of a code workflow that is not stored yet registers it on demand.

    wf = Workflow("research", version="1")

    @wf.step("collect_sources", next="extract_claims")
    def collect_sources(ctx): ...

    wf.approval("request_approval", next="publish", rejected="rejected", artifact="draft")

    @wf.effect("publish", next="done", action="publish")
    def publish(ctx): ...

    wf.terminal("done", "rejected")
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from checkpoints.services.workflows import (
    definition_normalize,
    gate_of,
    states_behind,
    states_reachable,
)

StepFunction = Callable[..., Any]


# Every workflow declared in this process, by (type, version). The registry
# (``runtime.registry``) reads it after importing CAIRN_WORKFLOW_MODULES, and stores the
# definitions in the database; declaring writes nothing.
declared: dict[tuple[str, str], Workflow] = {}


def registry_add(workflow: Workflow) -> None:
    # A module imported twice (e.g. under two names) redeclares the same workflow: the
    # newer declaration wins, which is what a reload means.
    declared[(workflow.workflow_type, workflow.version)] = workflow


def registry_remove(workflow_type: str, version: str) -> None:
    declared.pop((workflow_type, version), None)


class WorkflowDeclarationError(Exception):
    """The Python declaration of a workflow is inconsistent (raised at import time)."""


@dataclass(frozen=True)
class Next:
    """What a step returns when it chooses among several next states."""

    state: str
    output: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepSpec:
    state: str
    name: str
    fn: StepFunction
    next: tuple[str, ...]
    effect_action: str | None = None  # set for effect states (side effects)
    # Secret references (env:NAME, file:NAME) the step needs; every restore resolves them.
    secrets: tuple[str, ...] = ()


@dataclass(frozen=True)
class ApprovalSpec:
    """A state where the run waits for a person. ``artifact`` names the evidence artifact
    under review; ``next`` follows an approval, ``rejected`` a rejection. ``action`` is the
    action an approval allows (None: the one the effect state after it performs); the
    workflow's definition declares it, and the gate asks for exactly that action."""

    state: str
    next: str
    rejected: str | None
    artifact: str | None
    action: str | None
    # Who may decide ({"role": …} or {"group": …}; None: anyone who may review the run) and
    # how many distinct reviewers must approve.
    reviewers: dict[str, str] | None = None
    quorum: int = 1
    # After an expiry with no decision, raised again to each of ``to`` in turn; then "fail"
    # or "hold" (``{"to": [{"group": "managers"}], "then": "hold"}``).
    escalation: dict | None = None


def _as_tuple(value: str | Iterable[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value)


class Workflow:
    """A workflow type and version with its states and steps. Registers itself (in memory
    only) in ``runtime.registry`` unless ``register=False``."""

    def __init__(
        self,
        workflow_type: str,
        *,
        version: str,
        code_version: str | None = None,
        compatible_code_versions: Iterable[str] | None = None,
        prompt_version: str | None = None,
        policy_version: str | None = None,
        register: bool = True,
    ) -> None:
        self.workflow_type = workflow_type
        self.version = version
        # Recorded in every envelope; bump it when step code changes behaviour.
        self.code_version = code_version or version
        # Recorded in every envelope's inputs (with the model): prompts and policy live in
        # the code unless the workflow names their versions.
        self.prompt_version = prompt_version or self.code_version
        self.policy_version = policy_version or self.code_version
        # The code versions whose checkpoints this code may continue (None: any). A restore
        # of a checkpoint written by another code version pauses the run for review.
        self.compatible_code_versions: frozenset[str] | None = (
            None
            if compatible_code_versions is None
            else frozenset(compatible_code_versions) | {self.code_version}
        )
        self.steps: dict[str, StepSpec] = {}
        self.approvals: dict[str, ApprovalSpec] = {}
        self.terminals: list[str] = []
        self._order: list[str] = []
        if register:
            registry_add(self)

    def __repr__(self) -> str:
        return f"<Workflow {self.workflow_type}@{self.version}>"

    # --- declaration ----------------------------------------------------------------------
    def _claim(self, state: str) -> None:
        if state in self._order:
            raise WorkflowDeclarationError(f"{self}: state '{state}' is declared twice.")
        self._order.append(state)

    def add_step(
        self,
        state: str,
        fn: StepFunction,
        *,
        next: str | Iterable[str],  # noqa: A002
        name: str | None = None,
        effect_action: str | None = None,
        secrets: Iterable[str] = (),
    ) -> StepSpec:
        """Declare ``state`` as running ``fn``; ``next`` lists the states it may move to."""
        targets = _as_tuple(next)
        if not targets:
            raise WorkflowDeclarationError(f"{self}: step '{state}' needs at least one next state.")
        self._claim(state)
        refs = tuple(secrets)
        bad = [ref for ref in refs if not isinstance(ref, str) or ":" not in ref]
        if bad:
            raise WorkflowDeclarationError(
                f"{self}: step '{state}' declares secrets that are not references "
                "(env:NAME or file:NAME)."
            )
        spec = StepSpec(
            state=state,
            name=name or state,
            fn=fn,
            next=targets,
            effect_action=effect_action,
            secrets=refs,
        )
        self.steps[state] = spec
        return spec

    def step(
        self,
        state: str,
        *,
        next: str | Iterable[str],
        name: str | None = None,  # noqa: A002
        secrets: Iterable[str] = (),
    ) -> Callable[[StepFunction], StepFunction]:
        def decorate(fn: StepFunction) -> StepFunction:
            self.add_step(state, fn, next=next, name=name, secrets=secrets)
            return fn

        return decorate

    def effect(
        self,
        state: str,
        *,
        next: str | Iterable[str],  # noqa: A002
        action: str,
        name: str | None = None,
        secrets: Iterable[str] = (),
    ) -> Callable[[StepFunction], StepFunction]:
        """A step that performs an external side effect (an effect state)."""

        def decorate(fn: StepFunction) -> StepFunction:
            self.add_step(state, fn, next=next, name=name, effect_action=action, secrets=secrets)
            return fn

        return decorate

    def approval(
        self,
        state: str,
        *,
        next: str,  # noqa: A002
        rejected: str | None = None,
        artifact: str | None = None,
        action: str | None = None,
        reviewers: dict[str, str] | None = None,
        quorum: int = 1,
        escalation: dict | None = None,
    ) -> ApprovalSpec:
        """A state where the run waits (status ``waiting_approval``) until a person decides:
        one of ``reviewers`` (``{"role": "admin"}``, ``{"group": "legal"}``; None: anyone who
        may review the run), ``quorum`` of them distinct, any rejection rejecting."""
        self._claim(state)
        spec = ApprovalSpec(
            state=state,
            next=next,
            rejected=rejected,
            artifact=artifact,
            action=action,
            reviewers=dict(reviewers) if reviewers else None,
            quorum=quorum,
            escalation=dict(escalation) if escalation else None,
        )
        self.approvals[state] = spec
        return spec

    def terminal(self, *states: str) -> None:
        for state in states:
            self._claim(state)
            self.terminals.append(state)

    @property
    def secret_references(self) -> list[tuple[str, str]]:
        """(step name, reference) for every secret reference a step declares."""
        return [(spec.name, ref) for spec in self.steps.values() for ref in spec.secrets]

    @property
    def states(self) -> list[str]:
        """Every declared state, in declaration order (the first is the initial state)."""
        return list(self._order)

    # --- the declarative form ---------------------------------------------------------------
    def definition(self) -> dict[str, Any]:
        """The normalized declarative definition (what the API stores and checks commits
        against). Raises WorkflowDeclarationError when the declaration is inconsistent."""
        if not self._order:
            raise WorkflowDeclarationError(f"{self} declares no states.")
        transitions: list[list[str]] = []
        for state in self._order:
            if state in self.steps:
                targets: tuple[str, ...] = self.steps[state].next
            elif state in self.approvals:
                spec = self.approvals[state]
                targets = (spec.next,) + ((spec.rejected,) if spec.rejected else ())
            else:
                targets = ()
            for target in targets:
                if target not in self._order:
                    raise WorkflowDeclarationError(
                        f"{self}: '{state}' leads to '{target}', which is not declared."
                    )
                if [state, target] not in transitions:
                    transitions.append([state, target])
        raw = {
            "initial": self._order[0],
            "states": list(self._order),
            "transitions": transitions,
            "terminal": list(self.terminals),
            "approval_states": list(self.approvals),
            "effect_states": [s for s, spec in self.steps.items() if spec.effect_action],
            "steps": {state: spec.name for state, spec in self.steps.items()},
        }
        if self.approvals:
            raw["approvals"] = {
                state: {
                    "action": self._approval_action(raw, spec),
                    **({"reviewers": spec.reviewers} if spec.reviewers else {}),
                    **({"quorum": spec.quorum} if spec.quorum != 1 else {}),
                    **({"escalation": spec.escalation} if spec.escalation else {}),
                }
                for state, spec in self.approvals.items()
            }
        return definition_normalize(raw)

    def _approval_action(self, raw: dict[str, Any], spec: ApprovalSpec) -> str:
        """The action an approval at ``spec.state`` allows: the one declared, else the one
        its effect state performs (the first a run reaches from it). Every effect state past
        it (reached only through it) must perform exactly that action: an approval of
        ``publish`` never lets a step perform anything else."""
        ahead = states_reachable(raw, spec.state, stop_at_approvals=True, leave=spec.state)
        first = [
            self.steps[s]
            for s in self._order
            if s in ahead and s in self.steps and self.steps[s].effect_action
        ]
        action = spec.action or (first[0].effect_action if first else spec.next)
        past = states_behind(raw).get(spec.state, frozenset())
        other = [
            self.steps[s]
            for s in self._order
            if s in past
            and s in self.steps
            and self.steps[s].effect_action not in (None, action)
            and gate_of(raw, s) == spec.state
        ]
        if other:
            raise WorkflowDeclarationError(
                f"{self}: an approval at '{spec.state}' allows '{action}', but the effect "
                f"state '{other[0].state}' past it performs '{other[0].effect_action}'."
            )
        return action
