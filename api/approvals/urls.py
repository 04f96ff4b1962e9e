from django.urls import path

from api.approvals import views

app_name = "approvals_api"

urlpatterns = [
    path("runs/<uuid:run_id>/approvals", views.RunApprovalsView.as_view(), name="run-approvals"),
    path("runs/<uuid:run_id>/evidence", views.RunEvidenceView.as_view(), name="run-evidence"),
    path("evidence/public-key", views.EvidencePublicKeyView.as_view(), name="evidence-public-key"),
    path(
        "account/notifications",
        views.NotificationPreferencesView.as_view(),
        name="notification-preferences",
    ),
    path("account/delegations", views.DelegationListView.as_view(), name="delegations"),
    path(
        "account/delegations/<uuid:delegation_id>",
        views.DelegationView.as_view(),
        name="delegation",
    ),
    path("approvals", views.ApprovalListView.as_view(), name="approvals"),
    path("approvals/<uuid:approval_id>", views.ApprovalDetailView.as_view(), name="approval"),
    path(
        "approvals/<uuid:approval_id>/decision",
        views.ApprovalDecisionView.as_view(),
        name="approval-decision",
    ),
    path(
        "approvals/<uuid:approval_id>/artifact",
        views.ApprovalArtifactView.as_view(),
        name="approval-artifact",
    ),
]
