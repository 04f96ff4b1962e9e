"""Signed evidence: one run's approvals, chain and effects, in a bundle anyone can verify.

``run_evidence_export`` writes the bundle ``approvals.evidence_verify`` checks offline: the
checkpoint chain (sequence, position, sha256, parent, the artifacts each names), each approval
with its decisions, reviewers, times, bound hashes and the verdict ``request_judge`` (the
approval invariant's one decision function, ``approvals.services.standing``) gives it on its
own binding, the operations with their provider ids and the checkpoint each was recorded at,
the artifacts' hashes (bytes on request), a reviewer's edit (approve with edits: the
artifact they were shown, both hashes and the diff), and Cairn's own verification of the run
(``run_verify``). It is signed with the deployment's Ed25519 key (``approvals.signing``).
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from django.db import transaction
from django.utils import timezone

from approvals.evidence_verify import ALGORITHM, FORMAT, canonical
from approvals.evidence_verify import edit_diff as verify_edit_diff
from approvals.models import ApprovalRequest
from approvals.services.standing import (
    ApprovalAsk,
    approval_standing,
    edited_shas,
    request_judge,
)
from approvals.signing import evidence_signing_key
from cairn.errors import IntegrityFailure
from checkpoints.models import Artifact, Checkpoint, CompactionRecord, ExternalOperation
from checkpoints.services.approval_chain import artifact_names
from checkpoints.services.artifacts import artifact_content
from checkpoints.services.integrity import run_verify
from checkpoints.services.reads import checkpoint_envelope, run_get
from checkpoints.services.workflows import approval_action, states_behind
from tenants.models import Tenant
from tenants.services import Actor, audit_record


@dataclass(frozen=True)
class EvidenceBundle:
    data: bytes  # the bundle's exact bytes: canonical JSON, signed
    key_id: str
    sha256: str

    @property
    def filename(self) -> str:
        return f"cairn-evidence-{self.sha256[:12]}.json"


def stamp(moment: datetime | None) -> str | None:
    """One fixed-width UTC form, so the verifier may compare times as strings."""
    if moment is None:
        return None
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _checkpoints(run_id: UUID) -> list[dict[str, Any]]:
    rows = []
    for checkpoint in Checkpoint.objects.filter(run_id=run_id).order_by("sequence"):
        envelope = checkpoint_envelope(checkpoint)
        control = envelope.get("control") or {}
        rows.append(
            {
                "sequence": checkpoint.sequence,
                "state": checkpoint.state,
                "step": checkpoint.step,
                "sha256": checkpoint.sha256,
                "parent_sha256": checkpoint.parent_sha256,
                "actor": checkpoint.actor,
                "created_at": stamp(checkpoint.created_at),
                "artifacts": artifact_names(envelope),
                "approval_request_id": str(control.get("approval_request_id") or "") or None,
                "side_effects": [
                    str(item.get("idempotency_key"))
                    for item in envelope.get("side_effects") or []
                    if item.get("idempotency_key")
                ],
            }
        )
    return rows


def edit_diff(old: bytes, new: bytes, *, old_sha256: str, new_sha256: str) -> str:
    """The unified diff of a reviewer's edit, as the bundle holds it and the offline
    verifier recomputes it from the artifacts' bytes (``evidence_verify.edit_diff``)."""
    return verify_edit_diff(old, new, old_sha256=old_sha256, new_sha256=new_sha256)


def _edited_from(row: ApprovalRequest) -> dict[str, Any] | None:
    if not row.edited_from_sha256:
        return None
    try:
        old = artifact_content(row.edited_from) if row.edited_from_id else None
        new = artifact_content(row.artifact)
    except IntegrityFailure:
        old = None
    diff = None
    if old is not None:
        diff = edit_diff(
            old, new, old_sha256=row.edited_from_sha256, new_sha256=row.artifact_sha256
        )
    return {
        "artifact_id": str(row.edited_from_id) if row.edited_from_id else None,
        "artifact_sha256": row.edited_from_sha256,
        "edited_by": row.edited_by.get_username() if row.edited_by_id else None,
        "diff": diff,
    }


