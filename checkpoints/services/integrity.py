"""The indexed columns of a run and its checkpoints against their sealed envelopes.

``state``, ``step`` and ``sequence`` are stored twice: in clear, in indexed columns the
lists and filters read, and inside the sealed (authenticated) envelope. Only the envelope
is protected: an ``UPDATE`` of a column (SQLite, or PostgreSQL with the trigger disabled)
changes what lists show and what the next commit starts from, without breaking a hash. So
every reader that decides or shows a position compares the two, and a mismatch is an
integrity failure: ``run_verify`` and the worker's restore report it, the history reads
refuse it (``IntegrityFailure``, 409). Every commit, whoever writes it, is refused by its
own statement when the run's row and its head checkpoint's row disagree
(``checkpoints.services.commit_sql``), without opening the envelope."""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from uuid import UUID

from django.db.models import Exists, OuterRef, Q

from cairn.errors import IntegrityFailure, InvalidEnvelope
from checkpoints import envelope as env
from checkpoints.approvals_port import approvals_port
from checkpoints.models import Artifact, Checkpoint, Run, RunStatus
from checkpoints.services import commit_sql
from checkpoints.services.approval_chain import ChainLink, approval_passage, artifact_names
from checkpoints.services.artifacts import artifact_content
from checkpoints.services.compaction import compaction_index
from checkpoints.services.reads import checkpoint_envelope, run_get
from tenants.models import Tenant


def sealed_position(envelope: dict[str, Any]) -> tuple[Any, Any]:
    """(state, step) as the envelope says, at any schema version (schema 1 kept them flat)."""
    position = envelope.get("position")
    if isinstance(position, dict):
        return position.get("state"), position.get("step", "")
    return envelope.get("state"), envelope.get("step", "")


def checkpoint_columns_problem(checkpoint: Checkpoint, envelope: dict[str, Any]) -> str | None:
    """A sentence when the checkpoint row's state, step or sequence is not its envelope's."""
    state, step = sealed_position(envelope)
    sequence = (envelope.get("identity") or {}).get("sequence")
    differ = [
        f"{column} '{stored}' where its sealed envelope says '{sealed}'"
        for column, stored, sealed in (
            ("state", checkpoint.state, state),
            ("step", checkpoint.step, step),
            ("sequence", checkpoint.sequence, sequence),
        )
        if stored != sealed
    ]
    if not differ:
        return None
    return (
        f"checkpoint {checkpoint.sequence}: its row says {' and '.join(differ)}; "
        "the row was altered after it was written"
    )


def run_head_problem(run: Run, envelope: dict[str, Any]) -> str | None:
    """A sentence when the run's indexed position is not its latest checkpoint's envelope:
    state, step, sequence and head id. The status is not
    sealed (a writer may name it with any state), so it cannot be compared."""
    state, step = sealed_position(envelope)
    identity = envelope.get("identity") or {}
    differ = [
        f"{column} '{stored}' where its latest sealed checkpoint says '{sealed}'"
        for column, stored, sealed in (
            ("state", run.state, state),
            ("step", run.step, step),
            ("sequence", run.checkpoint_sequence, identity.get("sequence")),
            ("latest checkpoint", str(run.latest_checkpoint_id), identity.get("checkpoint_id")),
        )
        if stored != sealed
    ]
    if not differ:
        return None
    return f"the run's row says {' and '.join(differ)}; the row was altered after it was written"


def checkpoint_position_verify(checkpoint: Checkpoint, envelope: dict[str, Any]) -> None:
    """Raises IntegrityFailure when the row's position is not its envelope's: what a fork
    starts from must be the sealed position. A value the envelope cannot be hashed with again
    is no reason to refuse a fork, whose patch is the way to replace it."""
    problem = checkpoint_columns_problem(checkpoint, envelope)
    if problem:
        raise IntegrityFailure(f"Integrity failure: {problem}.")


