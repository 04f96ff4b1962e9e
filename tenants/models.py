"""Tenants, roles (guardian object permissions on the tenant), API tokens and the audit log."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from guardian.models import GroupObjectPermissionBase, UserObjectPermissionBase


class Tenant(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    legal_hold = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]
        # The three roles are these object permissions on the tenant (see tenants.roles).
        permissions = [
            ("review_tenant", "Review approval requests of the tenant"),
            ("operate_tenant", "Browse and operate the tenant's runs"),
            ("admin_tenant", "Administer the tenant's members, tokens and retention"),
        ]

    def __str__(self) -> str:
        return self.slug


class TenantUserObjectPermission(UserObjectPermissionBase):
    """Direct foreign-key permission rows: a role check is one indexed lookup."""

    content_object = models.ForeignKey(Tenant, on_delete=models.CASCADE)


class TenantGroupObjectPermission(GroupObjectPermissionBase):
    content_object = models.ForeignKey(Tenant, on_delete=models.CASCADE)


class ApiToken(models.Model):
    """A bearer token of one user in one tenant. Only its sha256 is stored."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="tokens")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=12, db_index=True)
    key_sha256 = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class AuditEvent(models.Model):
    """Append-only record of who did or read what. Never updated."""

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="audit_events")
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    actor_label = models.CharField(max_length=200, blank=True)  # e.g. a worker's id
    action = models.CharField(max_length=64)
    run_id = models.UUIDField(null=True, blank=True)
    target = models.CharField(max_length=200, blank=True)
    reason = models.TextField(blank=True)
    ip = models.GenericIPAddressField(null=True, blank=True)
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["tenant", "run_id", "id"]),
            models.Index(fields=["tenant", "action", "id"]),
        ]

    def __str__(self) -> str:
        return f"{self.action} by {self.actor_label or self.actor_id}"


class RunGrant(models.Model):
    """Lets one user review one run's approvals (and the artifacts under review) without
    seeing the tenant's other runs. Revoking deletes the row (the audit log keeps it)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="run_grants")
    run = models.ForeignKey("checkpoints.Run", on_delete=models.CASCADE, related_name="grants")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="run_grants"
    )
    granted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["run", "user"], name="run_grant_one_per_run_user")
        ]
        indexes = [models.Index(fields=["tenant", "user"])]

    def __str__(self) -> str:
        return f"{self.user_id} may review run {self.run_id}"


class LoginThrottle(models.Model):
    """Failed sign-ins per key (a hash of username and address, or of the address alone)
    in the current window. In the database so every web process shares the count."""

    key = models.CharField(max_length=64, primary_key=True)
    failures = models.PositiveIntegerField(default=0)
    window_started_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"{self.key[:12]}… {self.failures}"


class MemberInvitation(models.Model):
    """An admin's invitation of a username into the tenant. Nothing is granted until the
    person answers through the one-time link: an existing account's holder signs in and
    accepts (an admin cannot enrol someone else's account), a new username chooses its
    password. Only the link's sha256 is stored."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    username = models.CharField(max_length=150)
    email = models.EmailField(blank=True)
    role = models.CharField(max_length=20, blank=True)  # "" with ``run``: one run's reviewer
    run = models.ForeignKey(
        "checkpoints.Run", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    token_sha256 = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    answered_at = models.DateTimeField(null=True, blank=True)
    accepted = models.BooleanField(null=True)  # None while open; False: declined or replaced

    class Meta:
        indexes = [models.Index(fields=["tenant", "username"])]

    def __str__(self) -> str:
        return f"{self.username} → {self.tenant_id}"


class TenantSecretReference(models.Model):
    """A secret reference (``env:NAME``, ``file:NAME``) a deployment admin registered for
    one tenant. A tenant may name only these (e.g. to sign its webhook): otherwise any
    tenant could name the deployment's own secrets, or another tenant's."""

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="secret_refs")
    reference = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant", "reference"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "reference"], name="secret_reference_once_per_tenant"
            )
        ]

    def __str__(self) -> str:
        return f"{self.reference} for {self.tenant_id}"


class ReviewerGroup(models.Model):
    """A named set of the tenant's members that an approval state may declare as its
    reviewers (``"reviewers": {"group": name}``). Per tenant: another tenant's group of the
    same name is another group. Deleting one deletes its memberships (the audit log keeps
    both)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="reviewer_groups")
    name = models.SlugField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="reviewer_group_unique_name")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.tenant_id})"


class ReviewerGroupMember(models.Model):
    id = models.BigAutoField(primary_key=True)
    group = models.ForeignKey(ReviewerGroup, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="reviewer_groups"
    )
    added_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["group", "user"], name="reviewer_group_one_membership")
        ]
        indexes = [models.Index(fields=["user", "group"])]

    def __str__(self) -> str:
        return f"{self.user_id} in {self.group_id}"
