"""The durable facts: workflow definitions, runs, checkpoints, artifacts, operations, outbox,
the artifact references of each checkpoint and the record of what compaction removed.

Every row carries its tenant. Payload columns that can hold customer data are sealed with
AES-GCM (``checkpoints.crypto``) by the services; the models never decrypt by themselves.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.conf import settings
from django.db import models
from django.db.models import Q

from cairn import clock
from tenants.models import Tenant


class RunStatus(models.TextChoices):
    RUNNING = "running"
    WAITING_APPROVAL = "waiting_approval"
    WAITING_RETRY = "waiting_retry"
    RECONCILING = "reconciling"
    PAUSED_FOR_REVIEW = "paused_for_review"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    FAILED = "failed"
    SUCCEEDED = "succeeded"


TERMINAL_STATUSES = frozenset({RunStatus.CANCELLED, RunStatus.FAILED, RunStatus.SUCCEEDED})
ACTIVE_STATUSES = frozenset(set(RunStatus) - TERMINAL_STATUSES)


class Execution(models.TextChoices):
    WORKER = "worker"  # Cairn's Celery workers run the steps
    EXTERNAL = "external"  # the caller drives checkpoints over the API


class WorkflowDefinition(models.Model):
    """A declarative state machine. ``tenant`` is null for definitions registered in code."""

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE)
    workflow_type = models.CharField(max_length=100)
    version = models.CharField(max_length=50)
    definition = models.JSONField()
    definition_sha256 = models.CharField(max_length=64)
    has_code = models.BooleanField(default=False)  # steps are Python functions
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["workflow_type", "version"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "workflow_type", "version"], name="workflow_unique_per_tenant"
            ),
            models.UniqueConstraint(
                fields=["workflow_type", "version"],
                condition=Q(tenant__isnull=True),
                name="workflow_unique_in_code",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.workflow_type}@{self.version}"


class Run(models.Model):
    """The current snapshot of one workflow run; the checkpoints are its history."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="runs")
    workflow = models.ForeignKey(WorkflowDefinition, on_delete=models.PROTECT)
    workflow_type = models.CharField(max_length=100)
    workflow_version = models.CharField(max_length=50)
    execution = models.CharField(max_length=16, choices=Execution.choices)
    objective_ref = models.CharField(max_length=500, blank=True)
    state = models.CharField(max_length=100)
    step = models.CharField(max_length=100, blank=True)
    status = models.CharField(max_length=32, choices=RunStatus.choices)
    status_reason = models.TextField(blank=True)
    # Optimistic concurrency: every change to the run increments it.
    version = models.PositiveBigIntegerField(default=1)
    checkpoint_sequence = models.PositiveBigIntegerField(default=0)
    # The head of the hash chain, so a commit needs no lookup to find its parent.
    latest_checkpoint_id = models.UUIDField(null=True, blank=True)
    latest_checkpoint_sha256 = models.CharField(max_length=64, blank=True)
    # When the head checkpoint was written (its ``created_at``, set by the same writes), so
    # the age of an active run's head is read from the runs alone (Health, the metrics).
    latest_checkpoint_at = models.DateTimeField(null=True, blank=True)
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    next_eligible_at = models.DateTimeField(null=True, blank=True)
    restore_count = models.PositiveIntegerField(default=0)
    budget_limits = models.JSONField(default=dict)
    budget_used = models.JSONField(default=dict)
    forked_from_run = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks"
    )
    forked_from_checkpoint = models.ForeignKey(
        "Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks"
    )
    legal_hold = models.BooleanField(default=False)
    # An operator's hold (``run_pause``/``run_unpause``), apart from the status: a paused run
    # keeps its status and version (a step in flight still commits), but no command of it is
    # published and no worker starts a step for it until it is unpaused.
    paused = models.BooleanField(default=False)
    pause_reason = models.TextField(blank=True, default="")
    # The run's trace (a W3C traceparent), written once when the run starts: every command
    # of the run carries it, so each worker that takes the run on, a crash's successor too,
    # traces into the same trace (telemetry.tracing).
    trace_context = models.CharField(max_length=55, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["tenant", "-created_at", "-id"]),
            models.Index(fields=["tenant", "status", "-created_at"]),
            models.Index(fields=["tenant", "workflow_type", "-created_at"]),
            models.Index(fields=["status", "next_eligible_at"]),
            # The console sorts by these and counts per status under a workflow filter.
            models.Index(fields=["tenant", "-updated_at", "-id"], name="run_tenant_updated_idx"),
            models.Index(
                fields=["tenant", "-restore_count", "-id"], name="run_tenant_restores_idx"
            ),
            models.Index(
                fields=["tenant", "workflow_type", "status"], name="run_tenant_wf_status_idx"
            ),
            # The oldest heads of a tenant's active runs (Health: the stuck-est runs first).
            models.Index(
                fields=["tenant", "latest_checkpoint_at"],
                condition=Q(status__in=sorted(ACTIVE_STATUSES)),
                name="run_active_head_age_idx",
            ),
            # The paused runs of a tenant (the runs page's Paused chip and filter).
            models.Index(fields=["tenant"], condition=Q(paused=True), name="run_paused_idx"),
            # The runs a dead worker holds, found by its name (runtime.rescue).
            models.Index(
                fields=["lease_owner"], condition=~Q(lease_owner=""), name="run_leased_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.id} ({self.workflow_type} {self.state}/{self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def lease_held(self, now: datetime | None = None) -> bool:
        """Whether someone holds the run's lease and it has not expired as of ``now``, a
        time on the database's clock (``cairn.clock``; default: this process's estimate of
        it): a worker (or an external driver) may be executing a step right now."""
        expires = self.lease_expires_at
        return bool(self.lease_owner and expires and expires > (now or clock.now()))


class CheckpointQuerySet(models.QuerySet):
    """Checkpoints are append-only: bulk update and delete are refused here.

    Retention (the one legitimate deleter) calls ``retention_delete`` explicitly.
    """

    def update(self, **kwargs):  # noqa: ANN003
        raise ImmutableCheckpoint("checkpoints are immutable: they are never updated")

    def delete(self):
        raise ImmutableCheckpoint("checkpoints are deleted only by retention")

    def retention_delete(self) -> int:
        return models.QuerySet.delete(self)[0]

    def reseal(self, pk: object, *, envelope_sealed: str, key_id: str) -> int:
        """Key rotation rewrites the ciphertext only; the content and hash stay identical."""
        return models.QuerySet.update(
            self.filter(pk=pk), envelope_sealed=envelope_sealed, key_id=key_id
        )


class ImmutableCheckpoint(Exception):
    pass


class Checkpoint(models.Model):
    """One accepted position of a run: immutable, hash-chained to its parent."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    sequence = models.PositiveBigIntegerField()
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    state = models.CharField(max_length=100)
    step = models.CharField(max_length=100, blank=True)
    schema_version = models.PositiveIntegerField()
    envelope_sealed = models.TextField()
    key_id = models.CharField(max_length=64)
    sha256 = models.CharField(max_length=64)
    parent_sha256 = models.CharField(max_length=64, blank=True)
    actor = models.CharField(max_length=200, blank=True)
    # True when the checkpoint carries transition evidence retention must keep.
    is_evidence = models.BooleanField(default=False)
    # The step attempt this checkpoint ends, for a worker's step or its failure (step
    # history): number, step, worker, started_at, duration_ms, outcome, error_type and the
    # traceback's artifact reference. Operational metadata the console lists without
    # decrypting envelopes; no free text and no payload value (``StepAttempt``).
    attempt = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = CheckpointQuerySet.as_manager()

    class Meta:
        ordering = ["run", "sequence"]
        constraints = [
            models.UniqueConstraint(fields=["run", "sequence"], name="checkpoint_one_per_sequence")
        ]

    def __str__(self) -> str:
        return f"checkpoint {self.run_id}#{self.sequence}"

    def save(self, *args, **kwargs):  # noqa: ANN002, ANN003
        if not self._state.adding:
            raise ImmutableCheckpoint("checkpoints are immutable: they are never updated")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):  # noqa: ANN002, ANN003
        raise ImmutableCheckpoint("checkpoints are deleted only by retention")


class ArtifactKind(models.TextChoices):
    SOURCE = "source"
    DRAFT = "draft"
    MODEL_CONTEXT = "model_context"
    TOOL_RESULT = "tool_result"
    TRACEBACK = "traceback"  # a failed step attempt's traceback (step history)
    OTHER = "other"


class Artifact(models.Model):
    """Immutable content-addressed bytes (sha256 of the plaintext), encrypted at rest."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    media_type = models.CharField(max_length=200)
    kind = models.CharField(max_length=32, choices=ArtifactKind.choices)
    storage_name = models.CharField(max_length=300)
    key_id = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "sha256"], name="artifact_dedup_per_tenant")
        ]

    def __str__(self) -> str:
        return f"artifact {self.sha256[:12]} ({self.kind})"