def checkpoint_columns_verify(checkpoint: Checkpoint, envelope: dict[str, Any]) -> None:
    """Raises IntegrityFailure when the row's position is not its envelope's, or the
    envelope holds a value it cannot be hashed with again (a whole number past 2^53,
    written before such values were refused at every write)."""
    problem = checkpoint_columns_problem(checkpoint, envelope) or envelope_value_problem(
        checkpoint, envelope
    )
    if problem:
        raise IntegrityFailure(f"Integrity failure: {problem}.")


def envelope_value_problem(checkpoint: Checkpoint, envelope: dict[str, Any]) -> str | None:
    """Why the stored envelope cannot be canonicalized again, or None."""
    try:
        env.canonical_json(envelope)
    except InvalidEnvelope:
        where = f"checkpoint {checkpoint.sequence}'s envelope"
        return (
            f"{env.json_problem(envelope, where=where)}; it was written before such values "
            "were refused and cannot be checked against its hash (fork the run from it with "
            "an inputs_patch that replaces the value)"
        )
    return None


def checkpoints_columns_verify(checkpoints: list[Checkpoint]) -> None:
    """The same for a page of history (decrypts each). Raises IntegrityFailure naming
    every altered checkpoint of the page."""
    problems = [
        problem
        for checkpoint in checkpoints
        if (problem := checkpoint_columns_problem(checkpoint, checkpoint_envelope(checkpoint)))
    ]
    if problems:
        raise IntegrityFailure(f"Integrity failure: {'; '.join(problems)}.")


def run_head_intact(run: Run) -> Q:
    """A filter on runs: the run's row still names ``run``'s head and agrees with that
    checkpoint's row (id, hash, sequence, state, step), the check a commit's statement
    makes (``commit_sql``), for the conditional update of an action that continues a run
    from its head (resume). The head is probed by its id (a primary-key lookup)."""
    if run.latest_checkpoint_id is None:
        return Q(latest_checkpoint_id__isnull=True, checkpoint_sequence=0)
    head = Checkpoint.objects.filter(
        pk=run.latest_checkpoint_id,
        run_id=OuterRef("pk"),
        sha256=OuterRef("latest_checkpoint_sha256"),
        sequence=OuterRef("checkpoint_sequence"),
        state=OuterRef("state"),
        step=OuterRef("step"),
    )
    return Q(latest_checkpoint_id=run.latest_checkpoint_id) & Q(Exists(head))


def run_head_refusal(run: Run) -> IntegrityFailure | None:
    """Why a write that ``run_head_intact`` held back was refused: IntegrityFailure naming
    the columns that disagree, or None when the head is intact (the run moved instead).
    One statement; called only after a refusal."""
    head = commit_sql.head_read(tenant_id=run.tenant_id, run_id=run.pk)
    if head is None or not head.integrity_problem:
        return None
    return IntegrityFailure(
        f"Integrity failure: {head.integrity_problem}; the run cannot continue from it. "
        "Nothing was done; cancel the run, or fork it from a checkpoint that verifies."
    )


