from django.urls import path

from tenants.views import audit, auth, groups, invitations, members

app_name = "tenants"

urlpatterns = [
    path("members/", members.members, name="members"),
    path("members/invite", members.invite, name="invite"),
    path("members/<int:user_id>/role", members.set_role, name="set_role"),
    path("members/<int:user_id>/remove", members.remove, name="remove"),
    path("members/<int:user_id>/link", members.password_link, name="password_link"),
    path("members/<int:user_id>/tokens", members.issue_token, name="issue_token"),
    path("members/tokens/<uuid:token_id>/revoke", members.revoke_token, name="revoke_token"),
    path("members/grants", members.grant, name="grant"),
    path("members/grants/<uuid:grant_id>/revoke", members.revoke_grant, name="revoke_grant"),
    path("members/groups/", groups.groups, name="reviewer_groups"),
    path("members/groups/create", groups.create, name="reviewer_group_create"),
    path("members/groups/<str:name>/delete", groups.delete, name="reviewer_group_delete"),
    path("members/groups/<str:name>/members", groups.add_member, name="reviewer_group_add"),
    path(
        "members/groups/<str:name>/members/<str:username>/remove",
        groups.remove_member,
        name="reviewer_group_remove",
    ),
    path("audit/", audit.audit_log, name="audit"),
    path("audit/export.csv", audit.audit_export, {"export_format": "csv"}, name="audit_csv"),
    path("audit/export.jsonl", audit.audit_export, {"export_format": "jsonl"}, name="audit_jsonl"),
    # The invited person's answer (a one-time link), and each member's own API tokens.
    path(
        "invitations/<uuid:invitation_id>/<str:token>/",
        invitations.invitation,
        name="invitation",
    ),
    path("account/tokens/", invitations.my_tokens, name="my_tokens"),
    path("set-password/done/", auth.SetPasswordDoneView.as_view(), name="set_password_done"),
    path("set-password/<uidb64>/<token>/", auth.SetPasswordView.as_view(), name="set_password"),
]