class ArtifactUpload(models.Model):
    """Who uploaded an artifact's bytes (one row per person, whichever upload stored them).

    Artifacts are content-addressed and shared per tenant, so the row's creator is not who
    uploaded them: this is. The four-eyes rule reads it: whoever uploaded the artifact under
    review may not approve it.
    """

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    artifact = models.ForeignKey(Artifact, on_delete=models.CASCADE, related_name="+")
    uploaded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["artifact", "uploaded_by"], name="artifact_upload_once_per_person"
            )
        ]

    def __str__(self) -> str:
        return f"{self.artifact_id} uploaded by {self.uploaded_by_id}"


class OperationStatus(models.TextChoices):
    RESERVED = "reserved"
    PENDING = "pending"
    CONFIRMED = "confirmed"
    FAILED = "failed"
    UNKNOWN = "unknown"


class ExternalOperation(models.Model):
    """One intended side effect, identified by an idempotency key unique in its tenant (one
    tenant's keys neither collide with nor reveal another's)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="operations")
    step = models.CharField(max_length=100, blank=True)
    idempotency_key = models.CharField(max_length=200)
    action = models.CharField(max_length=100)
    target = models.CharField(max_length=500)
    request_fingerprint = models.CharField(max_length=128)
    provider = models.CharField(max_length=100, blank=True)  # adapter name
    request_sealed = models.TextField(blank=True)  # encrypted request payload
    client_reference = models.CharField(max_length=200, blank=True)
    status = models.CharField(
        max_length=16, choices=OperationStatus.choices, default=OperationStatus.RESERVED
    )
    provider_operation_id = models.CharField(max_length=200, blank=True)
    # A long-running tool: the provider's job id, recorded before anyone polls it, so a
    # restore observes the same job instead of submitting a second one.
    provider_job_id = models.CharField(max_length=200, blank=True)
    result_sealed = models.TextField(blank=True)
    reason = models.TextField(blank=True)
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["status", "updated_at"])]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"], name="operation_key_unique_per_tenant"
            )
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.idempotency_key} ({self.status})"


class OutboxMessage(models.Model):
    """A command derived from committed state, published after commit (at least once)."""

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    # None for a command about no single run (``bulk.process``: a bulk action's work).
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="outbox", null=True, blank=True
    )
    kind = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    available_at = models.DateTimeField(null=True, blank=True)  # not before (retries)
    claimed_until = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["id"], condition=Q(sent_at__isnull=True), name="outbox_unsent_idx")
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.id}"


class BulkActionStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"


class BulkAction(models.Model):
    """An operator action on many runs at once (``runtime.services.bulk``): who, what, why,
    which runs (their ids as selected, and the filter or ticks they were selected by), and
    how far the background work got. Each run is acted on by its own service; its outcome is
    a ``BulkActionRun`` written in the same transaction as that action."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="bulk_actions")
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    actor_label = models.CharField(max_length=200)
    action = models.CharField(max_length=16)  # cancel, resume, retry, pause, unpause
    step = models.CharField(max_length=100, blank=True, default="")  # a retry's step
    reason = models.TextField()
    # How the runs were selected: {"filter": {...}} as the list read it, or {"ticked": true}.
    selection = models.JSONField(default=dict)
    total = models.PositiveIntegerField()
    done = models.PositiveIntegerField(default=0)
    refused = models.PositiveIntegerField(default=0)
    status = models.CharField(
        max_length=16, choices=BulkActionStatus.choices, default=BulkActionStatus.QUEUED
    )
    # A worker processing it holds it until then (database clock); an expired claim of an
    # unfinished action means its worker died, and the rescue queues it again.
    claimed_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["tenant", "-created_at"], name="bulk_tenant_created_idx"),
            models.Index(
                fields=["created_at"],
                condition=~Q(status="finished"),
                name="bulk_unfinished_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"bulk {self.action} of {self.total} runs"


class BulkActionRunOutcome(models.TextChoices):
    PENDING = "pending"
    DONE = "done"
    REFUSED = "refused"


class BulkActionRun(models.Model):
    """One selected run of a bulk action and what happened to it. ``run_id`` is the id as
    selected, not a key: an id that names no run of the tenant is refused as not found."""

    id = models.BigAutoField(primary_key=True)
    bulk_action = models.ForeignKey(BulkAction, on_delete=models.CASCADE, related_name="runs")
    position = models.PositiveIntegerField()  # order of selection
    run_id = models.UUIDField()
    outcome = models.CharField(
        max_length=16, choices=BulkActionRunOutcome.choices, default=BulkActionRunOutcome.PENDING
    )
    detail = models.TextField(blank=True, default="")  # a refusal's sentence
    version_before = models.PositiveBigIntegerField(null=True, blank=True)
    version_after = models.PositiveBigIntegerField(null=True, blank=True)
    acted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["position"]
        constraints = [
            models.UniqueConstraint(fields=["bulk_action", "run_id"], name="bulk_run_once"),
        ]
        indexes = [models.Index(fields=["bulk_action", "outcome", "position"])]

    def __str__(self) -> str:
        return f"{self.run_id}: {self.outcome}"


class RunnerWebhook(models.Model):
    """Where a tenant's runners are told that something happened to an externally driven
    run (a checkpoint, a decision, an operator's resume, a retry coming due). Optional.

    Deliveries are read from the outbox (``delivered_through`` is the last outbox message
    id turned into a delivery) and signed the Standard Webhooks way under a secret Cairn
    generated for the tenant (``secret_sealed``, encrypted; during a rotation's overlap the
    previous one signs too, until ``previous_secret_expires_at``), or under a secret
    reference a deployment admin registered for the tenant (``secret_ref``). The URL is
    sealed too (``url_sealed``): some receivers put a token in it, so it is a credential."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, primary_key=True)
    url_sealed = models.TextField()
    secret_ref = models.CharField(max_length=200, blank=True)
    secret_sealed = models.TextField(blank=True)
    secret_created_at = models.DateTimeField(null=True, blank=True)
    previous_secret_sealed = models.TextField(blank=True)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    delivered_through = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"webhook of {self.tenant_id}"


class WebhookDelivery(models.Model):
    """One outbox event to one tenant's webhook, retried with backoff until a 2xx."""

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    message = models.ForeignKey(OutboxMessage, on_delete=models.CASCADE, related_name="+")
    next_attempt_at = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    # The exact bytes every attempt sends, made from the event as it was written.
    body = models.TextField(blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "message"], name="webhook_one_delivery")
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(delivered_at__isnull=True),
                name="webhook_due_idx",
            )
        ]

    def __str__(self) -> str:
        return f"delivery of #{self.message_id} ({self.attempts} attempts)"


