"""The reviewer's decision form: the sha256 it displayed travels with the decision."""

from __future__ import annotations

from django import forms

from approvals.models import DecisionKind


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=DecisionKind.choices)
    artifact_sha256 = forms.CharField(max_length=200, widget=forms.HiddenInput)
    comment = forms.CharField(
        required=False,
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 3}),
        label="Comment (required to reject)",
        help_text="Shown to the run's operators. A rejection needs one: it becomes the run's "
        "reason.",
    )
