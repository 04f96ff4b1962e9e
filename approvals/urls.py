from django.urls import path

from approvals import views

app_name = "approvals"

urlpatterns = [
    path("", views.inbox, name="inbox"),
    path("mine/", views.mine, name="mine"),
    path("notifications/", views.notifications, name="notifications"),
    path("delegations/", views.delegations, name="delegations"),
    path("delegations/<uuid:delegation_id>/end", views.delegation_end, name="delegation_end"),
    path("<uuid:approval_id>/", views.review, name="review"),
    path("<uuid:approval_id>/decision", views.decide, name="decide"),
    path("<uuid:approval_id>/status", views.status, name="status"),
    path("<uuid:approval_id>/sources/<uuid:artifact_id>/", views.source, name="source"),
]