class WorkerHeartbeat(models.Model):
    """One worker process and its last beat (``runtime.heartbeats``): written every second
    on the database's clock by the process's heartbeat thread, read to tell live workers
    from dead ones (the rescue, the health page)."""

    worker_id = models.CharField(max_length=200, primary_key=True)  # its lease owner name
    hostname = models.CharField(max_length=200, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(db_index=True)  # the database's time of its last beat
    # Its clock minus the database's, in seconds, as its last beat measured it.
    clock_offset_seconds = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-last_seen_at"]

    def __str__(self) -> str:
        return self.worker_id


class CompactionReason(models.TextChoices):
    INTERMEDIATE = "intermediate"  # the run's intermediate checkpoints passed their period
    EXPIRY = "expiry"  # the whole run expired


class CompactionRecord(models.Model):
    """Checkpoints one retention batch removed from one run, with their hashes.

    ``removed`` lists ``{"sequence", "sha256", "parent_sha256", "state", "step",
    "created_at"}`` for each removed checkpoint, so ``run_verify`` can still link the kept
    checkpoints on either side of the gap.

    Retention writes these rows; the store owns them because ``run_verify`` reads them. The
    table is retention's original (``db_table``). ``policy_id`` names the retention policy
    that removed the checkpoints: the database still holds it as a foreign key to
    retention's policy table, but the model keeps it a plain column so the store does not
    depend on retention; ``retention_policy_delete`` clears it before a policy goes.
    ``policy_label`` survives the policy.
    """

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="compactions")
    policy_id = models.BigIntegerField(null=True, db_index=True)
    policy_label = models.CharField(max_length=200)
    reason = models.CharField(max_length=16, choices=CompactionReason.choices)
    first_sequence = models.PositiveBigIntegerField()
    last_sequence = models.PositiveBigIntegerField()
    removed = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "retention_compactionrecord"
        ordering = ["run", "first_sequence"]
        indexes = [
            models.Index(fields=["run", "first_sequence"], name="retention_c_run_id_ed3887_idx")
        ]

    def __str__(self) -> str:
        return f"compaction of {self.run_id} {self.first_sequence}-{self.last_sequence}"


class ArtifactReference(models.Model):
    """Checkpoint → artifact, written in the commit transaction (``references_record``).

    Envelopes are encrypted: without this index, knowing whether an artifact is still
    referenced would mean decrypting every envelope of the tenant. ``artifact`` is PROTECT
    with a real foreign key, so the database itself refuses to delete an artifact that a
    checkpoint still names. The table is retention's original (``db_table``).
    """

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE, related_name="+")
    artifact = models.ForeignKey(Artifact, on_delete=models.PROTECT, related_name="+")

    class Meta:
        db_table = "retention_artifactreference"
        constraints = [
            models.UniqueConstraint(
                fields=["checkpoint", "artifact"], name="artifact_reference_once"
            )
        ]
        indexes = [models.Index(fields=["artifact"], name="retention_a_artifac_4e0186_idx")]

    def __str__(self) -> str:
        return f"{self.checkpoint_id} → {self.artifact_id}"
