from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("api/v1/", include(("checkpoints.api.urls", "api"), namespace="api")),
    path("admin/", admin.site.urls),
    path("", include(("console.urls", "console"), namespace="console")),
]
