"""The indexed columns of a run and its checkpoints against their sealed envelopes.

``state``, ``step`` and ``sequence`` are stored twice: in clear, in indexed columns the
lists and filters read, and inside the sealed (authenticated) envelope. Only the envelope
is protected: an ``UPDATE`` of a column (SQLite, or PostgreSQL with the trigger disabled)
changes what lists show and what the next commit starts from, without breaking a hash. So
every reader that decides or shows a position compares the two, and a mismatch is an
integrity failure: ``run_verify`` and the worker's restore report it, the history reads
refuse it (``IntegrityFailure``, 409), and an externally driven commit is refused before
anything is written (``run_head_verify``)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from cairn.errors import IntegrityFailure, InvalidEnvelope
from checkpoints import envelope as env
from checkpoints.models import Checkpoint, Run
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
    state, step, sequence and head id (hashes: ``head_hash_problem``). The status is not
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


def head_hash_problem(run: Run, head: Checkpoint, envelope: dict[str, Any]) -> str | None:
    unhashable = envelope_value_problem(head, envelope)
    if unhashable:
        return unhashable
    if env.sha256_of(envelope) != head.sha256:
        return f"checkpoint {head.sequence} does not match its sha256 (tampered)"
    if head.sha256 != run.latest_checkpoint_sha256:
        return "the run's latest hash is not its latest checkpoint's hash"
    return None


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


def run_head_verify(*, tenant: Tenant, run_id: UUID | str) -> Run:
    """Before an externally driven commit: the run's head as its columns name it must be
    the head its sealed envelope names, or the commit would start from a forged position.
    Reads only. Returns the run; raises NotFound or IntegrityFailure."""
    run = run_get(tenant=tenant, run_id=run_id)
    if not run.checkpoint_sequence:
        return run
    head = Checkpoint.objects.filter(run=run, pk=run.latest_checkpoint_id).first()
    if head is None:
        raise IntegrityFailure(
            f"Integrity failure: the run's latest checkpoint {run.checkpoint_sequence} "
            "is missing; no checkpoint can follow it."
        )
    envelope = checkpoint_envelope(head)
    problem = (
        head_hash_problem(run, head, envelope)
        or checkpoint_columns_problem(head, envelope)
        or run_head_problem(run, envelope)
    )
    if problem:
        raise IntegrityFailure(f"Integrity failure: {problem}; no checkpoint can follow it.")
    return run
