from django.contrib import admin
from django.urls import include, path

from observability import views as metrics_views

urlpatterns = [
    path("api/v1/", include(("api.urls", "api"), namespace="api")),
    path("api/v1/", include("api.approvals.urls", namespace="approvals_api")),
    path("approvals/", include("approvals.urls", namespace="approvals")),
    path("admin/", admin.site.urls),
    path("metrics", metrics_views.metrics, name="metrics"),
    path("", include("tenants.urls", namespace="tenants")),
    path("", include(("console.urls", "console"), namespace="console")),
]

# A sentence, never a trace (HTML for the console, the API's error shape under /api/).
handler404 = "cairn.error_views.not_found"
handler500 = "cairn.error_views.server_error"
