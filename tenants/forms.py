"""Forms of the members, grants and audit pages."""

from __future__ import annotations

from django import forms
from django.contrib.auth.validators import UnicodeUsernameValidator

from cairn.ids import RUN_ID_PREFIX_MIN, run_id_prefix_bounds
from tenants import roles

ROLE_LABELS = {"reviewer": "Reviewer", "operator": "Operator", "admin": "Admin"}
ONE_RUN = "one_run"


class InviteForm(forms.Form):
    """On the members page next to GrantForm: its own ids (``invite_…``), the same names."""

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

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("auto_id", "invite_%s")
        super().__init__(*args, **kwargs)

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
    """On the members page next to InviteForm: its own ids (``grant_…``), the same names."""

    username = forms.CharField(max_length=150)
    run = forms.UUIDField(label="Run id", widget=forms.TextInput(attrs={"class": "mono"}))

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("auto_id", "grant_%s")
        super().__init__(*args, **kwargs)


class DateTimeInput(forms.DateTimeInput):
    input_type = "datetime-local"

    def __init__(self) -> None:
        super().__init__(format="%Y-%m-%dT%H:%M")


class AuditFilterForm(forms.Form):
    """The audit page's filters; they travel in the query string (and into the exports)."""

    action = forms.ChoiceField(required=False, choices=[])
    actor = forms.CharField(required=False, max_length=200, help_text="username or worker")
    run = forms.CharField(
        label="Run id",
        required=False,
        max_length=36,
        help_text="the full id or its first characters",
        widget=forms.TextInput(attrs={"class": "mono"}),
    )
    since = forms.DateTimeField(label="From (UTC)", required=False, widget=DateTimeInput())
    until = forms.DateTimeField(label="Until (UTC)", required=False, widget=DateTimeInput())

    def __init__(self, *args: object, actions: list[str], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.fields["action"].choices = [("", "Any action"), *[(a, a) for a in actions]]

    def clean_run(self) -> str:
        """A full run id or a hex prefix of one, as the table shows it."""
        text = self.cleaned_data["run"].strip().lower()
        if text and run_id_prefix_bounds(text) is None:
            raise forms.ValidationError(
                f"Enter a run id, or at least its first {RUN_ID_PREFIX_MIN} characters (0-9, a-f)."
            )
        return text
