from django.urls import path

from api import actions, views
from api import bulk as bulk_api
from api import operations as operations_api
from api import reviewer_groups as groups_api
from api import runner as runner_api
from api.schema import SchemaView

urlpatterns = [
    path(
        "schema",
        SchemaView.as_view(),
        name="schema",
    ),
    path("workflows", views.WorkflowListView.as_view(), name="workflows"),
    path(
        "workflows/<str:workflow_type>/versions/<str:version>",
        views.WorkflowVersionView.as_view(),
        name="workflow-version",
    ),
    path("reviewer-groups", groups_api.ReviewerGroupListView.as_view(), name="reviewer-groups"),
    path(
        "reviewer-groups/<str:name>",
        groups_api.ReviewerGroupView.as_view(),
        name="reviewer-group",
    ),
    path(
        "reviewer-groups/<str:name>/members",
        groups_api.ReviewerGroupMembersView.as_view(),
        name="reviewer-group-members",
    ),
    path(
        "reviewer-groups/<str:name>/members/<str:username>",
        groups_api.ReviewerGroupMemberView.as_view(),
        name="reviewer-group-member",
    ),
    path("runs", views.RunListView.as_view(), name="runs"),
    path("runs/<uuid:run_id>", views.RunDetailView.as_view(), name="run"),
    path("runs/<uuid:run_id>/checkpoints", views.CheckpointListView.as_view(), name="checkpoints"),
    path(
        "runs/<uuid:run_id>/checkpoints/<int:sequence>",
        views.CheckpointDetailView.as_view(),
        name="checkpoint",
    ),
    path("runs/<uuid:run_id>/next", runner_api.RunNextView.as_view(), name="run-next"),
    path("webhook", runner_api.WebhookView.as_view(), name="webhook"),
    path("webhook/secret", runner_api.WebhookSecretView.as_view(), name="webhook-secret"),
    path("runs/<uuid:run_id>/verify", views.RunVerifyView.as_view(), name="run-verify"),
    path("runs/<uuid:run_id>/lease", views.LeaseView.as_view(), name="run-lease"),
    path(
        "runs/<uuid:run_id>/operations",
        operations_api.OperationListView.as_view(),
        name="run-operations",
    ),
    path(
        "runs/<uuid:run_id>/operations/<str:key>",
        operations_api.OperationDetailView.as_view(),
        name="run-operation",
    ),
    path(
        "runs/<uuid:run_id>/operations/<str:key>/confirm",
        operations_api.OperationConfirmView.as_view(),
        name="run-operation-confirm",
    ),
    path(
        "runs/<uuid:run_id>/operations/<str:key>/fail",
        operations_api.OperationFailView.as_view(),
        name="run-operation-fail",
    ),
    path(
        "runs/<uuid:run_id>/operations/<str:key>/unknown",
        operations_api.OperationUnknownView.as_view(),
        name="run-operation-unknown",
    ),
    path(
        "runs/<uuid:run_id>/operations/<str:key>/job",
        operations_api.OperationJobView.as_view(),
        name="run-operation-job",
    ),
    path("runs/<uuid:run_id>/actions/resume", actions.ResumeView.as_view(), name="run-resume"),
    path("runs/<uuid:run_id>/actions/cancel", actions.CancelView.as_view(), name="run-cancel"),
    path("runs/<uuid:run_id>/actions/pause", actions.PauseView.as_view(), name="run-pause"),
    path(
        "runs/<uuid:run_id>/actions/unpause",
        actions.UnpauseView.as_view(),
        name="run-unpause",
    ),
    path("runs/<uuid:run_id>/actions/retry", actions.RetryView.as_view(), name="run-retry"),
    path("runs/<uuid:run_id>/actions/fork", actions.ForkView.as_view(), name="run-fork"),
    path(
        "runs/<uuid:run_id>/actions/fork/preview",
        actions.ForkPreviewView.as_view(),
        name="run-fork-preview",
    ),
    path(
        "runs/<uuid:run_id>/actions/grant_budget",
        actions.GrantBudgetView.as_view(),
        name="run-grant-budget",
    ),
    path("bulk-actions", bulk_api.BulkActionListView.as_view(), name="bulk-actions"),
    path(
        "bulk-actions/<uuid:bulk_action_id>",
        bulk_api.BulkActionDetailView.as_view(),
        name="bulk-action",
    ),
    path(
        "bulk-actions/<uuid:bulk_action_id>/refusals",
        bulk_api.BulkActionRefusalsView.as_view(),
        name="bulk-action-refusals",
    ),
    path("artifacts", views.ArtifactCreateView.as_view(), name="artifacts"),
    path("artifacts/<uuid:artifact_id>", views.ArtifactDetailView.as_view(), name="artifact"),
    path(
        "artifacts/<uuid:artifact_id>/content",
        views.ArtifactContentView.as_view(),
        name="artifact-content",
    ),
]
