from django.contrib.auth import views as auth_views
from django.urls import include, path

from console import actions
from console.views import bulk, checkpoints, health, home, run_detail, run_start, runs
from tenants.views.auth import SignInView

app_name = "console"

urlpatterns = [
    path("", home.home, name="home"),
    # Throttled after repeated failures (tenants.throttle).
    path("login/", SignInView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("tenant/", home.tenant_switch, name="tenant_switch"),
    path("runs/", runs.runs, name="runs"),
    path("runs/rows/", runs.run_rows, name="run_rows"),
    path("runs/counts/", runs.run_counts, name="run_counts"),
    path("runs/new/", run_start.run_start, name="run_start"),
    path("runs/bulk/", bulk.bulk_new, name="bulk_new"),
    path("runs/bulk/history/", bulk.bulk_history, name="bulk_history"),
    path("runs/bulk/<uuid:bulk_action_id>/", bulk.bulk_detail, name="bulk_detail"),
    path("runs/bulk/<uuid:bulk_action_id>/progress/", bulk.bulk_progress, name="bulk_progress"),
    path("runs/<uuid:run_id>/", run_detail.run_detail, name="run_detail"),
    path("runs/<uuid:run_id>/snapshot/", run_detail.run_snapshot, name="run_snapshot"),
    path("runs/<uuid:run_id>/actions/<str:action>/", actions.run_action, name="run_action"),
    path(
        "runs/<uuid:run_id>/operations/<str:key>/outcome/",
        actions.operation_outcome,
        name="operation_outcome",
    ),
    path(
        "runs/<uuid:run_id>/operations/<uuid:operation_id>/",
        run_detail.operation_view,
        name="operation_view",
    ),
    path(
        "runs/<uuid:run_id>/artifacts/<uuid:artifact_id>/",
        run_detail.artifact_view,
        name="artifact_view",
    ),
    path("runs/<uuid:run_id>/evidence/", run_detail.evidence_download, name="evidence_download"),
    path(
        "runs/<uuid:run_id>/checkpoints/<int:sequence>/",
        checkpoints.checkpoint_detail,
        name="checkpoint_detail",
    ),
    path("health/", health.health, name="health"),
    path("retention/", include("retention.urls")),
]
