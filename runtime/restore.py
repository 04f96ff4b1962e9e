"""The restore procedure (docs/design.md, "Restore"), steps 2 to 6, for a run this worker has
leased (step 1). Step 7, running the next eligible step, is the executor's.

Each check either passes or names, in a sentence, why the run cannot go on: a problem of
integrity or compatibility pauses the run for review; an exhausted budget fails it. Nothing
here ever restarts a run from its beginning.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cairn.errors import IntegrityFailure
from cairn.secrets import SecretUnavailable, secret_resolve
from checkpoints import envelope as env
from checkpoints.crypto import MissingKeyError
from checkpoints.models import Artifact, Checkpoint, Run
from checkpoints.services.artifacts import artifact_content
from checkpoints.services.budgets import budget_exhausted
from checkpoints.services.integrity import checkpoint_columns_problem, run_head_problem
from checkpoints.services.reads import checkpoint_at, checkpoint_envelope

from . import hooks
from .lease import used_merge

if TYPE_CHECKING:
    from .definition import Workflow

log = logging.getLogger("cairn.runtime")


@dataclass
class Restored:
    checkpoint: Checkpoint
    envelope: dict[str, Any]  # at the current schema version
    used: dict[str, Any]  # usage high-water mark: the envelope's and the run's
    migrated_from: int | None = None


# The checks a full restore makes, in order (docs/design.md, "Restore"), as its trace
# event names them: a Halt names the one that stopped the run.
CHECKS = (
    "load",
    "integrity",
    "schema",
    "compatibility",
    "artifacts",
    "reconcile",
    "credentials",
    "policy",
)


@dataclass
class Halt:
    action: str  # "pause" or "fail"
    reason: str
    restored: Restored | None = field(default=None)
    check: str = ""  # which of CHECKS stopped the run


def _pause(reason: str, check: str) -> Halt:
    return Halt("pause", reason, check=check)


def _check_chain(run: Run, checkpoint: Checkpoint, stored: dict[str, Any]) -> str | None:
    where = f"checkpoint {checkpoint.sequence}"
    if env.sha256_of(stored) != checkpoint.sha256:
        return f"{where} does not match its sha256: it was altered after it was written"
    identity = stored.get("identity") or {}
    if identity.get("run_id") != str(run.pk):
        return f"{where} names run {identity.get('run_id')}, not this run"
    if identity.get("sequence") != checkpoint.sequence:
        return f"{where} says it is sequence {identity.get('sequence')}"
    if identity.get("parent_sha256", "") != checkpoint.parent_sha256:
        return f"{where}: the envelope's parent hash differs from the stored one"
    if checkpoint.sequence > 1:
        parent = (
            Checkpoint.objects.filter(run=run, sequence=checkpoint.sequence - 1)
            .only("pk", "sequence", "sha256")  # not its (large) sealed envelope
            .first()
        )
        if parent is None:
            return f"{where} has no predecessor: the history has a gap"
    elif checkpoint.parent_id is not None:  # a fork's first checkpoint
        parent = (
            Checkpoint.objects.filter(pk=checkpoint.parent_id)
            .only("pk", "sequence", "sha256")
            .first()
        )
        if parent is None:
            return f"{where} names a fork source checkpoint that no longer exists"
    else:
        return None if checkpoint.parent_sha256 == "" else f"{where} names a parent it lacks"
    if parent.sha256 != checkpoint.parent_sha256 or str(parent.pk) != str(
        identity.get("parent_checkpoint_id")
    ):
        return (
            f"{where} does not link to checkpoint {parent.sequence} "
            f"(hash {parent.sha256[:12]} expected, {checkpoint.parent_sha256[:12]} named)"
        )
    return None


def _check_artifacts(run: Run, envelope: dict[str, Any]) -> str | None:
    refs = (envelope.get("evidence") or {}).get("artifacts") or []
    if not refs:
        return None
    stored = {
        str(a.pk): a
        for a in Artifact.objects.filter(tenant_id=run.tenant_id, pk__in={r["id"] for r in refs})
    }
    for ref in refs:
        artifact = stored.get(str(ref["id"]))
        label = ref.get("name") or ref["id"]
        if artifact is None:
            return f"evidence artifact '{label}' is missing"
        if artifact.sha256 != ref["sha256"]:
            return f"evidence artifact '{label}' is stored with another sha256"
        try:
            artifact_content(artifact)
        except IntegrityFailure as exc:
            return f"evidence artifact '{label}': {exc.detail}"
    return None


def missing_key_reason(exc: MissingKeyError, where: str) -> str:
    """The pause reason for data this process has no key for: names the key id only."""
    return (
        f"{where} is sealed under encryption key '{exc.key_id}', which this worker does not "
        "have: add the key to CAIRN_ENCRYPTION_KEYS (or the key file) of every worker, then "
        "resume the run"
    )


def restore_latest(run: Run, code: Workflow | None = None) -> Restored | Halt:
    """Steps 2-6 of the restore procedure for a leased run. Reads only; the caller acts on
    a Halt (pause or fail) and runs the next step after a Restored.

    A checkpoint or evidence artifact sealed under a key this process lacks pauses the run
    for review naming the key id (it never raises out of the worker). With the workflow's
    ``code``: a checkpoint written by a code version the code does not declare compatible,
    or a secret reference a step declares that does not resolve, pauses the run too."""
    try:
        return _restore(run, code)
    except MissingKeyError as exc:
        return _pause(missing_key_reason(exc, f"checkpoint {run.checkpoint_sequence}"), "integrity")


def _check_code_version(code: Workflow, checkpoint: Checkpoint, envelope: dict) -> str | None:
    compatible = code.compatible_code_versions
    written_by = (envelope.get("compatibility") or {}).get("workflow_code_version") or ""
    if compatible is None or not written_by or written_by in compatible:
        return None
    return (
        f"checkpoint {checkpoint.sequence} was written by code version '{written_by}', which "
        f"the workflow code {code.workflow_type}@{code.version} (code version "
        f"{code.code_version}) does not declare compatible "
        f"(compatible: {', '.join(sorted(compatible))})"
    )


def _check_secrets(code: Workflow) -> str | None:
    """Restore step 6 for credentials: every declared secret reference resolves now. The
    reason names the reference and the step, never a value."""
    for step, reference in code.secret_references:
        try:
            secret_resolve(reference)
        except SecretUnavailable as exc:
            return (
                f"the secret reference '{reference}' that step {step} declares does not "
                f"resolve: {exc} Restore the credential, then resume the run"
            )
    return None


def _restore(run: Run, code: Workflow | None) -> Restored | Halt:
    # 2. The latest accepted checkpoint, as the run's head names it.
    checkpoint = checkpoint_at(run_id=run.pk, sequence=run.checkpoint_sequence)
    if checkpoint is None:
        return _pause(f"the run's latest checkpoint {run.checkpoint_sequence} is missing", "load")
    if (
        str(checkpoint.pk) != str(run.latest_checkpoint_id)
        or checkpoint.sha256 != run.latest_checkpoint_sha256
    ):
        return _pause(f"checkpoint {checkpoint.sequence} is not the head the run names", "load")
    # 3. Identity and integrity.
    try:
        stored = checkpoint_envelope(checkpoint)
    except IntegrityFailure as exc:
        return _pause(exc.detail, "integrity")
    problem = (
        _check_chain(run, checkpoint, stored)
        or checkpoint_columns_problem(checkpoint, stored)
        or run_head_problem(run, stored)
    )
    if problem:
        return _pause(problem, "integrity")
    # 4. Older envelope schemas go through the explicit migrations, then the schema check.
    migrated_from = None
    envelope = stored
    if stored.get("schema_version") != env.SCHEMA_VERSION:
        migrated_from = stored.get("schema_version")
        try:
            envelope = env.migrate(stored)
        except (env.NoMigration, env.EnvelopeTooNew) as exc:
            return _pause(f"checkpoint {checkpoint.sequence}: {exc}", "schema")
        except (KeyError, TypeError, ValueError) as exc:
            return _pause(
                f"checkpoint {checkpoint.sequence} cannot be migrated from schema "
                f"{migrated_from}: {exc!r}",
                "schema",
            )
    try:
        env.validate(envelope)
    except env.EnvelopeInvalid as exc:
        return _pause(
            f"checkpoint {checkpoint.sequence} breaks the envelope schema: {exc}", "schema"
        )
    if envelope["position"]["state"] != run.state:
        return _pause(
            f"checkpoint {checkpoint.sequence} is at state '{envelope['position']['state']}' "
            f"but the run says '{run.state}'",
            "integrity",
        )
    if code is not None:
        problem = _check_code_version(code, checkpoint, envelope)
        if problem:
            return _pause(problem, "compatibility")
    try:
        problem = _check_artifacts(run, envelope)
    except MissingKeyError as exc:
        return _pause(
            missing_key_reason(exc, f"an evidence artifact of checkpoint {checkpoint.sequence}"),
            "artifacts",
        )
    if problem:
        return _pause(f"checkpoint {checkpoint.sequence}: {problem}", "artifacts")
    used = used_merge(envelope.get("budgets"), run.budget_used)
    restored = Restored(
        checkpoint=checkpoint, envelope=envelope, used=used, migrated_from=migrated_from
    )
    # 5. External operations whose outcome is unknown are settled before any new write.
    reason = hooks.operations_reconcile(run=run, envelope=envelope)
    if reason:
        return Halt("pause", reason, restored, check="reconcile")
    # 6. Time-sensitive policy: credentials still resolve; budgets and the deadline
    # (approval expiry: approval_gate).
    return credentials_check(code, restored) or policy_check(run, restored) or restored


def credentials_check(code: Workflow | None, restored: Restored) -> Halt | None:
    """Pause the run when a secret reference its steps declare no longer resolves (run
    before every step, in the lean loop too). Reads no database."""
    problem = _check_secrets(code) if code is not None else None
    return Halt("pause", problem, restored, check="credentials") if problem else None


def policy_check(run: Run, restored: Restored, *, attempt_needed: bool = False) -> Halt | None:
    """Fail the run when a budget or its deadline is exhausted. Attempts count only when
    the run is about to start a step: a run that used its last attempt on a step that
    succeeded may still wait for an approval or finish."""
    limits = dict(run.budget_limits or {})
    if not attempt_needed:
        limits.pop("max_attempts", None)
    reason = budget_exhausted(Run(budget_limits=limits, budget_used=restored.used))
    return Halt("fail", reason, restored, check="policy") if reason else None
