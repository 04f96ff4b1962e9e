"""Forms of the members, grants and audit pages."""

from __future__ import annotations

from django import forms
from django.contrib.auth.validators import UnicodeUsernameValidator

from tenants import roles

ROLE_LABELS = {"reviewer": "Reviewer", "operator": "Operator", "admin": "Admin"}
ONE_RUN = "one_run"


class InviteForm(forms.Form):
    username = forms.CharField(max_length=150, validators=[UnicodeUsernameValidator()])
    email = forms.EmailField(required=False)
    role = forms.ChoiceField(
        choices=[
            *[(r, ROLE_LABELS[r]) for r in roles.ROLES],
            (ONE_RUN, "Reviewer of one run only"),
        ]
    )
    run = forms.UUIDField(
        label="Run id (for a reviewer of one run)",
        required=False,
        widget=forms.TextInput(attrs={"placeholder": "full run id", "class": "mono"}),
    )

    def clean(self) -> dict:
        data = super().clean()
        if data.get("role") == ONE_RUN and not data.get("run"):
            self.add_error("run", "Name the run this reviewer may see.")
        return data


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=[(r, ROLE_LABELS[r]) for r in roles.ROLES])


class TokenForm(forms.Form):
    name = forms.CharField(label="Token label", max_length=100, required=False)


class GrantForm(forms.Form):
    username = forms.CharField(max_length=150)
    run = forms.UUIDField(label="Run id", widget=forms.TextInput(attrs={"class": "mono"}))


class DateTimeInput(forms.DateTimeInput):
    input_type = "datetime-local"

    def __init__(self) -> None:
        super().__init__(format="%Y-%m-%dT%H:%M")


class AuditFilterForm(forms.Form):
    """The audit page's filters; they travel in the query string (and into the exports)."""

    action = forms.ChoiceField(required=False, choices=[])
    actor = forms.CharField(required=False, max_length=200, help_text="username or worker")
    run = forms.UUIDField(label="Run id", required=False)
    since = forms.DateTimeField(label="From (UTC)", required=False, widget=DateTimeInput())
    until = forms.DateTimeField(label="Until (UTC)", required=False, widget=DateTimeInput())

    def __init__(self, *args: object, actions: list[str], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.fields["action"].choices = [("", "Any action"), *[(a, a) for a in actions]]
