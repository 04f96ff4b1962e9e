from django.urls import path
from drf_spectacular.views import SpectacularAPIView

from checkpoints.api import views

urlpatterns = [
    path(
        "schema",
        SpectacularAPIView.as_view(permission_classes=[], authentication_classes=[]),
        name="schema",
    ),
    path("workflows", views.WorkflowListView.as_view(), name="workflows"),
    path(
        "workflows/<str:workflow_type>/versions/<str:version>",
        views.WorkflowVersionView.as_view(),
        name="workflow-version",
    ),
    path("runs", views.RunListView.as_view(), name="runs"),
    path("runs/<uuid:run_id>", views.RunDetailView.as_view(), name="run"),
    path("runs/<uuid:run_id>/checkpoints", views.CheckpointListView.as_view(), name="checkpoints"),
    path(
        "runs/<uuid:run_id>/checkpoints/<int:sequence>",
        views.CheckpointDetailView.as_view(),
        name="checkpoint",
    ),
    path("runs/<uuid:run_id>/verify", views.RunVerifyView.as_view(), name="run-verify"),
    path("runs/<uuid:run_id>/lease", views.LeaseView.as_view(), name="run-lease"),
    path("artifacts", views.ArtifactCreateView.as_view(), name="artifacts"),
    path("artifacts/<uuid:artifact_id>", views.ArtifactDetailView.as_view(), name="artifact"),
    path(
        "artifacts/<uuid:artifact_id>/content",
        views.ArtifactContentView.as_view(),
        name="artifact-content",
    ),
]
