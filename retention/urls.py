"""Included by console/urls.py without a namespace of its own, so the names are
``console:retention`` and friends."""

from django.urls import path

from retention import views

urlpatterns = [
    path("", views.retention_page, name="retention"),
    path("preview/", views.retention_preview_partial, name="retention_preview"),
    path("remove/", views.retention_policy_remove, name="retention_remove"),
    path("hold/", views.retention_hold, name="retention_hold"),
]