def run_verify(*, tenant: Tenant, run_id: UUID | str) -> dict[str, Any]:
    """Re-check the hash chain, every referenced artifact and the approval invariant (each
    checkpoint that enters the stretch past an approval state consumed an approval of its
    declared action, bound to the checkpoint it left, for an artifact it names:
    ``approval_chain``). Reads only; never raises on damage: each problem is reported as a
    sentence naming the checkpoint. A gap that retention's compaction records explain, with
    hashes that link, is reported under ``compacted``, not a problem."""
    run = run_get(tenant=tenant, run_id=run_id)
    compactions = compaction_index(run)
    compacted: list[dict[str, Any]] = []
    problems: list[str] = []
    previous: Checkpoint | None = None
    checked_artifacts: set[str] = set()
    last_envelope: dict[str, Any] | None = None
    links: list[ChainLink] = []
    checkpoints = Checkpoint.objects.filter(run=run).order_by("sequence").iterator(chunk_size=500)
    count = 0
    for checkpoint in checkpoints:
        count += 1
        where = f"checkpoint {checkpoint.sequence}"
        after = (previous.sequence, previous.sha256) if previous is not None else (0, None)
        if checkpoint.sequence != after[0] + 1:
            gap_problems, ranges = compactions.bridge(
                after=after,
                sequence=checkpoint.sequence,
                parent_sha256=checkpoint.parent_sha256,
                where=where,
            )
            problems.extend(gap_problems)
            compacted.extend(ranges)
        elif previous is not None and checkpoint.parent_sha256 != previous.sha256:
            problems.append(
                f"{where} names parent hash {checkpoint.parent_sha256[:12]}, "
                f"but checkpoint {previous.sequence} hashes to {previous.sha256[:12]}"
            )
        link = ChainLink(
            checkpoint.sequence, checkpoint.state, checkpoint.sha256, checkpoint.parent_sha256
        )
        try:
            envelope = checkpoint_envelope(checkpoint)
        except IntegrityFailure as exc:
            problems.append(f"{where}: {exc.detail}")
            previous, last_envelope = checkpoint, None
            links.append(link)
            continue
        links.append(replace(link, artifacts=artifact_names(envelope)))
        try:
            digest = env.sha256_of(envelope)
        except InvalidEnvelope:
            # Written before such values were refused (a whole float past 2^53 stored as an
            # integer): it cannot be hashed again, so it is reported, never raised.
            unhashable = env.json_problem(envelope, where="its envelope")
            problems.append(f"{where}: {unhashable}, so it cannot be checked against its hash")
            digest = checkpoint.sha256
        if digest != checkpoint.sha256:
            problems.append(f"{where}: the stored envelope does not match its sha256 (tampered)")
        identity = envelope.get("identity", {})
        if identity.get("run_id") != str(run.id) or identity.get("sequence") != checkpoint.sequence:
            problems.append(f"{where}: the envelope's identity names another run or sequence")
        if identity.get("parent_sha256", "") != checkpoint.parent_sha256:
            problems.append(f"{where}: the envelope's parent hash differs from the stored one")
        # The row's clear position (what lists show, what commits start from) is the sealed one.
        columns = checkpoint_columns_problem(checkpoint, envelope)
        if columns:
            problems.append(columns)
        last_envelope = envelope
        for ref in (envelope.get("evidence") or {}).get("artifacts", []):
            key = f"{ref.get('id')}:{ref.get('sha256')}"
            if key in checked_artifacts:
                continue
            checked_artifacts.add(key)
            artifact = Artifact.objects.filter(tenant=tenant, pk=ref.get("id")).first()
            if artifact is None:
                problems.append(f"{where}: artifact {ref.get('id')} is missing")
            elif artifact.sha256 != ref.get("sha256"):
                problems.append(f"{where}: artifact {artifact.id} is stored with another sha256")
            else:
                try:
                    artifact_content(artifact)
                except IntegrityFailure as exc:
                    problems.append(f"{where}: {exc.detail}")
        previous = checkpoint
    last = (previous.sequence, previous.sha256) if previous is not None else (0, None)
    if run.checkpoint_sequence > last[0]:
        gap_problems, ranges = compactions.bridge(
            after=last,
            sequence=run.checkpoint_sequence + 1,
            parent_sha256=run.latest_checkpoint_sha256,
            where="the run's latest hash",
        )
        problems.extend(gap_problems)
        compacted.extend(ranges)
    elif previous is not None and previous.sha256 != run.latest_checkpoint_sha256:
        problems.append("the run's latest hash is not the last checkpoint's hash")
    if previous is not None and previous.sequence == run.checkpoint_sequence and last_envelope:
        head = run_head_problem(run, last_envelope)
        if head:
            problems.append(head)
    if run.workflow.definition.get("approval_states"):
        passage = approval_passage(
            definition=run.workflow.definition,
            links=links,
            consumed=approvals_port().approvals_consumed(run_id=run.pk),
            ended_well=run.status == RunStatus.SUCCEEDED,
        )
        problems.extend(passage.problems)
    result = {"ok": not problems, "checkpoints": count, "problems": problems}
    if compacted:
        result["compacted"] = compacted
    return result
