"""LangGraph threads stored in Cairn.

A thread is recorded by one or more Cairn runs (``LangGraphBranch``): the run opened with the
thread, plus a forked run each time LangGraph branches (a put whose parent is not the latest
checkpoint of its run, e.g. ``update_state`` on an older checkpoint). Every put is also a
Cairn checkpoint of its run; the LangGraph rows below hold what Cairn's envelopes only
reference by sha256: the serialized checkpoint, its metadata, channel values and pending
writes, each sealed with AES-GCM bound to tenant, table, row and its LangGraph key.

Plaintext columns are the keys LangGraph looks rows up by (thread, namespace, ids, channel,
version, task) and three metadata fields that ``list(filter=...)`` narrows on in SQL
(source, step, run_id). Nothing else is readable without the key.
"""

from __future__ import annotations

import uuid

from django.db import models

from checkpoints.models import Checkpoint, Run
from tenants.models import Tenant

ID_LENGTH = 255
NS_LENGTH = 1000


class LangGraphThread(models.Model):
    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    thread_id = models.CharField(max_length=ID_LENGTH)
    # The run opened with the thread. Deleting it (retention expiry) forgets the thread.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "thread_id"], name="langgraph_thread_unique")
        ]

    def __str__(self) -> str:
        return f"langgraph thread {self.thread_id}"


class LangGraphBranch(models.Model):
    """One Cairn run that records part of a thread: its first run, or a fork."""

    run = models.OneToOneField(
        Run, on_delete=models.CASCADE, primary_key=True, related_name="langgraph_branch"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    thread = models.ForeignKey(LangGraphThread, on_delete=models.CASCADE, related_name="branches")
    # The LangGraph checkpoint the fork continues from ("" for the thread's first run).
    forked_from_checkpoint_id = models.CharField(max_length=ID_LENGTH, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"branch {self.run_id} of {self.thread_id}"


class LangGraphCheckpoint(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    thread = models.ForeignKey(
        LangGraphThread, on_delete=models.CASCADE, related_name="checkpoints"
    )
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    # The Cairn checkpoint that recorded this put: retention removing it removes this too.
    cairn_checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE, related_name="+")
    checkpoint_ns = models.CharField(max_length=NS_LENGTH, blank=True)
    checkpoint_id = models.CharField(max_length=ID_LENGTH)
    parent_checkpoint_id = models.CharField(max_length=ID_LENGTH, blank=True)
    checkpoint_sealed = models.TextField()
    metadata_sealed = models.TextField()
    # Copies of metadata fields for SQL narrowing; null when the value is not of the indexed
    # type, so such rows are always checked in Python instead of being missed.
    source = models.CharField(max_length=100, null=True, blank=True)
    step = models.BigIntegerField(null=True, blank=True)
    lg_run_id = models.CharField(max_length=ID_LENGTH, null=True, blank=True)
    # [[channel, version key], ...] of channel_versions: which blobs the checkpoint needs.
    channel_refs = models.JSONField(default=list)
    # DeltaChannel names (metadata counters_since_delta_snapshot): pruning keeps the
    # ancestors these channels are rebuilt from.
    delta_channels = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["thread", "checkpoint_ns", "checkpoint_id"],
                name="langgraph_checkpoint_unique",
            )
        ]
        indexes = [
            models.Index(fields=["tenant", "lg_run_id"], name="langgraph_ckpt_run_idx"),
            models.Index(
                fields=["run", "checkpoint_ns", "checkpoint_id"], name="langgraph_ckpt_branch_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"langgraph checkpoint {self.checkpoint_ns}/{self.checkpoint_id}"


class LangGraphBlob(models.Model):
    """One channel's value at one version (shared by every checkpoint at that version)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    thread = models.ForeignKey(LangGraphThread, on_delete=models.CASCADE, related_name="blobs")
    checkpoint_ns = models.CharField(max_length=NS_LENGTH, blank=True)
    channel = models.CharField(max_length=ID_LENGTH)
    version = models.CharField(max_length=ID_LENGTH)
    # LangGraph's "empty" marker: the channel had no value at this version.
    empty = models.BooleanField(default=False)
    value_sealed = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["thread", "checkpoint_ns", "channel", "version"],
                name="langgraph_blob_unique",
            )
        ]

    def __str__(self) -> str:
        return f"{self.channel}@{self.version}"


class LangGraphWrite(models.Model):
    """A pending write of a task against one checkpoint (``put_writes``)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    thread = models.ForeignKey(LangGraphThread, on_delete=models.CASCADE, related_name="writes")
    # Set once the checkpoint row exists (writes may arrive first), so deleting the
    # checkpoint, by retention too, removes its writes.
    checkpoint_row = models.ForeignKey(
        LangGraphCheckpoint,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="writes",
    )
    checkpoint_ns = models.CharField(max_length=NS_LENGTH, blank=True)
    checkpoint_id = models.CharField(max_length=ID_LENGTH)
    task_id = models.CharField(max_length=ID_LENGTH)
    task_path = models.TextField(blank=True)
    idx = models.IntegerField()
    channel = models.CharField(max_length=ID_LENGTH)
    value_sealed = models.TextField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["thread", "checkpoint_ns", "checkpoint_id", "task_id", "idx"],
                name="langgraph_write_unique",
            )
        ]

    def __str__(self) -> str:
        return f"write {self.task_id}#{self.idx} {self.channel}"
