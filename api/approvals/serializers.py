"""Request parsing and response shapes of the approvals API. The services decide."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from api.serializers import StrictSerializer
from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus, DecisionKind
from approvals.services.standing import quorum_progress

SHA256_PATTERN = r"^[0-9a-f]{64}$"


class ApprovalRequestCreateSerializer(StrictSerializer):
    artifact_id = serializers.UUIDField()
    artifact_sha256 = serializers.RegexField(SHA256_PATTERN, max_length=64)
    action = serializers.CharField(max_length=100)
    expires_at = serializers.DateTimeField(required=False)
    required_approvals = serializers.IntegerField(
        min_value=1, max_value=20, required=False, default=1
    )


class DecisionInSerializer(StrictSerializer):
    decision = serializers.ChoiceField(choices=DecisionKind.values)
    # Any string: a wrong hash is answered with 409 artifact_hash_mismatch, not 400.
    artifact_sha256 = serializers.CharField(max_length=200)
    comment = serializers.CharField(max_length=4000, required=False, default="", allow_blank=True)
    edited_text = serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text="Approve with edits (decision 'approve' only): your edit of the text artifact "
        "you were shown (artifact_sha256), exactly as it is to be stored. It becomes a new "
        "artifact; the request is superseded by one bound to the edited sha256, with your "
        "approval as its first (a quorum starts again), and the run continues with the edited "
        "artifact. The response's request is the new one.",
    )


class ApprovalDecisionSerializer(serializers.ModelSerializer):
    approver = serializers.SlugRelatedField(slug_field="username", read_only=True)
    on_behalf_of = serializers.SlugRelatedField(
        slug_field="username",
        read_only=True,
        allow_null=True,
        help_text="The reviewer whose delegation this decision was made under (their vote).",
    )

    class Meta:
        model = ApprovalDecision
        fields = [
            "id",
            "approver",
            "on_behalf_of",
            "decision",
            "artifact_sha256",
            "comment",
            "created_at",
        ]


class ApprovalArtifactSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    sha256 = serializers.CharField()
    size = serializers.IntegerField()
    media_type = serializers.CharField()
    kind = serializers.CharField()


class ReviewersSerializer(serializers.Serializer):
    """Who may decide, as the approval state declared it (both null: anyone who may review
    the run)."""

    role = serializers.CharField(allow_null=True)
    group = serializers.CharField(allow_null=True)


class QuorumApprovalSerializer(serializers.Serializer):
    reviewer = serializers.CharField()
    at = serializers.DateTimeField()


class QuorumSerializer(serializers.Serializer):
    required = serializers.IntegerField()
    approved = serializers.IntegerField()
    approvals = QuorumApprovalSerializer(many=True)
    progress = serializers.CharField(help_text='e.g. "1 of 2; rita approved at …"')


class EditedFromSerializer(serializers.Serializer):
    """Approve with edits: the artifact the reviewer was shown and edited, and who."""

    artifact_id = serializers.UUIDField()
    artifact_sha256 = serializers.CharField()
    edited_by = serializers.CharField(allow_null=True)


class ApprovalRequestSerializer(serializers.ModelSerializer):
    run_id = serializers.UUIDField(read_only=True)
    artifact_id = serializers.UUIDField(read_only=True)
    artifact = ApprovalArtifactSerializer(read_only=True)
    requester = serializers.CharField(source="requester_label", read_only=True)
    status = serializers.ChoiceField(choices=ApprovalStatus.values, read_only=True)
    decisions = ApprovalDecisionSerializer(many=True, read_only=True)
    previous_request_id = serializers.UUIDField(
        source="previous_id", read_only=True, allow_null=True
    )
    reviewers = serializers.SerializerMethodField()
    quorum = serializers.SerializerMethodField()

    @extend_schema_field(ReviewersSerializer)
    def get_reviewers(self, row: ApprovalRequest) -> dict:
        return {"role": row.reviewer_role or None, "group": row.reviewer_group or None}

    edited_from = serializers.SerializerMethodField(
        help_text="Set when this request is bound to a reviewer's edit (approve with edits) "
        "of the artifact named here; the artifact fields above are the edited one's."
    )

    @extend_schema_field(EditedFromSerializer(allow_null=True))
    def get_edited_from(self, row: ApprovalRequest) -> dict | None:
        if not row.edited_from_sha256:
            return None
        return {
            "artifact_id": str(row.edited_from_id),
            "artifact_sha256": row.edited_from_sha256,
            "edited_by": row.edited_by.get_username() if row.edited_by_id else None,
        }

    @extend_schema_field(QuorumSerializer)
    def get_quorum(self, row: ApprovalRequest) -> dict:
        progress = quorum_progress(row)
        return {
            "required": progress.required,
            "approved": progress.approved,
            "approvals": [{"reviewer": name, "at": at} for name, at in progress.approvals],
            "progress": str(progress),
        }

    class Meta:
        model = ApprovalRequest
        fields = [
            "id",
            "run_id",
            "run_version",
            "checkpoint_sequence",
            "checkpoint_sha256",
            "artifact_id",
            "artifact_sha256",
            "artifact",
            "action",
            "requester",
            "required_approvals",
            "reviewers",
            "quorum",
            "escalation_level",
            "status",
            "status_reason",
            "expires_at",
            "created_at",
            "decided_at",
            "consumed_at",
            "previous_request_id",
            "edited_from",
            "decisions",
        ]


class DecisionResultSerializer(serializers.Serializer):
    decision = ApprovalDecisionSerializer()
    request = ApprovalRequestSerializer()


class EvidencePublicKeySerializer(serializers.Serializer):
    algorithm = serializers.ChoiceField(choices=["Ed25519"])
    key_id = serializers.CharField()
    public_key_pem = serializers.CharField()
    public_key_hex = serializers.CharField()


class NotificationPreferencesInSerializer(StrictSerializer):
    email = serializers.BooleanField(required=False)
    chat = serializers.BooleanField(required=False)
    chat_url = serializers.CharField(
        max_length=500,
        required=False,
        allow_blank=True,
        help_text="A Slack-compatible incoming-webhook URL; empty forgets it.",
    )


class NotificationPreferencesSerializer(serializers.Serializer):
    email = serializers.BooleanField()
    chat = serializers.BooleanField()
    chat_url = serializers.CharField(
        source="chat_url_shown",
        allow_null=True,
        help_text="The URL's origin only (the rest is its secret); null when none is set.",
    )
    email_address = serializers.CharField(help_text="Where email goes: your account's address.")

    def to_representation(self, instance: object) -> dict:
        data = super().to_representation(instance)
        data["chat_url"] = data["chat_url"] or None
        return data


class DelegationInSerializer(StrictSerializer):
    delegate = serializers.CharField(max_length=150, help_text="A reviewer's username.")
    ends_at = serializers.DateTimeField()
    starts_at = serializers.DateTimeField(required=False)
    reason = serializers.CharField(max_length=4000, required=False, allow_blank=True, default="")


class DelegationSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    delegator = serializers.CharField(source="delegator.username")
    delegate = serializers.CharField(source="delegate.username")
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()
    reason = serializers.CharField()
    revoked_at = serializers.DateTimeField(allow_null=True)
