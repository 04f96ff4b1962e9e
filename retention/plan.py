"""What a retention policy selects, as querysets shared by the job and the preview.

Nothing here writes. The rules:

- a policy covers its tenant's runs of its workflow type; the tenant's default policy
  (blank workflow type) covers the types that have no policy of their own;
- only terminal runs are touched, never one on legal hold or in a tenant on legal hold. A
  LangGraph thread's runs never end (LangGraph does not tell a checkpointer that a graph
  finished), so for expiry a thread's run counts as ended when nobody wrote it for the
  expiry period; compaction leaves them alone (their checkpoints are LangGraph's history);
- compaction removes a terminal run's intermediate checkpoints once the run ended more than
  ``intermediate_days`` ago (``failed_run_days`` for failed runs when set). It keeps the
  final checkpoint, every ``is_evidence`` checkpoint, and any checkpoint another row points
  at (the source of a fork, the checkpoint an approval request is bound to);
- a run expires ``run_expiry_days`` after it ended, unless a fork of it still exists;
- an artifact is removed only when no checkpoint and no other row references it, once it is
  older than ``model_context_days`` (kind ``model_context``) or ``intermediate_days``
  (other kinds), by the tenant's default policy.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Exists, F, Model, OuterRef, Q, QuerySet

from checkpoints.models import (
    TERMINAL_STATUSES,
    Artifact,
    ArtifactKind,
    ArtifactReference,
    Checkpoint,
    Run,
    RunStatus,
)
from langgraph_store.threads import (
    WORKFLOW_TYPE as LANGGRAPH_WORKFLOW_TYPE,
)
from retention.models import RetentionPolicy

NOTHING = Q(pk__in=[])


def _days(now: datetime, days: int) -> datetime:
    return now - timedelta(days=days)


def referenced_elsewhere(model: type[Model], *, ignore: tuple[type[Model], ...] = ()) -> Q:
    """Rows of ``model`` that some other row points at with a foreign key.

    Found by introspection, so a relation another app adds later (approvals bind a
    checkpoint and an artifact) keeps its rows without a change here.
    """
    condition = NOTHING
    for relation in model._meta.get_fields(include_hidden=True):
        if not (relation.auto_created and not relation.concrete):
            continue
        if not (relation.one_to_many or relation.one_to_one):
            continue
        related = relation.related_model
        if related is model or related in ignore:
            continue
        rows = related._base_manager.filter(**{relation.field.name: OuterRef("pk")})
        condition |= Q(Exists(rows))
    return condition


def scope_runs(policy: RetentionPolicy) -> QuerySet[Run]:
    runs = Run.objects.filter(tenant_id=policy.tenant_id)
    if policy.workflow_type:
        return runs.filter(workflow_type=policy.workflow_type)
    specific = RetentionPolicy.objects.filter(tenant_id=policy.tenant_id).exclude(workflow_type="")
    return runs.exclude(workflow_type__in=specific.values("workflow_type"))


def deletable(runs: QuerySet[Run]) -> QuerySet[Run]:
    """Terminal runs and LangGraph threads' runs, not under any legal hold. (A thread's run
    is never due for compaction, whose periods name terminal statuses; it expires once
    nobody wrote it for the expiry period.)"""
    ended = Q(status__in=TERMINAL_STATUSES) | Q(workflow_type=LANGGRAPH_WORKFLOW_TYPE)
    return runs.filter(ended, legal_hold=False, tenant__legal_hold=False)


def compaction_due(policy: RetentionPolicy, now: datetime) -> Q:
    """Runs (already terminal) whose intermediate checkpoints are past their period."""
    due = NOTHING
    others = [RunStatus.SUCCEEDED, RunStatus.CANCELLED]
    if policy.intermediate_days is not None:
        cutoff = _days(now, policy.intermediate_days)
        due |= Q(status__in=others, updated_at__lt=cutoff)
        if policy.failed_run_days is None:
            due |= Q(status=RunStatus.FAILED, updated_at__lt=cutoff)
    if policy.failed_run_days is not None:
        due |= Q(status=RunStatus.FAILED, updated_at__lt=_days(now, policy.failed_run_days))
    return due


def expiry_due(policy: RetentionPolicy, now: datetime) -> Q:
    if policy.run_expiry_days is None:
        return NOTHING
    forks = Run.objects.filter(forked_from_run=OuterRef("pk"))
    return Q(updated_at__lt=_days(now, policy.run_expiry_days)) & ~Q(Exists(forks))


def compactable() -> QuerySet[Checkpoint]:
    """Checkpoints compaction may remove once their run is due (the run is checked apart)."""
    return Checkpoint.objects.filter(
        is_evidence=False, sequence__lt=F("run__checkpoint_sequence")
    ).exclude(referenced_elsewhere(Checkpoint, ignore=(ArtifactReference,)))


def expirable() -> QuerySet[Checkpoint]:
    """Checkpoints of an expiring run removed batch by batch; the rest go with the run."""
    return Checkpoint.objects.exclude(referenced_elsewhere(Checkpoint, ignore=(ArtifactReference,)))


def compaction_runs(policy: RetentionPolicy, now: datetime) -> QuerySet[Run]:
    runs = deletable(scope_runs(policy)).filter(compaction_due(policy, now))
    return runs.filter(Exists(compactable().filter(run=OuterRef("pk"))))


def expiring_runs(policy: RetentionPolicy, now: datetime) -> QuerySet[Run]:
    return deletable(scope_runs(policy)).filter(expiry_due(policy, now))


def artifact_due(policy: RetentionPolicy, now: datetime) -> Q:
    """Artifacts old enough to go once nothing references them (default policy only)."""
    if policy.workflow_type:
        return NOTHING
    due = NOTHING
    if policy.model_context_days is not None:
        cutoff = _days(now, policy.model_context_days)
        due |= Q(kind=ArtifactKind.MODEL_CONTEXT, created_at__lt=cutoff)
    if policy.intermediate_days is not None:
        cutoff = _days(now, policy.intermediate_days)
        due |= ~Q(kind=ArtifactKind.MODEL_CONTEXT) & Q(created_at__lt=cutoff)
    return due


def removable_artifacts(policy: RetentionPolicy, now: datetime) -> QuerySet[Artifact]:
    """Artifacts the job removes now: due, in a tenant not on hold, referenced by nothing."""
    return (
        Artifact.objects.filter(tenant_id=policy.tenant_id, tenant__legal_hold=False)
        .filter(artifact_due(policy, now))
        .exclude(referenced_elsewhere(Artifact))
    )


def default_policy_of(tenant_id: object) -> RetentionPolicy | None:
    return RetentionPolicy.objects.filter(tenant_id=tenant_id, workflow_type="").first()