def _approvals(run_id: UUID, now: datetime) -> list[dict[str, Any]]:
    rows = (
        ApprovalRequest.objects.filter(run_id=run_id)
        .prefetch_related("decisions__approver")
        .order_by("created_at", "pk")
    )
    approvals = []
    for row in rows:
        # The one decision function, on the request's own binding: does it count?
        ask = ApprovalAsk(run_id=run_id, version=row.run_version, action=row.action)
        verdict, _ = request_judge(row, ask, now)
        approvals.append(
            {
                "id": str(row.pk),
                "action": row.action,
                "status": row.status,
                "status_reason": row.status_reason,
                "verdict": verdict,
                "run_version": row.run_version,
                "checkpoint_sequence": row.checkpoint_sequence,
                "checkpoint_sha256": row.checkpoint_sha256,
                "artifact_id": str(row.artifact_id),
                "artifact_sha256": row.artifact_sha256,
                "required_approvals": row.required_approvals,
                # Who was allowed to decide, as the approval state declared it.
                "reviewers": {
                    "role": row.reviewer_role or None,
                    "group": row.reviewer_group or None,
                },
                "requester": row.requester_label,
                "created_at": stamp(row.created_at),
                "expires_at": stamp(row.expires_at),
                "decided_at": stamp(row.decided_at),
                "consumed_at": stamp(row.consumed_at),
                "previous_request_id": str(row.previous_id) if row.previous_id else None,
                # Approve with edits: the artifact the editor was shown, and the diff.
                "edited_from": _edited_from(row),
                "decisions": [
                    {
                        "reviewer": d.approver.get_username(),
                        # Decided through a delegation: whose vote it is.
                        "on_behalf_of": (
                            d.on_behalf_of.get_username() if d.on_behalf_of_id else None
                        ),
                        "decision": d.decision,
                        "artifact_sha256": d.artifact_sha256,
                        "comment": d.comment,
                        "decided_at": stamp(d.created_at),
                    }
                    for d in row.decisions.all()
                ],
            }
        )
    return approvals


