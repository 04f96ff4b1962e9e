"""The approval invariant, held against a run's chain.

A run's history passes an approval state only through a checkpoint that consumes a granted
approval bound to the checkpoint it leaves (so to that run version), to an artifact its
evidence names and to the action the approval state declares. States past an approval state
are the ones a run reaches only through it (``states_behind``). A run may end in a terminal
state past it without one (a rejection ends there); it is then not past it: nothing goes on
from an end.

``approval_passage`` walks a chain and says, for its head, which approval states the run is
legitimately past (and under which approval), and every checkpoint that entered the stretch
past one without its approval. ``run_verify`` reports those problems; an operator action
that would take the run on (resume, a forward retry) and every effect past an approval state
(``approval_effect_refusal``) ask the same walk first, so a chain written before the rule
held (or rows written by hand) is caught there too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from cairn.errors import IntegrityFailure
from checkpoints.approvals_port import ConsumedApproval, approvals_port
from checkpoints.models import Checkpoint, Run, RunStatus, WorkflowDefinition
from checkpoints.services.reads import checkpoint_envelope
from checkpoints.services.workflows import approval_action, gate_of, states_behind


@dataclass(frozen=True)
class ChainLink:
    """One checkpoint as the walk reads it: its clear position and hashes, and the artifacts
    its evidence names (sha256 → name; None when it was not read)."""

    sequence: int
    state: str
    sha256: str
    parent_sha256: str
    artifacts: dict[str, str] | None = None


@dataclass(frozen=True)
class Passage:
    """The walk's answer. ``passed``: the approval states the head is past, each with the
    approval it passed under, and the link that crossed it; ``problems``: a sentence per
    checkpoint that entered the stretch past an approval state without one."""

    passed: dict[str, tuple[ConsumedApproval, ChainLink]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def artifact_names(envelope: dict[str, Any]) -> dict[str, str]:
    refs = (envelope.get("evidence") or {}).get("artifacts") or []
    return {str(ref.get("sha256")): str(ref.get("name") or "") for ref in refs}


def _use_for(
    link: ChainLink,
    previous: ChainLink | None,
    gate: str,
    action: str,
    consumed: Sequence[ConsumedApproval],
) -> ConsumedApproval | None:
    """The consumed approval that lets ``link`` enter the stretch past ``gate``: bound to
    the checkpoint it left, which was at ``gate``. Across a gap retention left (compacted
    checkpoints), one bound to a checkpoint in the gap counts."""
    adjacent = previous is not None and previous.sequence == link.sequence - 1
    if adjacent and previous.state != gate:
        return None
    for use in consumed:
        if use.action != action:
            continue
        if (use.checkpoint_sequence, use.checkpoint_sha256) == (
            link.sequence - 1,
            link.parent_sha256,
        ):
            if link.artifacts is None or use.artifact_sha256 in link.artifacts:
                return use
        elif (
            not adjacent
            and previous is not None
            and previous.sequence <= use.checkpoint_sequence < link.sequence
        ):
            return use
    return None


def approval_passage(
    *,
    definition: dict[str, Any],
    links: Iterable[ChainLink],
    consumed: Sequence[ConsumedApproval],
    ended_well: bool = False,
) -> Passage:
    """Walk ``links`` (a run's chain, oldest first; gaps allowed) against the definition's
    approval states and the approvals the run ``consumed``. ``ended_well``: the run
    succeeded, so a terminal head past an approval state needs that approval too. Reads
    nothing."""
    behind = states_behind(definition)
    passage = Passage()
    if not behind:
        return passage
    terminal = set(definition.get("terminal") or ())
    passed, problems = passage.passed, passage.problems
    refused: set[str] = set()
    previous: ChainLink | None = None
    links = list(links)
    for index, link in enumerate(links):
        head = index == len(links) - 1
        for gate, stretch in behind.items():
            if link.state not in stretch:
                passed.pop(gate, None)
                refused.discard(gate)
                continue
            if gate in passed or gate in refused:
                continue
            action = approval_action(definition, gate)
            use = _use_for(link, previous, gate, action, consumed)
            if use is not None:
                passed[gate] = (use, link)
                continue
            if link.state in terminal and not (head and ended_well):
                continue  # the run ended here without going on (a rejection)
            refused.add(gate)
            problems.append(
                f"checkpoint {link.sequence} enters '{link.state}', past the approval state "
                f"'{gate}', without a consumed approval of '{action}' bound to checkpoint "
                f"{link.sequence - 1} for an artifact it names"
            )
        if link.state in terminal:
            passed.clear()  # an end: going on from it needs a new approval
        previous = link
    return passage


def run_approval_passage(run: Run) -> Passage:
    """``approval_passage`` for a run as it is stored: its chain's clear columns, the
    approvals it consumed, and the evidence of each checkpoint that entered a stretch past
    an approval state (decrypted). Reads nothing when its workflow has no approval state."""
    definition = run.workflow.definition
    behind = states_behind(definition)
    if not behind:
        return Passage()
    rows = list(
        Checkpoint.objects.filter(run_id=run.pk)
        .order_by("sequence")
        .values_list("id", "sequence", "state", "sha256", "parent_sha256")
    )
    terminal = set(definition.get("terminal") or ())
    links: list[ChainLink] = []
    previous_state: str | None = None
    for pk, sequence, state, sha256, parent_sha256 in rows:
        # Only a checkpoint that enters a stretch (from outside it, or from an end) may
        # cross an approval state: only its evidence is read.
        entering = any(
            state in stretch and (previous_state not in stretch or previous_state in terminal)
            for stretch in behind.values()
        )
        artifacts = None
        if entering:
            envelope = checkpoint_envelope(Checkpoint.objects.get(pk=pk))
            artifacts = artifact_names(envelope)
        links.append(ChainLink(sequence, state, sha256, parent_sha256, artifacts))
        previous_state = state
    return approval_passage(
        definition=definition,
        links=links,
        consumed=approvals_port().approvals_consumed(run_id=run.pk),
        ended_well=run.status == RunStatus.SUCCEEDED,
    )


def gate_not_passed(definition: dict[str, Any], passage: Passage, target: str) -> str | None:
    """The approval state ``target`` lies past that the run is not past at its head (so no
    operator action may take it to ``target``), or None."""
    for gate, stretch in states_behind(definition).items():
        if target in stretch and gate not in passage.passed:
            return gate
    return None


def approval_effect_refusal(run: Run, *, action: str) -> str:
    """Why an effect ``action`` may not be performed at the run's state now, or "". At a
    state past an approval state an effect needs the run to be legitimately past it (its
    chain consumed the approval), of exactly this action, and the artifact under review
    still the approved one. Reads nothing at a state past no approval state."""
    definition = run.workflow.definition
    gate = gate_of(definition, run.state)
    if gate is None:
        return ""
    passage = run_approval_passage(run)
    if gate not in passage.passed:
        return (
            f"The run is at '{run.state}', past the approval state '{gate}', but its history "
            f"passed '{gate}' without a consumed approval; no effect is performed past it."
        )
    use, crossing = passage.passed[gate]
    if use.action != action:
        return (
            f"The approval the run passed '{gate}' under is for '{use.action}'; it does not "
            f"allow '{action}'. Nothing was performed."
        )
    name = (crossing.artifacts or {}).get(use.artifact_sha256)
    head = Checkpoint.objects.filter(pk=run.latest_checkpoint_id).first()
    now = artifact_names(checkpoint_envelope(head)) if head is not None else {}
    swapped = sorted(
        sha for sha, named in now.items() if named == name and sha != use.artifact_sha256
    )
    if use.artifact_sha256 not in now or swapped:
        return (
            f"The artifact approved at '{gate}' (sha256 {use.artifact_sha256}) is no longer "
            f"the one the run's evidence names"
            + (f" as '{name}' (now {swapped[0]})" if swapped else "")
            + "; nothing was performed. Ask for an approval of the artifact as it is now."
        )
    return ""


def runs_approval_violations(*, tenant_slug: str | None = None) -> Iterator[tuple[Run, list[str]]]:
    """Every stored run (of one tenant, or all) whose chain breaks the approval invariant,
    with its problems, oldest run first: the audit a deployment runs over its history
    (``manage.py approvals_audit``). Reads only; only runs of workflows with an approval
    state are walked."""
    gated = [
        pk
        for pk, definition in WorkflowDefinition.objects.values_list("pk", "definition")
        if (definition or {}).get("approval_states")
    ]
    runs = Run.objects.filter(workflow_id__in=gated).select_related("workflow", "tenant")
    if tenant_slug:
        runs = runs.filter(tenant__slug=tenant_slug)
    for run in runs.order_by("created_at", "id").iterator(chunk_size=200):
        try:
            problems = run_approval_passage(run).problems
        except IntegrityFailure as exc:
            problems = [f"the chain cannot be read: {exc.detail}"]
        if problems:
            yield run, problems
