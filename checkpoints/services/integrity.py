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

from typing import Any

from django.db.models import Exists, OuterRef, Q

from cairn.errors import IntegrityFailure, InvalidEnvelope
from checkpoints import envelope as env
from checkpoints.models import Checkpoint, Run
from checkpoints.services import commit_sql
from checkpoints.services.reads import checkpoint_envelope


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