def _operations(run_id: UUID, checkpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each operation with the checkpoint it was recorded at: the first whose side-effects
    group lists it, else the run's head when it was reserved."""
    first_listed: dict[str, int] = {}
    for link in checkpoints:
        for key in link["side_effects"]:
            first_listed.setdefault(key, link["sequence"])
    operations = []
    for op in ExternalOperation.objects.filter(run_id=run_id).order_by("created_at", "pk"):
        created = stamp(op.created_at)
        sequence = first_listed.get(op.idempotency_key)
        if sequence is None:
            before = [c["sequence"] for c in checkpoints if c["created_at"] <= created]
            sequence = before[-1] if before else 0
        operations.append(
            {
                "idempotency_key": op.idempotency_key,
                "action": op.action,
                "target": op.target,
                "step": op.step,
                "provider": op.provider,
                "provider_operation_id": op.provider_operation_id,
                "provider_job_id": op.provider_job_id,
                "status": op.status,
                "checkpoint_sequence": sequence,
                "created_at": created,
                "updated_at": stamp(op.updated_at),
            }
        )
    return operations


def _artifacts(tenant: Tenant, shas: set[str], *, include_bytes: bool) -> list[dict[str, Any]]:
    rows = []
    for artifact in Artifact.objects.filter(tenant=tenant, sha256__in=shas).order_by("sha256"):
        row = {
            "sha256": artifact.sha256,
            "size": artifact.size,
            "media_type": artifact.media_type,
            "kind": artifact.kind,
        }
        if include_bytes:
            row["content_base64"] = base64.b64encode(artifact_content(artifact)).decode()
        rows.append(row)
    return rows


def run_evidence_export(
    *, tenant: Tenant, run_id: UUID | str, actor: Actor, include_bytes: bool = False
) -> EvidenceBundle:
    """The run's signed evidence bundle; the export is audited (``evidence.export``, with
    the bundle's sha256 and the key that signed it). ``include_bytes`` adds each artifact's
    decrypted content (an audited read of each).

    Raises NotFound (another tenant's run too), IntegrityFailure (an envelope or artifact
    that cannot be decrypted) or SigningKeyUnavailable; a refusal writes nothing.
    """
    key = evidence_signing_key()
    run = run_get(tenant=tenant, run_id=run_id)
    now = timezone.now()
    definition = run.workflow.definition
    checkpoints = _checkpoints(run.pk)
    approvals = _approvals(run.pk, now)
    shas = {sha for link in checkpoints for sha in link["artifacts"]}
    shas |= {a["artifact_sha256"] for a in approvals}
    shas |= {a["edited_from"]["artifact_sha256"] for a in approvals if a["edited_from"]}
    standing = None
    if run.state in (definition.get("approval_states") or ()):
        # At an approval state: the request that lets the run pass now, or why none does.
        action = approval_action(definition, run.state)
        named = set(checkpoints[-1]["artifacts"]) if checkpoints else set()
        # A reviewer's edit of the draft the head names counts for it (approve with edits).
        for sha in list(named):
            named |= edited_shas(run_id=run.pk, version=run.version, action=action, sha256=sha)
        standing = approval_standing(
            ask=ApprovalAsk(
                run_id=run.pk,
                version=run.version,
                action=action,
                artifact_sha256s=named,
                place=f"Leaving '{run.state}'",
            ),
            now=now,
        )
    verification = run_verify(tenant=tenant, run_id=run.pk)
    behind = states_behind(definition)
    payload = {
        "format": FORMAT,
        "key_id": key.key_id,
        "exported_at": stamp(now),
        "exported_by": actor.name,
        "tenant": tenant.slug,
        "run": {
            "id": str(run.pk),
            "workflow_type": run.workflow_type,
            "workflow_version": run.workflow_version,
            "execution": run.execution,
            "state": run.state,
            "status": run.status,
            "version": run.version,
            "checkpoint_sequence": run.checkpoint_sequence,
            "latest_checkpoint_sha256": run.latest_checkpoint_sha256,
            "created_at": stamp(run.created_at),
        },
        "workflow": {
            "definition_sha256": run.workflow.definition_sha256,
            "terminal": sorted(definition.get("terminal") or ()),
            "approval_states": [
                {
                    "state": gate,
                    "action": approval_action(definition, gate),
                    "past": sorted(stretch),
                }
                for gate, stretch in sorted(behind.items())
            ],
        },
        "checkpoints": checkpoints,
        "compactions": [
            {
                "first_sequence": record.first_sequence,
                "last_sequence": record.last_sequence,
                "reason": record.reason,
                "removed": [
                    {
                        "sequence": r["sequence"],
                        "state": r.get("state", ""),
                        "sha256": r["sha256"],
                        "parent_sha256": r.get("parent_sha256", ""),
                    }
                    for r in record.removed
                ],
            }
            for record in CompactionRecord.objects.filter(run=run).order_by("first_sequence")
        ],
        "approvals": approvals,
        "head_standing": None
        if standing is None
        else {
            "verdict": standing.verdict,
            "request_id": str(standing.request.pk) if standing.request else None,
            "reason": standing.refusal.detail if standing.refusal else "",
        },
        "operations": _operations(run.pk, checkpoints),
        "artifacts": _artifacts(tenant, shas, include_bytes=include_bytes),
        "server_check": {"ok": verification["ok"], "problems": verification["problems"]},
    }
    document = {"payload": payload, "signature": {"algorithm": ALGORITHM, "value": ""}}
    document["signature"]["value"] = key.sign(canonical(payload))
    data = canonical(document)
    digest = hashlib.sha256(data).hexdigest()
    with transaction.atomic():
        audit_record(
            tenant=tenant,
            actor=actor,
            action="evidence.export",
            run_id=run.pk,
            target=key.key_id,
            details={"sha256": digest, "key_id": key.key_id, "artifact_bytes": include_bytes},
        )
        if include_bytes:
            for sha in sorted(shas):
                audit_record(
                    tenant=tenant,
                    actor=actor,
                    action="artifact.read",
                    run_id=run.pk,
                    target=sha,
                    details={"sha256": sha, "via": "evidence.export"},
                )
    return EvidenceBundle(data=data, key_id=key.key_id, sha256=digest)
