from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("api/v1/", include(("checkpoints.api.urls", "api"), namespace="api")),
    path("api/v1/", include("approvals.api.urls", namespace="approvals_api")),
    path("approvals/", include("approvals.urls", namespace="approvals")),
    path("admin/", admin.site.urls),
    path("", include(("console.urls", "console"), namespace="console")),
]
