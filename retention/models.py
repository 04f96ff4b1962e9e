"""Retention policies and the artifact files waiting for deletion.

What compaction removed (``CompactionRecord``) and which artifacts each checkpoint names
(``ArtifactReference``) are facts of the store, in ``checkpoints.models``; the metrics rows
are telemetry's.
"""

from __future__ import annotations

from django.db import models

from tenants.models import Tenant


class RetentionPolicy(models.Model):
    """How long a tenant keeps history; ``workflow_type`` blank is the tenant's default.

    Every period is in days and counts from the moment a run ended (its last update) —
    except ``model_context_days``, which counts from the artifact's creation. Empty means
    keep forever.
    """

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="retention_policies")
    workflow_type = models.CharField(max_length=100, blank=True)
    intermediate_days = models.PositiveIntegerField(null=True, blank=True)
    model_context_days = models.PositiveIntegerField(null=True, blank=True)
    failed_run_days = models.PositiveIntegerField(null=True, blank=True)
    run_expiry_days = models.PositiveIntegerField(null=True, blank=True)
    updated_by = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant", "workflow_type"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "workflow_type"], name="retention_one_policy_per_scope"
            )
        ]

    def __str__(self) -> str:
        return self.label

    @property
    def label(self) -> str:
        scope = self.workflow_type or "default"
        return f"{self.tenant.slug}/{scope}"


class PendingFileDeletion(models.Model):
    """An artifact file whose row is gone; the file is removed after the commit.

    Written in the transaction that deletes the artifact row, so a job killed between the
    commit and the file deletion leaves a row the next run finishes, never a lost file name.
    """

    id = models.BigAutoField(primary_key=True)
    storage_name = models.CharField(max_length=300)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.storage_name
